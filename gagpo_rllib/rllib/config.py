"""GAGPOConfig: GAGPO's typed, validated configuration, one RLlib-style setter per concern.

``.gagpo()`` takes the method, ``.llm()`` the model, its decoding and its prompts, RLlib's ``.training()`` also the
loss and learner numerics, ``.env_runners()`` also the rollout engine and ``.learners()`` also the learners'
sharding; every field is checked once, in ``validate()``. ``configure`` routes keywords to their setters.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from gagpo_rllib.method.advantages import ESTIMATORS, NORMS
from gagpo_rllib.method.similarity import check_threshold
from gagpo_rllib.policy.critic import CriticRLModule
from gagpo_rllib.policy.lora import VLLM_LORA_RANKS
from gagpo_rllib.policy.rl_module import LLMRLModule
from gagpo_rllib.rllib.connectors.critic_advantages import CriticAdvantages
from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages
from gagpo_rllib.rllib.connectors.rollout import (
    ActionParserConnector,
    PromptConnector,
    StateKeyConnector,
    resolve_state_key,
)
from gagpo_rllib.rllib.critic_learner import GAGPOCriticTorchLearner
from gagpo_rllib.rllib.engine_sleep import validate_engine_sleep
from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import validate_fault_tolerance
from gagpo_rllib.rllib.learner import GAGPOTorchLearner
from gagpo_rllib.rllib.placement import gpu_placement_problem, resource_shortfall

__all__ = ["GAGPOConfig", "Components", "configure", "setter_of"]

logger = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm")
ROLLOUT_SCHEDULES = ("per_episode", "lockstep")
SHARDINGS = ("ddp", "fsdp")
DTYPES = ("float32", "bfloat16", "float16")
LORA_SYNCS = ("adapter", "merged")

# Which setter takes which of GAGPO's fields (RLlib's own fields stay with RLlib's setters).
GAGPO_FIELDS = (
    "estimator",
    "group_size",
    "groups_per_iteration",
    "gamma",
    "lam",
    "norm",
    "omega",
    "invalid_penalty",
    "skip_uniform_groups",
    "dynamic_sampling",
    "dynamic_sampling_max_extra_groups",
    "state_key",
    "state_key_history",
    "similarity_threshold",
    "max_steps",
)
LLM_FIELDS = (
    "model_path",
    "dtype",
    "pure_low_precision",
    "gradient_checkpointing",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_sync",
    "temperature",
    "eval_temperature",
    "max_new_tokens",
    "constrained_decoding",
    "system_prompt",
    "prompt_template",
    "first_prompt_template",
    "history_length",
    "max_prompt_tokens",
)
TRAINING_FIELDS = (
    "clip_eps",
    "kl_coeff",
    "entropy_coeff",
    "vf_coeff",
    "vf_clip",
    "critic_lr",
    "critic_share_trunk",
    "recompute_old_logprobs",
    "train_chunk_tokens",
    "reference_cache_rows",
    "max_staleness",
    "behaviour_weight_cap",
)
ENV_RUNNER_FIELDS = (
    "backend",
    "backend_kwargs",
    "envs_per_runner",
    "rollout_schedule",
    "sleep_engines_during_update",
    "torch_threads",
)
LEARNER_FIELDS = ("learner_sharding",)
FAULT_TOLERANCE_FIELDS = ("max_group_attempts", "group_sampling_timeout_s")
SETTER_FIELDS: dict[str, tuple[str, ...]] = {
    "gagpo": GAGPO_FIELDS,
    "llm": LLM_FIELDS,
    "training": TRAINING_FIELDS,
    "env_runners": ENV_RUNNER_FIELDS,
    "learners": LEARNER_FIELDS,
    "fault_tolerance": FAULT_TOLERANCE_FIELDS,
}
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


@dataclass(frozen=True)
class Components:
    """What an estimator trains with: the RLModule, the Learner and the learner connector computing advantages."""

    module_class: type
    learner_class: type
    advantages_class: type
    critic: bool


POLICY_COMPONENTS = Components(LLMRLModule, GAGPOTorchLearner, GroupedAdvantages, critic=False)
# estimator "ppo": a value head (the critic) beside the policy, its learner and the GAE connector.
CRITIC_COMPONENTS = Components(CriticRLModule, GAGPOCriticTorchLearner, CriticAdvantages, critic=True)


def _set_given(config: Any, fields: tuple[str, ...], given: dict[str, Any]) -> None:
    """Set the ``fields`` a setter was given (those not left ``NotProvided``)."""
    for name in fields:
        if given[name] is not NotProvided:
            setattr(config, name, given[name])


class GAGPOConfig(AlgorithmConfig):
    """Typed, validated configuration of GAGPO.

    The invalid-action penalty (``invalid_penalty``, default 0.1) is subtracted from the reward of invalid steps in
    the reward column handed to ``compute_advantages`` only; the reported episode return and success rate use the
    environment's own rewards.

    Example::

        config = (
            GAGPOConfig()
            .environment(MazeEnv, env_config={"split": "train"})
            .llm(model_path="/models/qwen", temperature=1.0, max_new_tokens=256)
            .gagpo(estimator="gagpo", group_size=8, groups_per_iteration=16)
            .training(lr=1e-6, clip_eps=0.2, kl_coeff=0.01)
        )
        algo = config.build_algo()
    """

    def __init__(self, algo_class: type | None = None):
        if algo_class is None:
            from gagpo_rllib.rllib.algorithm import GAGPO

            algo_class = GAGPO
        super().__init__(algo_class=algo_class)
        # RLlib's; None: shuffled exactly when a critic trains (``shuffles_minibatches``).
        self.shuffle_batch_per_epoch: bool | None = None
        # The method.
        self.estimator: str = "gagpo"
        self.group_size: int = 8
        self.groups_per_iteration: int = 16
        self.gamma = 0.95
        self.lam: float = 0.95
        self.norm: str = "mean_std"
        self.omega: float = 1.0
        self.clip_eps: float = 0.2
        self.kl_coeff: float = 0.01
        self.entropy_coeff: float = 0.001
        self.invalid_penalty: float = 0.1
        self.skip_uniform_groups: bool = False
        self.dynamic_sampling: bool = False
        self.dynamic_sampling_max_extra_groups: int | None = None
        self.recompute_old_logprobs: bool | None = None
        # State groups: the state key choice and optional similarity grouping.
        self.state_key: str = "env"
        self.state_key_history: int | None = None
        self.similarity_threshold: float | None = None
        # The critic of the PPO baseline (estimator "ppo").
        self.vf_coeff: float = 0.5
        self.vf_clip: float | None = None
        self.critic_lr: float | None = None
        self.critic_share_trunk: bool = False
        # Prompts and decoding.
        self.history_length: int = 2
        self.max_prompt_tokens: int | None = None
        self.max_steps: int | None = None
        self.temperature: float = 1.0
        self.eval_temperature: float = 0.4
        self.max_new_tokens: int = 256
        self.constrained_decoding: bool = False
        self.prompt_template: str | None = None
        self.first_prompt_template: str | None = None
        self.system_prompt: str | None = None
        # torch's intra-op threads on EnvRunners and Learners; None: the CPUs Ray gave the actor.
        self.torch_threads: int | None = None
        # The policy.
        self.model_path: str | None = None
        self.backend: str = "hf"
        self.backend_kwargs: dict = {}
        self.dtype: str = "float32"
        self.pure_low_precision: bool = False
        # LoRA adapters on the learner (peft); rank 0: full fine-tuning.
        self.lora_rank: int = 0
        self.lora_alpha: float | None = None
        self.lora_dropout: float = 0.0
        self.lora_target_modules: str | list[str] = "all-linear"
        self.lora_sync: str = "adapter"
        # The learners: activation recomputation (None: on when a learner has a GPU) and DDP or FSDP.
        self.gradient_checkpointing: bool | None = None
        self.learner_sharding: str = "ddp"
        self.envs_per_runner: int | None = None
        self.rollout_schedule: str = "per_episode"
        self.sleep_engines_during_update: bool = False
        # Rollout overlapped with the update: episodes may come from weights this many updates old (0: on-policy).
        self.max_staleness: int = 0
        self.behaviour_weight_cap: float = 5.0
        # Learner forwards: tokens per length-sorted chunk, reference log-prob rows kept across updates.
        self.train_chunk_tokens: int = 16384
        self.reference_cache_rows: int = 100_000
        # Evaluation builds the policy alone: False leaves out the critic of estimator "ppo" (it only trains).
        self.build_critic: bool = True
        # Callables fn(config=...) run before the Algorithm builds its EnvRunners and Learners (``.callbacks()``).
        self.callbacks_on_setup_start: Any = None
        # Fault tolerance of grouped sampling (see gagpo_rllib.rllib.group_sampling and .fault_tolerance()).
        self.max_group_attempts: int = 3
        self.group_sampling_timeout_s: float | None = 3600.0

        # RLlib settings this algorithm relies on.
        self.env_runner_cls = GAGPOEnvRunner
        self.episodes_to_numpy = False
        self.gym_env_vectorize_mode = "sync"
        self.batch_mode = "complete_episodes"
        self.add_default_connectors_to_env_to_module_pipeline = False
        self.add_default_connectors_to_module_to_env_pipeline = False
        self.add_default_connectors_to_learner_pipeline = False
        self.num_env_runners = 0
        self.lr = 1e-6
        self.num_epochs = 1
        self.minibatch_size = None
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.log_gradients = True

    def gagpo(
        self,
        *,
        estimator: str | None = NotProvided,
        group_size: int | None = NotProvided,
        groups_per_iteration: int | None = NotProvided,
        gamma: float | None = NotProvided,
        lam: float | None = NotProvided,
        norm: str | None = NotProvided,
        omega: float | None = NotProvided,
        invalid_penalty: float | None = NotProvided,
        skip_uniform_groups: bool | None = NotProvided,
        dynamic_sampling: bool | None = NotProvided,
        dynamic_sampling_max_extra_groups: int | None = NotProvided,
        state_key: str | None = NotProvided,
        state_key_history: int | None = NotProvided,
        similarity_threshold: float | None = NotProvided,
        max_steps: int | None = NotProvided,
    ) -> GAGPOConfig:
        """Set the method's fields (only those given); ``validate()`` checks them when the algorithm is built.

        Args:
            estimator: "gagpo", "gigpo", "grpo", "rloo" or "ppo" (the advantage estimator; "ppo" trains a
                critic, see ``gagpo_rllib.policy.critic``).
            group_size: K, rollouts per task instance.
            groups_per_iteration: N, task instances per iteration.
            gamma, lam, norm, omega: advantage parameters (see ``gagpo_rllib.method.advantages``).
            invalid_penalty: subtracted from the reward of an invalid step, for learning only.
            skip_uniform_groups: drop groups whose episodes all got the same return from the update.
            dynamic_sampling: replace such uniform groups by newly drawn task instances until the batch holds
                ``groups_per_iteration`` informative groups (DAPO's "filter groups"; see
                ``gagpo_rllib.rllib.groups``). Off by default.
            dynamic_sampling_max_extra_groups: the bound on the extra groups one iteration may play; None
                (default) = ``groups_per_iteration`` (at most twice the rollouts of a plain iteration).
            state_key: which steps are the same state: "env" (the env's info["state_key"]), "normalized",
                "history" or "package.module:function" (see ``gagpo_rllib.rllib.connectors.rollout``).
            state_key_history: H of the "history" key (last H actions); None = ``history_length``.
            similarity_threshold: None (exact keys) or a number in (0, 1]: state texts of a group at least this
                similar share one anchor state (see ``gagpo_rllib.method.similarity``).
            max_steps: the env's step limit (passed as ``env_config["max_steps"]``); None keeps the env's.
        """
        _set_given(self, GAGPO_FIELDS, locals())
        return self

    def llm(
        self,
        *,
        model_path: str | None = NotProvided,
        dtype: str | None = NotProvided,
        pure_low_precision: bool | None = NotProvided,
        gradient_checkpointing: bool | None = NotProvided,
        lora_rank: int | None = NotProvided,
        lora_alpha: float | None = NotProvided,
        lora_dropout: float | None = NotProvided,
        lora_target_modules: str | list[str] | None = NotProvided,
        lora_sync: str | None = NotProvided,
        temperature: float | None = NotProvided,
        eval_temperature: float | None = NotProvided,
        max_new_tokens: int | None = NotProvided,
        constrained_decoding: bool | None = NotProvided,
        system_prompt: str | None = NotProvided,
        prompt_template: str | None = NotProvided,
        first_prompt_template: str | None = NotProvided,
        history_length: int | None = NotProvided,
        max_prompt_tokens: int | None = NotProvided,
    ) -> GAGPOConfig:
        """Set the model, its decoding and its prompts (only the fields given).

        Args:
            model_path: any AutoModelForCausalLM folder or hub id (required).
            dtype: "float32", "bfloat16" or "float16": the rollouts' weights and the learner's compute dtype. The
                learner keeps fp32 master weights and optimizer state (mixed precision) and only the frozen
                reference in ``dtype``.
            pure_low_precision: also keep the learner's weights and optimizer state in ``dtype`` (warns: an
                Adam step of ~lr 1e-6 is below bf16's resolution, most weights would not move).
            gradient_checkpointing: recompute each decoder layer's activations in backward (memory per token of
                one layer input instead of a layer's internals); None (default): on when learners have GPUs.
            lora_rank: 0 (default) trains every weight; r >= 1 trains rank-r LoRA adapters (peft) on a frozen base
                loaded in ``dtype``, which is also the reference policy (adapters disabled: no second copy).
                EnvRunners receive the merged policy; checkpoints hold the adapters and their optimizer state;
                ``rllib export`` writes the merged model (see ``gagpo_rllib.policy.lora``). Not with FSDP.
            lora_alpha: the adapters' scale is lora_alpha / lora_rank; None (default): 2 x lora_rank.
            lora_dropout: dropout on the adapters' input in the learner's forwards (default 0.0; above 0 the
                learner's log-probs no longer equal the rollout's, so the first-minibatch ratio is not 1).
            lora_target_modules: "all-linear" (default: every linear layer but the output head) or a list of the
                model's linear module names (e.g. ["q_proj", "v_proj"]).
            lora_sync: how a vLLM engine receives the policy: "adapter" (default: only the adapters, loaded in place
                as vLLM's own LoRA adapter; 25x fewer bytes and 35-55x faster than "merged" on the CPU engine, see
                ``benchmarks/bench_lora_sync.py``) or "merged" (W + scale * B @ A under the usual names). The HF
                backend always receives the merged policy.
            temperature, eval_temperature: sampling temperature for training rollouts / evaluation.
            max_new_tokens: generation limit per turn.
            constrained_decoding: sample only admissible actions (token trie); the learner uses the same masks.
            system_prompt: the system message of every prompt; None keeps the chat template's default (some
                templates inject one of their own).
            prompt_template, first_prompt_template: override the env package's templates (which have a
                tag-free variant under constrained decoding).
            history_length: H, (observation, action) pairs shown in the prompt.
            max_prompt_tokens: truncate the oldest history beyond this many prompt tokens; a vLLM engine is sized
                to it plus ``max_new_tokens``.
        """
        _set_given(self, LLM_FIELDS, locals())
        return self

    def training(
        self,
        *,
        clip_eps: float | None = NotProvided,
        kl_coeff: float | None = NotProvided,
        entropy_coeff: float | None = NotProvided,
        vf_coeff: float | None = NotProvided,
        vf_clip: float | None = NotProvided,
        critic_lr: float | None = NotProvided,
        critic_share_trunk: bool | None = NotProvided,
        recompute_old_logprobs: bool | None = NotProvided,
        train_chunk_tokens: int | None = NotProvided,
        reference_cache_rows: int | None = NotProvided,
        max_staleness: int | None = NotProvided,
        behaviour_weight_cap: float | None = NotProvided,
        **kwargs: Any,
    ) -> GAGPOConfig:
        """RLlib's training settings (lr, num_epochs, minibatch_size, grad_clip, ...) plus the loss and learner
        numerics.

        Args:
            clip_eps, kl_coeff, entropy_coeff: loss parameters (clip range, k3 KL weight, entropy bonus).
            vf_coeff, vf_clip, critic_lr: the PPO critic's loss weight (0.5), value clip range (None, the
                default: unclipped; a fixed range in return units would cap how far a value moves per update
                whatever the reward scale) and learning rate (None, the default: the policy's ``lr``).
            critic_share_trunk: put the value head on the policy's trunk instead of a copy of it (half the
                weights' memory; the value loss then also trains the policy's trunk).
            recompute_old_logprobs: recompute the ratio's old log-probs with the learner's weights before the
                update instead of using the rollout's; None (default) does so exactly when the rollout numerics
                differ from the learner's (backend "vllm", or a dtype other than float32).
            train_chunk_tokens: the learner's forwards run over length-sorted chunks of at most this many
                (padded) tokens, once per distinct (prompt, action) row (see ``gagpo_rllib.policy.logprobs``).
            reference_cache_rows: reference log-probs of this many distinct rows are kept across updates (the
                reference is frozen; see ``gagpo_rllib.policy.logprobs``); 0 recomputes them every time.
            max_staleness: 0 (default) samples each iteration with the weights of the update before it; k >= 1
                lets the runners play the next k iterations' groups while the learners update, so an update may
                train on episodes from weights up to k updates old. Then the old log-probs are recomputed (the
                proximal policy of the ratio) and each step is weighted by its behaviour importance weight
                ``min(pi_prox / pi_behav, behaviour_weight_cap)`` (the decoupled objective; see
                ``gagpo_rllib.method.loss``).
            behaviour_weight_cap: the truncation of that weight (default 5.0).
            kwargs: ``AlgorithmConfig.training``'s. ``shuffle_batch_per_epoch``: deal the batch's steps into the
                minibatches at random every epoch (seeded); None (default): exactly when a critic trains (estimator
                "ppo"), else minibatches are runs of whole groups in sampling order.
        """
        _set_given(self, TRAINING_FIELDS, locals())
        return super().training(**kwargs)

    def env_runners(
        self,
        *,
        backend: str | None = NotProvided,
        backend_kwargs: dict | None = NotProvided,
        envs_per_runner: int | None = NotProvided,
        rollout_schedule: str | None = NotProvided,
        sleep_engines_during_update: bool | None = NotProvided,
        torch_threads: int | None = NotProvided,
        **kwargs: Any,
    ) -> GAGPOConfig:
        """RLlib's EnvRunner settings plus the rollout engine.

        Args:
            backend: "hf" (CPU or GPU) or "vllm" (GPU); backend_kwargs go to its constructor.
            envs_per_runner: sub-envs per EnvRunner; None = enough for its share of N x K at once.
            rollout_schedule: "per_episode" (default): an episode asks for its next answer as soon as its own env
                step returns (a vLLM engine batches them continuously; env steps run on a thread pool) and the
                runners take whole groups from a queue as they free up; "lockstep": one batched call per turn for
                all live sub-envs, contiguous shares of the plan per runner. Both play the same episodes.
            sleep_engines_during_update: put the vLLM engines to sleep (level 1: weights to host memory, KV
                cache freed) during the learner update, so a learner fits beside them on one GPU; they wake
                before the weight sync. Needs backend "vllm" and ``backend_kwargs["enable_sleep_mode"] = True``
                (see ``gagpo_rllib.rllib.engine_sleep``).
            torch_threads: torch's intra-op threads on each EnvRunner and Learner; None (default) sets them to
                the CPUs Ray gave that actor (torch's own default, all cores, oversubscribes a shared machine).
            kwargs: ``AlgorithmConfig.env_runners``'s (num_env_runners, num_gpus_per_env_runner, ...).
        """
        _set_given(self, ENV_RUNNER_FIELDS, locals())
        return super().env_runners(**kwargs)

    def learners(self, *, learner_sharding: str | None = NotProvided, **kwargs: Any) -> GAGPOConfig:
        """RLlib's Learner settings plus how the learners hold the model.

        Args:
            learner_sharding: "ddp" (every learner holds the whole model) or "fsdp" (torch FSDP2 over the
                learners: weights, gradients, optimizer state and the reference sharded per decoder layer; see
                ``gagpo_rllib.policy.fsdp``); needs num_learners >= 2 to shard anything.
            kwargs: ``AlgorithmConfig.learners``'s (num_learners, num_gpus_per_learner, ...).
        """
        _set_given(self, LEARNER_FIELDS, locals())
        return super().learners(**kwargs)

    def callbacks(self, *args: Any, on_setup_start: Any = NotProvided, **kwargs: Any) -> GAGPOConfig:
        """RLlib's callbacks plus ``on_setup_start``.

        Args:
            on_setup_start: a callable ``fn(config=...)`` or a list of them, run in the process that builds the
                Algorithm before it builds its EnvRunners and Learners: a step that must be done before the model
                loads, e.g. preparing the model folder the config names (a cached warm start). Reading or copying
                the config runs nothing; Tune trials, ``rllib train file`` and ``rllib evaluate`` all run it.
            args, kwargs: ``AlgorithmConfig.callbacks``'s (callbacks_class, on_algorithm_init, ...).
        """
        if on_setup_start is not NotProvided:
            self.callbacks_on_setup_start = on_setup_start
        return super().callbacks(*args, **kwargs)

    def run_setup_start(self) -> None:
        """Run the ``on_setup_start`` callables (``GAGPO.setup`` calls this first)."""
        steps = self.callbacks_on_setup_start
        for step in steps if isinstance(steps, (list, tuple)) else [steps] if steps is not None else []:
            step(config=self)

    def fault_tolerance(
        self,
        *,
        max_group_attempts: int | None = NotProvided,
        group_sampling_timeout_s: float | None = NotProvided,
        **kwargs: Any,
    ) -> GAGPOConfig:
        """RLlib's fault-tolerance settings plus grouped sampling's.

        Args:
            max_group_attempts: rounds in which an iteration plays its missing group members (lost with an
                EnvRunner or ended by an env error) before dropping the incomplete groups (default 3).
            group_sampling_timeout_s: deadline of one iteration's sampling, waits for restored runners included
                (default 3600; None: no deadline).
            kwargs: ``AlgorithmConfig.fault_tolerance``'s (e.g. ``delay_between_env_runner_restarts_s``).
        """
        if max_group_attempts is not NotProvided:
            self.max_group_attempts = max_group_attempts
        if group_sampling_timeout_s is not NotProvided:
            self.group_sampling_timeout_s = group_sampling_timeout_s
        return super().fault_tolerance(**kwargs)

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        """RLlib's checks, then GAGPO's; each error names the field. Sets ``num_envs_per_env_runner``."""
        super().validate()
        self.validate_gagpo()
        validate_fault_tolerance(self)
        if self.envs_per_runner is None:
            per_runner = math.ceil(self.group_size * self.groups_per_iteration / max(1, self.num_env_runners))
            self.num_envs_per_env_runner = max(1, per_runner)
        else:
            self.num_envs_per_env_runner = self.envs_per_runner
        if self.max_steps is not None and isinstance(self.env_config, dict):
            self.env_config = {**self.env_config, "max_steps": self.max_steps}

    def validate_gagpo(self) -> None:
        """GAGPO's own checks: raise ValueError naming the field and the value."""

        def need(ok: bool, field: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"GAGPOConfig.{field} must be {expected}, got {getattr(self, field)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)

        need(self.estimator in ESTIMATORS, "estimator", f"one of {ESTIMATORS}")
        need(self.norm in NORMS, "norm", f"one of {NORMS}")
        need(
            not (self.estimator == "gigpo" and self.norm == "none"), "norm", "'mean' or 'mean_std' for gigpo"
        )
        need(is_int(self.group_size) and self.group_size >= 1, "group_size", "an int >= 1")
        need(
            is_int(self.groups_per_iteration) and self.groups_per_iteration >= 1,
            "groups_per_iteration",
            "an int >= 1",
        )
        need(is_num(self.gamma) and 0.0 <= self.gamma <= 1.0, "gamma", "a number in [0, 1]")
        need(is_num(self.lam) and 0.0 <= self.lam <= 1.0, "lam", "a number in [0, 1]")
        need(is_num(self.omega), "omega", "a finite number")
        need(is_num(self.clip_eps) and 0.0 < self.clip_eps < 1.0, "clip_eps", "a number in (0, 1)")
        need(is_num(self.kl_coeff) and self.kl_coeff >= 0.0, "kl_coeff", "a number >= 0")
        need(is_num(self.entropy_coeff) and self.entropy_coeff >= 0.0, "entropy_coeff", "a number >= 0")
        need(is_num(self.invalid_penalty) and self.invalid_penalty >= 0.0, "invalid_penalty", "a number >= 0")
        need(isinstance(self.skip_uniform_groups, bool), "skip_uniform_groups", "a bool")
        need(isinstance(self.dynamic_sampling, bool), "dynamic_sampling", "a bool")
        need(
            self.dynamic_sampling_max_extra_groups is None
            or (
                is_int(self.dynamic_sampling_max_extra_groups) and self.dynamic_sampling_max_extra_groups >= 0
            ),
            "dynamic_sampling_max_extra_groups",
            "None or an int >= 0",
        )
        need(
            self.recompute_old_logprobs is None or isinstance(self.recompute_old_logprobs, bool),
            "recompute_old_logprobs",
            "None or a bool",
        )
        need(is_int(self.history_length) and self.history_length >= 0, "history_length", "an int >= 0")
        need(
            self.system_prompt is None or isinstance(self.system_prompt, str),
            "system_prompt",
            "None or a str",
        )
        need(
            self.torch_threads is None or (is_int(self.torch_threads) and self.torch_threads >= 1),
            "torch_threads",
            "None or an int >= 1",
        )
        need(
            self.state_key_history is None
            or (is_int(self.state_key_history) and self.state_key_history >= 0),
            "state_key_history",
            "None or an int >= 0",
        )
        resolve_state_key(self.state_key, history=self.state_key_history_length)
        if self.similarity_threshold is not None:
            check_threshold(self.similarity_threshold)
        need(is_num(self.vf_coeff) and self.vf_coeff >= 0.0, "vf_coeff", "a number >= 0")
        need(self.vf_clip is None or (is_num(self.vf_clip) and self.vf_clip > 0.0), "vf_clip", "None or > 0")
        need(
            self.critic_lr is None or (is_num(self.critic_lr) and self.critic_lr > 0.0),
            "critic_lr",
            "None or > 0",
        )
        need(isinstance(self.critic_share_trunk, bool), "critic_share_trunk", "a bool")
        need(isinstance(self.build_critic, bool), "build_critic", "a bool")
        need(
            self.max_prompt_tokens is None
            or (is_int(self.max_prompt_tokens) and self.max_prompt_tokens >= 1),
            "max_prompt_tokens",
            "None or an int >= 1",
        )
        need(
            is_int(self.train_chunk_tokens) and self.train_chunk_tokens >= 1,
            "train_chunk_tokens",
            "an int >= 1",
        )
        need(
            is_int(self.reference_cache_rows) and self.reference_cache_rows >= 0,
            "reference_cache_rows",
            "an int >= 0",
        )
        need(
            self.max_steps is None or (is_int(self.max_steps) and self.max_steps >= 1),
            "max_steps",
            "None or an int >= 1",
        )
        need(is_num(self.temperature) and self.temperature > 0.0, "temperature", "a number > 0")
        need(
            is_num(self.eval_temperature) and self.eval_temperature > 0.0, "eval_temperature", "a number > 0"
        )
        need(is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", "an int >= 1")
        need(isinstance(self.constrained_decoding, bool), "constrained_decoding", "a bool")
        for field in ("prompt_template", "first_prompt_template"):
            need(
                getattr(self, field) is None or isinstance(getattr(self, field), str), field, "None or a str"
            )
        need(
            isinstance(self.model_path, str) and bool(self.model_path.strip()),
            "model_path",
            "a model folder or hub id (set it with .llm(model_path=...))",
        )
        need(self.backend in BACKENDS, "backend", f"one of {BACKENDS}")
        need(self.rollout_schedule in ROLLOUT_SCHEDULES, "rollout_schedule", f"one of {ROLLOUT_SCHEDULES}")
        need(
            is_int(self.max_staleness) and self.max_staleness >= 0,
            "max_staleness",
            "an int >= 0 (0: on-policy)",
        )
        need(
            self.max_staleness == 0 or not self.sleep_engines_during_update,
            "max_staleness",
            "0 with sleep_engines_during_update (engines that play beside the update cannot sleep through it)",
        )
        need(
            self.max_staleness == 0 or self.recompute_old_logprobs is not False,
            "recompute_old_logprobs",
            "None or True with max_staleness >= 1 (the ratio needs the proximal policy's log-probs)",
        )
        need(
            isinstance(self.behaviour_weight_cap, (int, float))
            and not isinstance(self.behaviour_weight_cap, bool)
            and self.behaviour_weight_cap >= 1,
            "behaviour_weight_cap",
            "a number >= 1",
        )
        need(isinstance(self.backend_kwargs, dict), "backend_kwargs", "a dict")
        validate_engine_sleep(self)
        if self.backend == "vllm":
            from gagpo_rllib.policy.generation.vllm import MAX_TEMPERATURE, MIN_TEMPERATURE

            # vLLM's log-probs are not the learner's (other kernels; NaN for remapped constrained answers).
            need(
                self.recompute_old_logprobs is not False,
                "recompute_old_logprobs",
                "None or True with backend 'vllm'",
            )
            for field in ("temperature", "eval_temperature"):
                need(
                    MIN_TEMPERATURE <= getattr(self, field) <= MAX_TEMPERATURE,
                    field,
                    f"in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] with backend 'vllm' (vLLM's range)",
                )
        need(self.dtype in DTYPES, "dtype", f"one of {DTYPES}")
        need(isinstance(self.pure_low_precision, bool), "pure_low_precision", "a bool")
        if self.pure_low_precision and self.dtype != "float32":
            logger.warning(
                "GAGPOConfig.pure_low_precision: the learner keeps its weights and Adam state in %s; updates "
                "smaller than its resolution (lr %g on weights ~0.02) are rounded away",
                self.dtype,
                self.lr if isinstance(self.lr, float) else float("nan"),
            )
        self.validate_lora(need, is_int, is_num)
        need(
            self.gradient_checkpointing is None or isinstance(self.gradient_checkpointing, bool),
            "gradient_checkpointing",
            "None or a bool",
        )
        need(self.learner_sharding in SHARDINGS, "learner_sharding", f"one of {SHARDINGS}")
        need(
            not (self.learner_sharding == "fsdp" and self.components.critic and self.critic_share_trunk),
            "critic_share_trunk",
            "False with learner_sharding 'fsdp' (the shared trunk's value head would read the policy's trunk"
            " outside its FSDP unit; the separate critic, the default, is sharded like the policy)",
        )
        need(
            self.envs_per_runner is None or (is_int(self.envs_per_runner) and self.envs_per_runner >= 1),
            "envs_per_runner",
            "None or an int >= 1",
        )
        need(self.gym_env_vectorize_mode in ("sync", "SYNC"), "gym_env_vectorize_mode", "'sync'")
        need(
            self.num_learners <= 1 or self.groups_per_iteration >= self.num_learners,
            "groups_per_iteration",
            f">= num_learners ({self.num_learners}): every learner trains whole groups",
        )
        shortfall = resource_shortfall(self)
        if shortfall:
            raise ValueError(f"GAGPOConfig.num_learners / num_env_runners cannot be placed: {shortfall}")
        problem = gpu_placement_problem(self)
        if problem:
            raise ValueError(f"GAGPOConfig GPU placement: {problem}")

    def validate_lora(self, need: Any, is_int: Any, is_num: Any) -> None:
        """The LoRA fields (``need`` raises naming the field); target names are checked against the model's
        linear modules when its config is a local folder (built on the meta device, no weights read)."""
        need(is_int(self.lora_rank) and self.lora_rank >= 0, "lora_rank", "an int >= 0 (0: LoRA off)")
        need(
            self.lora_alpha is None or (is_num(self.lora_alpha) and self.lora_alpha > 0),
            "lora_alpha",
            "None (2 x lora_rank) or a number > 0",
        )
        need(
            is_num(self.lora_dropout) and 0.0 <= self.lora_dropout < 1.0, "lora_dropout", "a number in [0, 1)"
        )
        targets = self.lora_target_modules
        need(
            targets == "all-linear"
            or (
                isinstance(targets, (list, tuple))
                and len(targets) > 0
                and all(isinstance(t, str) and t.strip() for t in targets)
            ),
            "lora_target_modules",
            "'all-linear' or a non-empty list of linear module names",
        )
        need(self.lora_sync in LORA_SYNCS, "lora_sync", f"one of {LORA_SYNCS}")
        if self.lora_rank == 0:
            set_fields = [
                f
                for f, default in (
                    ("lora_alpha", None),
                    ("lora_dropout", 0.0),
                    ("lora_target_modules", "all-linear"),
                )
                if getattr(self, f) != default
            ]
            need(
                not set_fields,
                "lora_rank",
                f"an int >= 1 when {', '.join(set_fields)} is set (0 turns LoRA off)",
            )
            return
        if importlib.util.find_spec("peft") is None:
            raise ValueError(
                f"GAGPOConfig.lora_rank={self.lora_rank} needs peft: pip install 'gagpo-rllib[lora]' (peft 0.21)"
            )
        need(
            self.learner_sharding != "fsdp",
            "learner_sharding",
            f"'ddp' with lora_rank {self.lora_rank} (LoRA with FSDP is not supported: set "
            "GAGPOConfig.lora_rank=0 or learner_sharding='ddp')",
        )
        if self.lora_dropout > 0:
            logger.warning(
                "GAGPOConfig.lora_dropout=%g: the learner's log-probs differ from the rollout's (dropout), so the "
                "first-minibatch ratio is not 1",
                self.lora_dropout,
            )
        if self.backend == "vllm" and self.lora_sync == "adapter":
            need(
                self.lora_rank <= max(VLLM_LORA_RANKS),
                "lora_rank",
                f"<= {max(VLLM_LORA_RANKS)} with lora_sync 'adapter' (vLLM's largest LoRA rank), or use "
                "lora_sync='merged'",
            )
            need(
                targets == "all-linear" or "lm_head" not in targets,
                "lora_sync",
                "'merged' when lora_target_modules include lm_head (vLLM's LoRA does not adapt the output head)",
            )
        if targets != "all-linear":
            known = model_linear_names(self.model_path)
            if known is not None:
                unknown = sorted(set(targets) - set(known))
                need(
                    not unknown,
                    "lora_target_modules",
                    f"names of the model's linear modules {known} ({unknown} are not)",
                )

    @property
    def lora_settings(self) -> dict[str, Any] | None:
        """The module's ``model_config["lora"]``: None when ``lora_rank`` is 0."""
        if not self.lora_rank:
            return None
        return {
            "rank": int(self.lora_rank),
            "alpha": float(self.lora_alpha if self.lora_alpha is not None else 2 * self.lora_rank),
            "dropout": float(self.lora_dropout),
            "target_modules": (
                self.lora_target_modules
                if isinstance(self.lora_target_modules, str)
                else list(self.lora_target_modules)
            ),
            # What the rollout engines receive: adapters only where vLLM runs them, else the merged policy.
            "sync": "adapter" if self.backend == "vllm" and self.lora_sync == "adapter" else "merged",
        }

    # ------------------------------------------------------------------------------------------- components
    @property
    def components(self) -> Components:
        """The module, learner and advantages connector of the estimator: with the critic for "ppo" (unless
        ``build_critic`` is off, as in evaluation, where the critic would only be dead weight)."""
        if self.estimator == "ppo" and self.build_critic:
            return CRITIC_COMPONENTS
        return POLICY_COMPONENTS

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(
            module_class=self.components.module_class, model_config=self.module_model_config()
        )

    def module_model_config(self) -> dict[str, Any]:
        sampling = {
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "constrained": self.constrained_decoding,
        }
        return {
            "model_path": self.model_path,
            "dtype": self.dtype,
            "pure_low_precision": self.pure_low_precision,
            "gradient_checkpointing": self.uses_gradient_checkpointing,
            "backend": self.backend,
            "backend_kwargs": dict(self.backend_kwargs),
            "sampling": sampling,
            "eval_sampling": {**sampling, "temperature": self.eval_temperature},
            "reference": self.kl_coeff > 0,
            "lora": self.lora_settings,
            "max_prompt_tokens": self.max_prompt_tokens,
            "train_chunk_tokens": self.train_chunk_tokens,
            "reference_cache_rows": self.reference_cache_rows,
            **(
                {"critic": {"share_trunk": self.critic_share_trunk, "seed": self.seed or 0}}
                if self.components.critic
                else {}
            ),
        }

    def get_default_learner_class(self) -> type:
        return self.components.learner_class

    @property
    def state_key_history_length(self) -> int:
        """H of the "history" state key: ``state_key_history``, else the prompt's ``history_length``."""
        return self.history_length if self.state_key_history is None else self.state_key_history

    def prompt_templates(self, env: Any = None, *, constrained: bool | None = None) -> tuple[str, str]:
        """(first, later) templates: the configured ones, else the env package's ``prompts.py`` (its tag-free
        variant under constrained decoding; ``constrained`` None: the config's ``constrained_decoding``)."""
        if self.prompt_template is not None and self.first_prompt_template is not None:
            return self.first_prompt_template, self.prompt_template
        env_cls = self.env if isinstance(self.env, type) else None
        if env_cls is None and env is not None:
            env_cls = type(env.unwrapped.envs[0].unwrapped)
        if env_cls is None:
            raise ValueError(
                "GAGPOConfig.prompt_template / first_prompt_template: not set and the env is not a class whose "
                "package has prompts.py; pass the templates with .llm(...)"
            )
        from gagpo_rllib.rllib.connectors.rollout import load_env_templates

        if constrained is None:
            constrained = bool(self.constrained_decoding)
        first, later = load_env_templates(env_cls, constrained=constrained)
        return self.first_prompt_template or first, self.prompt_template or later

    def build_env_to_module_connector(self, env=None, spaces=None, device=None):
        pipeline = super().build_env_to_module_connector(env=env, spaces=spaces, device=device)
        pipeline.prepend(PromptConnector(**self.prompt_settings(env)))
        return pipeline

    def prompt_settings(self, env: Any = None, *, constrained: bool | None = None) -> dict[str, Any]:
        """How a step's prompt is built (``PromptBuilder``'s keywords): the templates (``prompt_templates``), the
        history shown, the prompt budget ``max_prompt_tokens`` and the system prompt; the RL rollouts and the
        supervised warm start (``rllib sft``) build their prompts from this one place."""
        first, later = self.prompt_templates(env, constrained=constrained)
        return {
            "first_template": first,
            "template": later,
            "history_length": self.history_length,
            "max_prompt_tokens": self.max_prompt_tokens,
            "system_prompt": self.system_prompt,
        }

    def build_module_to_env_connector(self, env=None, spaces=None):
        pipeline = super().build_module_to_env_connector(env=env, spaces=spaces)
        pipeline.prepend(ActionParserConnector(constrained=self.constrained_decoding))
        pipeline.append(StateKeyConnector(state_key=self.state_key, history=self.state_key_history_length))
        return pipeline

    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        pipeline = super().build_learner_connector(input_observation_space, input_action_space, device=device)
        pipeline.prepend(self.grouped_advantages())
        return pipeline

    def grouped_advantages(self) -> GroupedAdvantages:
        return self.components.advantages_class(
            estimator=self.estimator,
            gamma=self.gamma,
            lam=self.lam,
            norm=self.norm,
            omega=self.omega,
            invalid_penalty=self.invalid_penalty,
            skip_uniform_groups=self.skip_uniform_groups,
            constrained=self.constrained_decoding,
            recompute_old_logprobs=self.uses_recomputed_old_logprobs,
            similarity_threshold=self.similarity_threshold,
            behaviour_weight_cap=float(self.behaviour_weight_cap) if self.max_staleness > 0 else None,
        )

    @property
    def max_extra_groups(self) -> int:
        """Dynamic sampling's bound on extra groups per iteration (0 when it is off)."""
        if not self.dynamic_sampling:
            return 0
        if self.dynamic_sampling_max_extra_groups is None:
            return int(self.groups_per_iteration)
        return int(self.dynamic_sampling_max_extra_groups)

    @property
    def uses_gradient_checkpointing(self) -> bool:
        """Whether the learners recompute activations in backward (``gradient_checkpointing``)."""
        if self.gradient_checkpointing is not None:
            return bool(self.gradient_checkpointing)
        return float(self.num_gpus_per_learner or 0) > 0

    @property
    def shards_learners(self) -> bool:
        """Whether the learners shard the model (FSDP over two or more learners): then a whole copy of the weights
        exists only when they gather it together, and collectives need every learner."""
        return self.learner_sharding == "fsdp" and int(self.num_learners) > 1

    @property
    def shuffles_minibatches(self) -> bool:
        """Whether the learners deal the steps into minibatches at random (see ``shuffle_batch_per_epoch``). A critic
        needs it: minibatches of a few whole groups are a few tasks each, and a value regression stepped on one
        task's returns after another's swings between them."""
        if self.shuffle_batch_per_epoch is not None:
            return bool(self.shuffle_batch_per_epoch)
        return self.estimator == "ppo"

    @property
    def uses_recomputed_old_logprobs(self) -> bool:
        """Whether the learner recomputes the old log-probs (see ``recompute_old_logprobs``); always with
        ``max_staleness`` >= 1, where the rollout's are the behaviour policy's, not the proximal one's."""
        if self.recompute_old_logprobs is not None:
            return bool(self.recompute_old_logprobs)
        return self.backend != "hf" or self.dtype != "float32" or self.max_staleness > 0


def model_linear_names(model_path: str | None) -> list[str] | None:
    """The linear module names of the model in local folder ``model_path`` (built on the meta device from its
    config.json); None when that is not a readable local folder (the module checks when it loads the model)."""
    from pathlib import Path

    if not model_path or not (Path(model_path).expanduser() / "config.json").is_file():
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gagpo_rllib.policy.lora import linear_module_names

    try:
        config = AutoConfig.from_pretrained(str(Path(model_path).expanduser()), local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as err:
        logger.warning(
            "GAGPOConfig.lora_target_modules: cannot read %s (%s); checked at load", model_path, err
        )
        return None
    return linear_module_names(model)


def setter_of(field: str) -> str:
    """The name of the GAGPOConfig setter that takes ``field`` (GAGPO's fields first, then RLlib's setters')."""
    for setter, fields in SETTER_FIELDS.items():
        if field in fields:
            return setter
    for setter in RLLIB_SETTERS:
        if field in inspect.signature(getattr(AlgorithmConfig, setter)).parameters:
            return setter
    raise TypeError(f"GAGPOConfig has no setter taking {field!r}")


def configure(config: GAGPOConfig, **fields: Any) -> GAGPOConfig:
    """Give each field to its setter (``setter_of``): for code that holds settings as one flat mapping (test
    factories, sweeps); hand-written configs call the setters themselves."""
    by_setter: dict[str, dict[str, Any]] = {}
    for field, value in fields.items():
        by_setter.setdefault(setter_of(field), {})[field] = value
    for setter, values in by_setter.items():
        getattr(config, setter)(**values)
    return config
