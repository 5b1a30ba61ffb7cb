"""GAGPO's field table: every field GAGPOConfig adds to RLlib's, with its setter, default, check and doc.

``GAGPOConfig`` (``config.py``) takes its defaults, setters, setter docstrings and the check of each field on its
own from ``FIELDS``; the docs' option table (``option_table``) and the command line's choices come from it too.
A check is a kind of ``CHECKS`` ("None|kind" also admits None), "choice" of the field's choices, or "rule": the
field is checked only by the config's cross-field rules (``GAGPOConfig.validate_rules``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gagpo_rllib.method.advantages import ESTIMATORS, NORMS

__all__ = [
    "BACKENDS",
    "CHECKS",
    "DTYPES",
    "FIELD",
    "FIELDS",
    "RLLIB_SETTERS",
    "SETTERS",
    "SHARDINGS",
    "WEIGHT_TRANSPORTS",
    "Field",
    "option_table",
]

BACKENDS = ("hf", "vllm")
ROLLOUT_SCHEDULES = ("per_episode", "lockstep")
SHARDINGS = ("ddp", "fsdp")
# The names of policy.models.DTYPES (the dtype map; tests/gagpo_rllib/rllib/test_fields.py keeps them equal):
# the command line reads this table without importing torch.
DTYPES = ("float32", "bfloat16", "float16")
LORA_SYNCS = ("adapter", "merged")
# How weights reach the engines (gagpo_rllib.rllib.weight_sync): "auto" broadcasts between whole-GPU learners and
# engines, else the object store.
WEIGHT_TRANSPORTS = ("auto", "object_store", "broadcast", "ipc")


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)


# A field's check on its own: kind -> (test, what the value must be). A "None|" prefix also admits None.
CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int>=0": (lambda v: _int(v) and v >= 0, "an int >= 0"),
    "int>=1": (lambda v: _int(v) and v >= 1, "an int >= 1"),
    "num": (_num, "a finite number"),
    "num>0": (lambda v: _num(v) and v > 0, "a number > 0"),
    "num>=0": (lambda v: _num(v) and v >= 0, "a number >= 0"),
    "num>=1": (lambda v: _num(v) and v >= 1, "a number >= 1"),
    "num[0,1]": (lambda v: _num(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "num(0,1)": (lambda v: _num(v) and 0 < v < 1, "a number in (0, 1)"),
    "num[0,1)": (lambda v: _num(v) and 0 <= v < 1, "a number in [0, 1)"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "dict": (lambda v: isinstance(v, dict), "a dict"),
    "any": (lambda v: True, "anything"),
}


@dataclass(frozen=True)
class Field:
    """One GAGPO field: ``check`` is a kind of ``CHECKS`` ("None|kind" admits None), or "choice" of ``choices``,
    or "rule" (checked in ``validate_rules`` only); ``expected`` overrides the check's wording."""

    name: str
    setter: str
    default: Any
    check: str
    doc: str
    choices: tuple = ()
    expected: str | None = None

    def problem(self, value: Any) -> str | None:
        """What ``value`` must be, when it is not; None when it passes."""
        if self.check == "rule":
            return None
        if self.check == "choice":
            return None if value in self.choices else self.expected or f"one of {self.choices}"
        optional, kind = self.check.startswith("None|"), self.check.removeprefix("None|")
        test, wording = CHECKS[kind]
        if (optional and value is None) or (value is not None and test(value)):
            return None
        return self.expected or (f"None or {wording}" if optional else wording)


def _fields(setter: str, *rows: tuple) -> tuple[Field, ...]:
    """Fields of one setter from rows (name, default, check, doc[, choices[, expected]])."""
    return tuple(
        Field(r[0], setter, r[1], r[2], r[3], tuple(r[4]) if len(r) > 4 else (), *r[5:]) for r in rows
    )


# fmt: off
FIELDS: tuple[Field, ...] = (
    *_fields(
        "gagpo",  # the method
        ("estimator", "gagpo", "choice", "the advantage estimator ('ppo' trains a critic)", ESTIMATORS),
        ("group_size", 8, "int>=1", "K, rollouts per task instance"),
        ("groups_per_iteration", 16, "int>=1", "N, task instances per iteration"),
        ("gamma", 0.95, "num[0,1]", "discount over env steps"),
        ("lam", 0.95, "num[0,1]", "GAE lambda over env steps"),
        ("norm", "mean_std", "choice", "group normalisation of the advantages", NORMS),
        ("omega", 1.0, "num", "GiGPO's weight of the step-level term"),
        ("invalid_penalty", 0.1, "num>=0", "subtracted from an invalid step's reward, for learning only"),
        ("skip_uniform_groups", False, "bool", "drop groups whose episodes all got the same return"),
        ("dynamic_sampling", False, "bool", "replace uniform groups by new ones (DAPO's filter groups)"),
        ("dynamic_sampling_max_extra_groups", None, "None|int>=0", "extra groups per iteration at most; None: N"),
        ("state_key", "env", "rule", "same state: 'env', 'normalized', 'history' or 'package.module:function'"),
        ("state_key_history", None, "None|int>=0", "H of the 'history' key; None: history_length"),
        ("similarity_threshold", None, "rule", "None (exact keys) or in (0, 1]: similar texts share a state"),
        ("max_steps", None, "None|int>=1", "the env's step limit (env_config['max_steps']); None: the env's"),
    ),
    *_fields(
        "llm",  # the model, its decoding and its prompts
        ("model_path", None, "rule", "any AutoModelForCausalLM folder or hub id (required)"),
        ("dtype", "float32", "choice", "rollout weights and learner compute (fp32 masters kept)", DTYPES),
        ("pure_low_precision", False, "bool", "also keep the learner's weights and Adam state in dtype"),
        ("gradient_checkpointing", None, "None|bool", "recompute activations in backward; None: with GPUs"),
        ("lora_rank", 0, "int>=0", "0: full fine-tuning; r: rank-r LoRA adapters on a frozen base", (),
         "an int >= 0 (0: LoRA off)"),
        ("lora_alpha", None, "None|num>0", "adapter scale lora_alpha / lora_rank; None: 2 x lora_rank", (),
         "None (2 x lora_rank) or a number > 0"),
        ("lora_dropout", 0.0, "num[0,1)", "dropout on the adapters' input (above 0 the first ratio is not 1)"),
        ("lora_target_modules", "all-linear", "rule", "'all-linear' or a list of linear module names"),
        ("lora_sync", "adapter", "choice", "what a vLLM engine receives: the adapters or merged weights", LORA_SYNCS),
        ("temperature", 1.0, "num>0", "sampling temperature of the training rollouts"),
        ("eval_temperature", 0.4, "num>0", "sampling temperature of evaluation"),
        ("max_new_tokens", 256, "int>=1", "generation limit per turn"),
        ("constrained_decoding", False, "bool", "sample only admissible actions (token trie)"),
        ("system_prompt", None, "None|str", "the system message; None: the chat template's default"),
        ("prompt_template", None, "None|str", "overrides the env package's template of later turns"),
        ("first_prompt_template", None, "None|str", "overrides the env package's first-turn template"),
        ("history_length", 2, "int>=0", "H, (observation, action) pairs shown in the prompt"),
        ("max_prompt_tokens", None, "None|int>=1", "drop the oldest history beyond this many tokens"),
    ),
    *_fields(
        "training",  # the loss and learner numerics
        ("clip_eps", 0.2, "num(0,1)", "clip range of the ratio"),
        ("kl_coeff", 0.01, "num>=0", "weight of the k3 KL to the frozen reference (0: no reference)"),
        ("entropy_coeff", 0.001, "num>=0", "entropy bonus"),
        ("vf_coeff", 0.5, "num>=0", "the PPO critic's loss weight"),
        ("vf_clip", None, "None|num>0", "the critic's value clip range; None: unclipped"),
        ("critic_lr", None, "None|num>0", "the critic's learning rate; None: lr"),
        ("critic_share_trunk", False, "bool", "value head on the policy's trunk instead of a copy"),
        ("recompute_old_logprobs", None, "None|bool", "recompute the ratio's old log-probs; None: when rollout "
         "numerics differ (vllm, dtype not float32, max_staleness >= 1)"),
        ("train_chunk_tokens", 16384, "int>=1", "tokens per length-sorted chunk of the learner"),
        ("reference_cache_rows", 100_000, "int>=0", "reference log-prob rows kept across updates"),
        ("max_staleness", 0, "int>=0", "k >= 1: play the next k iterations beside the update", (),
         "an int >= 0 (0: on-policy)"),
        ("behaviour_weight_cap", 5.0, "num>=1", "truncation of the weight min(pi_prox / pi_behav, cap)"),
    ),
    *_fields(
        "env_runners",  # the rollout engine
        ("backend", "hf", "choice", "the rollout backend", BACKENDS),
        ("backend_kwargs", {}, "dict", "keywords of the backend's constructor"),
        ("envs_per_runner", None, "None|int>=1", "sub-envs per EnvRunner; None: its share of N x K"),
        ("rollout_schedule", "per_episode", "choice", "one request per episode as its step returns, or one "
         "batched call per turn", ROLLOUT_SCHEDULES),
        ("sleep_engines_during_update", False, "bool", "vLLM engines sleep while the learner updates"),
        ("torch_threads", None, "None|int>=1", "torch threads per actor; None: its Ray CPUs"),
    ),
    *_fields(
        "learners",
        ("learner_sharding", "ddp", "choice", "whole model per learner, or FSDP2", SHARDINGS),
        ("weight_transport", "auto", "choice", "learners to engines: object store, broadcast (NCCL/gloo) or "
         "ipc (shared device memory)", WEIGHT_TRANSPORTS),
    ),
    *_fields(
        "fault_tolerance",  # grouped sampling
        ("max_group_attempts", 3, "int>=1", "rounds that replay lost members before dropping a group"),
        ("group_sampling_timeout_s", 3600.0, "None|num>0", "deadline of one iteration's sampling; None: none"),
    ),
)
# fmt: on
FIELD = {f.name: f for f in FIELDS}
SETTERS = tuple(dict.fromkeys(f.setter for f in FIELDS))
# RLlib's setters whose own keywords ``configure`` also routes.
RLLIB_SETTERS = (
    "training",
    "env_runners",
    "learners",
    "fault_tolerance",
    "debugging",
    "evaluation",
    "reporting",
)


def option_table() -> str:
    """The docs' option table (markdown): every GAGPO field with its setter, default, check and doc."""
    rows = ["| setter | field | default | must be | what it sets |", "|---|---|---|---|---|"]
    for f in FIELDS:
        must = "see below" if f.check == "rule" else Field.problem(f, object()) or ""
        rows.append(f"| `.{f.setter}()` | `{f.name}` | `{f.default!r}` | {must} | {f.doc} |")
    return "\n".join(rows)
