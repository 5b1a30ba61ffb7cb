"""GAGPOConfig: GAGPO's typed, validated configuration, built from one field table (``fields.FIELDS``).

Each field GAGPO adds to RLlib's config has one row in the table: its setter (``.gagpo()`` the method, ``.llm()``
the model, its decoding and its prompts, RLlib's ``.training()`` also the loss and learner numerics,
``.env_runners()`` also the rollout engine, ``.learners()`` the learners' sharding, ``.fault_tolerance()`` grouped
sampling's), default, check and doc. From it come the attributes' defaults, the setters and their docstrings and
the check of each field on its own. What stays hand-written here is ``validate_rules``: each rule that ties two
fields together (or a field to the model, the env or the cluster), once; and what the config builds: the
module's settings, the connectors and the components of the estimator.
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from gagpo_rllib.method.similarity import check_threshold
from gagpo_rllib.policy.critic import CriticRLModule
from gagpo_rllib.policy.lora import check_lora, lora_module_settings
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
from gagpo_rllib.rllib.fields import FIELD, FIELDS, RLLIB_SETTERS, SETTERS
from gagpo_rllib.rllib.learner import GAGPOTorchLearner
from gagpo_rllib.rllib.placement import gpu_placement_problem, resource_shortfall

__all__ = ["Components", "GAGPOConfig", "configure", "setter_of"]

logger = logging.getLogger(__name__)


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


class GAGPOConfig(AlgorithmConfig):
    """Typed, validated configuration of GAGPO (its fields: ``fields.FIELDS``; ``fields.option_table()`` lists them).

    The invalid-action penalty (``invalid_penalty``) is subtracted from the reward of invalid steps in the reward
    column handed to ``compute_advantages`` only; the reported episode return and success rate use the
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
        for f in FIELDS:
            setattr(self, f.name, dict(f.default) if isinstance(f.default, dict) else f.default)
        # RLlib's; None: shuffled exactly when a critic trains (``shuffles_minibatches``).
        self.shuffle_batch_per_epoch: bool | None = None
        # Evaluation builds the policy alone: False leaves out the critic of estimator "ppo" (it only trains).
        self.build_critic: bool = True
        # Callables fn(config=...) run before the Algorithm builds its EnvRunners and Learners (``.callbacks()``).
        self.callbacks_on_setup_start: Any = None
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

    # ----------------------------------------------------------------------------------------------- setters
    def _set(self, setter: str, given: dict[str, Any]) -> dict[str, Any]:
        """Set the GAGPO fields of ``setter`` in ``given`` (not left ``NotProvided``); returns the other keywords."""
        rest = {}
        for name, value in given.items():
            field = FIELD.get(name)
            if field is not None and field.setter == setter:
                if value is not NotProvided:
                    setattr(self, name, value)
            elif setter in ("gagpo", "llm"):
                raise TypeError(f"GAGPOConfig.{setter}() got an unexpected keyword argument {name!r}")
            else:
                rest[name] = value
        return rest

    def gagpo(self, **fields: Any) -> GAGPOConfig:
        self._set("gagpo", fields)
        return self

    def llm(self, **fields: Any) -> GAGPOConfig:
        self._set("llm", fields)
        return self

    def training(self, **fields: Any) -> GAGPOConfig:
        """kwargs: also ``AlgorithmConfig.training``'s. ``shuffle_batch_per_epoch``: deal the batch's steps into
        the minibatches at random every epoch (seeded); None (default): exactly when a critic trains."""
        return super().training(**self._set("training", fields))

    def env_runners(self, **fields: Any) -> GAGPOConfig:
        return super().env_runners(**self._set("env_runners", fields))

    def learners(self, **fields: Any) -> GAGPOConfig:
        return super().learners(**self._set("learners", fields))

    def fault_tolerance(self, **fields: Any) -> GAGPOConfig:
        return super().fault_tolerance(**self._set("fault_tolerance", fields))

    def callbacks(self, *args: Any, on_setup_start: Any = NotProvided, **kwargs: Any) -> GAGPOConfig:
        """RLlib's callbacks plus ``on_setup_start``: a callable ``fn(config=...)`` or a list of them, run in the
        process that builds the Algorithm before it builds its EnvRunners and Learners (e.g. a cached warm start
        that fills the model folder the config names). Reading or copying the config runs nothing."""
        if on_setup_start is not NotProvided:
            self.callbacks_on_setup_start = on_setup_start
        return super().callbacks(*args, **kwargs)

    def run_setup_start(self) -> None:
        """Run the ``on_setup_start`` callables (``GAGPO.setup`` calls this first)."""
        steps = self.callbacks_on_setup_start
        for step in steps if isinstance(steps, (list, tuple)) else [steps] if steps is not None else []:
            step(config=self)

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        """RLlib's checks, then GAGPO's; each error names the field. Sets ``num_envs_per_env_runner``."""
        super().validate()
        self.validate_gagpo()
        if self.envs_per_runner is None:
            per_runner = math.ceil(self.group_size * self.groups_per_iteration / max(1, self.num_env_runners))
            self.num_envs_per_env_runner = max(1, per_runner)
        else:
            self.num_envs_per_env_runner = self.envs_per_runner
        if self.max_steps is not None and isinstance(self.env_config, dict):
            self.env_config = {**self.env_config, "max_steps": self.max_steps}

    def need(self, ok: bool, field: str, expected: str) -> None:
        """Raise ValueError naming ``field``, what it must be and its value, unless ``ok``."""
        if not ok:
            raise ValueError(f"GAGPOConfig.{field} must be {expected}, got {getattr(self, field)!r}")

    def validate_gagpo(self) -> None:
        """Every field on its own (``FIELDS``), then the rules between fields (``validate_rules``)."""
        for f in FIELDS:
            problem = f.problem(getattr(self, f.name))
            self.need(problem is None, f.name, problem or "")
        self.need(isinstance(self.build_critic, bool), "build_critic", "a bool")
        self.validate_rules()

    def validate_rules(self) -> None:
        """The checks that read more than one field, or the model, the env or the cluster: each rule once."""
        need = self.need
        need(
            isinstance(self.model_path, str) and bool(self.model_path.strip()),
            "model_path",
            "a model folder or hub id (set it with .llm(model_path=...))",
        )
        need(
            not (self.estimator == "gigpo" and self.norm == "none"), "norm", "'mean' or 'mean_std' for gigpo"
        )
        resolve_state_key(self.state_key, history=self.state_key_history_length)
        if self.similarity_threshold is not None:
            check_threshold(self.similarity_threshold)
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
        validate_engine_sleep(self)
        if self.backend == "vllm":
            from gagpo_rllib.policy.generation.vllm import MAX_TEMPERATURE, MIN_TEMPERATURE

            # vLLM's log-probs are not the learner's (other kernels; NaN for remapped constrained answers).
            need(
                self.recompute_old_logprobs is not False,
                "recompute_old_logprobs",
                "None or True with backend 'vllm'",
            )
            for name in ("temperature", "eval_temperature"):
                need(
                    MIN_TEMPERATURE <= getattr(self, name) <= MAX_TEMPERATURE,
                    name,
                    f"in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] with backend 'vllm' (vLLM's range)",
                )
        if self.pure_low_precision and self.dtype != "float32":
            logger.warning(
                "GAGPOConfig.pure_low_precision: the learner keeps its weights and Adam state in %s; updates "
                "smaller than its resolution (lr %g on weights ~0.02) are rounded away",
                self.dtype,
                self.lr if isinstance(self.lr, float) else float("nan"),
            )
        check_lora(self, self.need, changed=lambda name: getattr(self, name) != FIELD[name].default)
        need(
            not (self.learner_sharding == "fsdp" and self.components.critic and self.critic_share_trunk),
            "critic_share_trunk",
            "False with learner_sharding 'fsdp' (the shared trunk's value head would read the policy's trunk"
            " outside its FSDP unit; the separate critic, the default, is sharded like the policy)",
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
            "lora": lora_module_settings(self),
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


def _document_setters() -> None:
    """Each setter's signature and docstring from ``FIELDS`` (RLlib's setters keep their own keywords too)."""
    kind = inspect.Parameter.KEYWORD_ONLY
    for setter in SETTERS:
        method = getattr(GAGPOConfig, setter)
        fields = [f for f in FIELDS if f.setter == setter]
        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [inspect.Parameter(f.name, kind, default=NotProvided) for f in fields]
        rllib = setter in RLLIB_SETTERS
        if rllib:
            params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        method.__signature__ = inspect.Signature(params, return_annotation="GAGPOConfig")
        args = [f"    {f.name}: {f.doc} (default {f.default!r})." for f in fields]
        own = (method.__doc__ or "").strip()
        head = f"Set GAGPO's ``{setter}`` fields (only those given); ``validate()`` checks them."
        if rllib:
            head = f"RLlib's ``{setter}`` settings plus GAGPO's (only those given). {own}".strip()
        method.__doc__ = "\n".join([head, "", "Args:", *args])


_document_setters()


def setter_of(field: str) -> str:
    """The name of the GAGPOConfig setter that takes ``field`` (GAGPO's fields first, then RLlib's setters')."""
    if field in FIELD:
        return FIELD[field].setter
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
