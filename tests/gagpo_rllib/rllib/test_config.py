"""GAGPOConfig: a typed fluent setter, and validation errors that name the field."""

from __future__ import annotations

import pytest

from gagpo_rllib import GAGPO, GAGPOConfig
from gagpo_rllib.policy.rl_module import LLMRLModule
from gagpo_rllib.rllib.config import configure
from gagpo_rllib.rllib.learner import GAGPOTorchLearner


def _valid() -> GAGPOConfig:
    return GAGPOConfig().llm(
        model_path="/some/model", prompt_template="{task}", first_prompt_template="{task}"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("group_size", 0),
        ("group_size", 2.5),
        ("groups_per_iteration", 0),
        ("lam", 1.5),
        ("lam", -0.1),
        ("gamma", 1.01),
        ("estimator", "a2c"),
        ("norm", "max"),
        ("clip_eps", 0.0),
        ("kl_coeff", -1.0),
        ("entropy_coeff", float("nan")),
        ("invalid_penalty", -0.1),
        ("history_length", -1),
        ("max_new_tokens", 0),
        ("temperature", 0.0),
        ("max_steps", 0),
        ("backend", "tgi"),
        ("dtype", "int8"),
        ("model_path", None),
        ("model_path", "  "),
        ("envs_per_runner", 0),
        ("skip_uniform_groups", "yes"),
        ("state_key", "exact"),
        ("state_key_history", -1),
        ("similarity_threshold", 0.0),
        ("vf_coeff", -1.0),
        ("vf_clip", 0.0),
        ("critic_lr", 0.0),
        ("critic_share_trunk", "yes"),
        ("max_prompt_tokens", 0),
        ("train_chunk_tokens", 0),
        ("train_chunk_tokens", 8.5),
        ("reference_cache_rows", -1),
        ("learner_sharding", "zero3"),
        ("gradient_checkpointing", "on"),
        ("pure_low_precision", 1),
        ("rollout_schedule", "async"),
        ("max_staleness", -1),
        ("max_staleness", 1.0),
        ("behaviour_weight_cap", 0.5),
        ("weight_transport", "nccl"),
    ],
)
def test_bad_values_name_the_field(field: str, value) -> None:
    config = configure(_valid(), **{field: value})
    with pytest.raises(ValueError, match=rf"GAGPOConfig\.{field}\b"):
        config.validate_gagpo()


def test_staleness_needs_the_proximal_log_probs_and_engines_that_stay_awake() -> None:
    assert _valid().training(max_staleness=1).uses_recomputed_old_logprobs
    assert not _valid().uses_recomputed_old_logprobs
    with pytest.raises(ValueError, match="GAGPOConfig.recompute_old_logprobs"):
        _valid().training(max_staleness=1, recompute_old_logprobs=False).validate_gagpo()
    with pytest.raises(ValueError, match="GAGPOConfig.max_staleness"):
        configure(_valid(), max_staleness=1, sleep_engines_during_update=True).validate_gagpo()
    assert _valid().grouped_advantages().behaviour_weight_cap is None
    assert (
        _valid().training(max_staleness=2, behaviour_weight_cap=3).grouped_advantages().behaviour_weight_cap
        == 3
    )


def test_the_weight_transport_auto_picks_broadcast_between_gpus_and_ipc_on_shared_ones() -> None:
    from gagpo_rllib.rllib.weight_sync import transport_of

    assert transport_of(_valid()) == "object_store"  # CPUs
    separate = (
        _valid().learners(num_gpus_per_learner=1).env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    )
    assert transport_of(separate) == "broadcast"
    colocated = _valid().learners(num_gpus_per_learner=0.51).env_runners(num_gpus_per_env_runner=0.392)
    assert transport_of(colocated) == "ipc"  # paper_setup's colocated layout
    whole_learner = colocated.learners(num_gpus_per_learner=1)
    assert transport_of(whole_learner) == "object_store"  # engines sharing GPUs cannot join one NCCL group
    assert transport_of(separate.learners(weight_transport="object_store")) == "object_store"
    assert transport_of(_valid().learners(weight_transport="broadcast")) == "broadcast"
    assert transport_of(_valid().learners(weight_transport="ipc")) == "ipc"


def test_gigpo_needs_a_centring_norm() -> None:
    with pytest.raises(ValueError, match="GAGPOConfig.norm"):
        _valid().gagpo(estimator="gigpo", norm="none").validate_gagpo()


def test_missing_model_path_fails_validate() -> None:
    config = GAGPOConfig().llm(prompt_template="{task}", first_prompt_template="{task}")
    with pytest.raises(ValueError, match="GAGPOConfig.model_path"):
        config.validate()


def test_fluent_setter_sets_only_given_fields_and_defaults() -> None:
    config = _valid().gagpo(group_size=4, estimator="rloo")
    assert config.group_size == 4 and config.estimator == "rloo"
    assert config.groups_per_iteration == 16 and config.lam == 0.95 and config.invalid_penalty == 0.1
    config.validate_gagpo()
    assert config.algo_class is GAGPO
    assert config.get_default_learner_class() is GAGPOTorchLearner
    spec = config.get_default_rl_module_spec()
    assert spec.module_class is LLMRLModule
    assert spec.model_config["model_path"] == "/some/model"
    assert spec.model_config["eval_sampling"]["temperature"] == config.eval_temperature


def test_validate_sizes_the_runners_for_one_iteration() -> None:
    config = _valid().gagpo(group_size=4, groups_per_iteration=3, max_steps=7).env_runners(num_env_runners=2)
    config.validate()
    assert config.num_envs_per_env_runner == 6
    assert config.env_config["max_steps"] == 7
    config = _valid().env_runners(envs_per_runner=2)
    config.validate()
    assert config.num_envs_per_env_runner == 2


def test_reference_copy_only_when_the_kl_term_is_on() -> None:
    assert _valid().module_model_config()["reference"] is True
    assert _valid().training(kl_coeff=0.0).module_model_config()["reference"] is False


def test_minibatches_are_shuffled_by_default_exactly_when_a_critic_trains() -> None:
    from gagpo_rllib import GAGPOConfig

    config = GAGPOConfig().llm(model_path="m")
    assert config.shuffle_batch_per_epoch is None and not config.shuffles_minibatches
    assert config.copy().gagpo(estimator="ppo").shuffles_minibatches
    assert (
        not config.copy().gagpo(estimator="ppo").training(shuffle_batch_per_epoch=False).shuffles_minibatches
    )
    assert config.copy().training(shuffle_batch_per_epoch=True).shuffles_minibatches


def test_learners_shard_only_under_fsdp_with_two_or_more() -> None:
    from gagpo_rllib import GAGPOConfig

    config = GAGPOConfig().llm(model_path="m")
    assert not config.shards_learners
    assert not config.copy().learners(learner_sharding="fsdp", num_learners=1).shards_learners
    assert not config.copy().learners(learner_sharding="ddp", num_learners=2).shards_learners
    assert config.copy().learners(learner_sharding="fsdp", num_learners=2).shards_learners


def test_old_logprobs_are_recomputed_exactly_when_rollout_numerics_differ():
    from gagpo_rllib import GAGPOConfig

    config = GAGPOConfig().llm(model_path="m")
    assert not config.uses_recomputed_old_logprobs
    assert config.copy().llm(dtype="bfloat16").uses_recomputed_old_logprobs
    assert config.copy().env_runners(backend="vllm").uses_recomputed_old_logprobs
    assert config.copy().training(recompute_old_logprobs=True).uses_recomputed_old_logprobs
    assert config.copy().training(recompute_old_logprobs=True).grouped_advantages().recompute_old_logprobs
    assert (
        not config.copy()
        .training(recompute_old_logprobs=False)
        .env_runners(backend="vllm")
        .uses_recomputed_old_logprobs
    )


def test_each_setter_takes_its_own_fields() -> None:
    config = (
        GAGPOConfig()
        .llm(model_path="m", max_prompt_tokens=300, temperature=0.9)
        .gagpo(group_size=3, gamma=0.9)
        .training(lr=1e-4, clip_eps=0.3, train_chunk_tokens=128)
        .env_runners(num_env_runners=1, backend="hf", envs_per_runner=2)
        .learners(num_learners=0, learner_sharding="fsdp")
    )
    assert (config.model_path, config.max_prompt_tokens, config.temperature) == ("m", 300, 0.9)
    assert (config.group_size, config.gamma, config.lr, config.clip_eps) == (3, 0.9, 1e-4, 0.3)
    assert (config.num_env_runners, config.envs_per_runner, config.learner_sharding) == (1, 2, "fsdp")
    with pytest.raises(TypeError, match="model_path"):
        GAGPOConfig().gagpo(model_path="m")  # the model is .llm()'s
    with pytest.raises(TypeError, match="clip_eps"):
        GAGPOConfig().llm(clip_eps=0.2)


def test_configure_routes_each_keyword_to_its_setter() -> None:
    from gagpo_rllib.rllib.config import setter_of

    assert [
        setter_of(f) for f in ("gamma", "model_path", "kl_coeff", "lr", "backend", "num_learners", "seed")
    ] == [
        "gagpo",
        "llm",
        "training",
        "training",
        "env_runners",
        "learners",
        "debugging",
    ]
    config = configure(
        GAGPOConfig(), model_path="m", lam=0.5, lr=3e-4, torch_threads=2, learner_sharding="ddp"
    )
    assert (config.model_path, config.lam, config.lr, config.torch_threads) == ("m", 0.5, 3e-4, 2)
    with pytest.raises(TypeError, match="no setter taking 'colour'"):
        configure(GAGPOConfig(), colour="red")


def test_the_estimator_picks_module_learner_and_connector_in_one_place() -> None:
    from gagpo_rllib.policy.critic import CriticRLModule
    from gagpo_rllib.rllib.connectors.critic_advantages import CriticAdvantages
    from gagpo_rllib.rllib.critic_learner import GAGPOCriticTorchLearner

    ppo = _valid().gagpo(estimator="ppo")
    assert ppo.get_default_rl_module_spec().module_class is CriticRLModule
    assert ppo.get_default_learner_class() is GAGPOCriticTorchLearner
    assert isinstance(ppo.grouped_advantages(), CriticAdvantages) and "critic" in ppo.module_model_config()
    ppo.build_critic = False  # evaluation: the policy alone
    assert ppo.get_default_rl_module_spec().module_class is LLMRLModule
    assert ppo.get_default_learner_class() is GAGPOTorchLearner and "critic" not in ppo.module_model_config()


def test_setup_start_steps_run_only_when_the_algorithm_sets_up() -> None:
    calls = []
    config = _valid().callbacks(on_setup_start=lambda config: calls.append(config.model_path))
    config.copy().validate()
    assert calls == []
    config.run_setup_start()
    assert calls == ["/some/model"]


def test_the_package_exports_the_config_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, gagpo_rllib, gagpo_rllib.method.advantages; assert 'ray' not in sys.modules; "
        "from gagpo_rllib import GAGPO, GAGPOConfig; assert GAGPOConfig().algo_class is GAGPO"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
