"""The paper's shared set-up: the same hyperparameters on any env, the GPU split, CPU without GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagpo_rllib.rllib.paper_setup import count_from_env, paper_config, scale_out_from_env, sharding_from_env
from gagpo_rllib.rllib.weight_sync import transport_of
from tests.gagpo_rllib.toy_env import CorridorEnv


def _config(tiny_policy_path: Path, env_config: dict | None = None, **kwargs):
    """The paper config on the toy env; the separate placement unless ``colocate`` says otherwise."""
    args = dict(
        model_path=str(tiny_policy_path),
        max_steps=7,
        max_prompt_tokens=300,
        valid_split="valid",
        num_learners=0,
        num_env_runners=1,
        colocate=False,
    )
    return paper_config(CorridorEnv, env_config or {"split": "train"}, **{**args, **kwargs})


def _packs(gpus: int, shares: list[float]) -> bool:
    """Whether the actors' GPU shares fit on ``gpus`` devices, largest first onto the fullest GPU it fits
    (how Ray's fractional GPUs must be placed: a share never spans two devices)."""
    free = [1.0] * gpus
    for share in sorted(shares, reverse=True):
        fits = [i for i, f in enumerate(free) if f >= share - 1e-9]
        if not fits:
            return False
        best = min(fits, key=lambda i: free[i])
        free[best] -= share
    return True


@pytest.mark.parametrize(
    ("gpus", "learners", "runners", "learner", "runner"),
    [
        (1, 0, 1, 0.5, 0.4),
        (4, 2, 2, 1.0, 0.8),
        (8, 1, 1, 1.0, 0.8),
        (8, 4, 4, 1.0, 0.8),
        (8, 2, 8, 1.0, 0.4),
        (3, 0, 3, 0.5, 0.4),
    ],
)
def test_gpus_split_into_whole_nccl_learners_runners_and_a_validation_runner(
    tiny_policy_path, gpus, learners, runners, learner, runner
) -> None:
    c = _config(tiny_policy_path, num_gpus=gpus, num_learners=learners, num_env_runners=runners)
    assert (c.num_gpus_per_learner, c.num_gpus_per_env_runner) == pytest.approx((learner, runner))
    assert (c.num_learners, c.num_env_runners) == (learners, runners)
    assert (c.backend, c.dtype) == ("vllm", "bfloat16")
    train_memory = c.backend_kwargs["gpu_memory_utilization"]
    assert c.evaluation_config["backend_kwargs"]["gpu_memory_utilization"] < train_memory
    valid = c.evaluation_config["num_gpus_per_env_runner"]
    assert c.evaluation_num_env_runners == 1 and valid > 0  # validation on a runner of its own, with a GPU
    # The local learner (num_learners 0) shares the driver's bundle; every actor's share must pack.
    shares = [learner] * max(1, learners) + [runner] * runners + [valid]
    assert _packs(gpus, shares), shares


def test_nccl_learners_never_share_a_gpu(tiny_policy_path) -> None:
    with pytest.raises(ValueError, match="GAGPO_GPUS=2 with GAGPO_NUM_LEARNERS=2: each NCCL learner needs"):
        _config(tiny_policy_path, num_gpus=2, num_learners=2, num_env_runners=2)
    with pytest.raises(ValueError, match="GAGPO_NUM_ENV_RUNNERS=0 with GAGPO_GPUS=1"):
        _config(tiny_policy_path, num_gpus=1, num_learners=0, num_env_runners=0)


def test_without_gpus_it_trains_on_cpu_with_hf_rollouts(tiny_policy_path, monkeypatch) -> None:
    monkeypatch.delenv("GAGPO_GPUS", raising=False)
    env_config = {"split": "train"}
    c = _config(tiny_policy_path, env_config, seed=3)
    assert (c.backend, c.dtype, c.backend_kwargs) == ("hf", "float32", {})
    assert (c.num_gpus_per_learner, c.num_gpus_per_env_runner) == (0, 0)
    assert (c.max_steps, c.max_prompt_tokens, c.seed) == (7, 300, 3)
    assert (c.group_size, c.groups_per_iteration, c.gamma, c.lam, c.lr) == (8, 16, 0.95, 0.95, 1e-6)
    assert c.evaluation_config["env_config"]["split"] == "valid" and c.evaluation_interval == 5
    c.env_config["split"] = "changed"
    assert env_config == {"split": "train"}
    monkeypatch.setenv("GAGPO_GPUS", "1")
    assert _config(tiny_policy_path).backend == "vllm"


@pytest.mark.parametrize("value", ["one", "1.5", "-1"])
def test_a_bad_gagpo_gpus_is_an_error_naming_it(tiny_policy_path, monkeypatch, value) -> None:
    monkeypatch.setenv("GAGPO_GPUS", value)
    with pytest.raises(ValueError, match=f"GAGPO_GPUS: the number of GPUs, an int >= 0, got '{value}'"):
        _config(tiny_policy_path)


@pytest.mark.parametrize("name", ["GAGPO_NUM_LEARNERS", "GAGPO_NUM_ENV_RUNNERS"])
def test_a_bad_learner_or_runner_count_is_an_error_naming_it(monkeypatch, name) -> None:
    monkeypatch.delenv(name, raising=False)
    assert count_from_env(name, 1, "a count") == 1
    monkeypatch.setenv(name, "2")
    assert count_from_env(name, 1, "a count") == 2
    for value in ("two", "-1"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}: a count, an int >= 0, got '{value}'"):
            count_from_env(name, 1, "a count")


def test_scale_out_reads_both_counts_and_names_a_bad_one(monkeypatch) -> None:
    monkeypatch.delenv("GAGPO_NUM_LEARNERS", raising=False)
    monkeypatch.delenv("GAGPO_NUM_ENV_RUNNERS", raising=False)
    assert scale_out_from_env() == (0, 1)
    monkeypatch.setenv("GAGPO_NUM_LEARNERS", "2")
    monkeypatch.setenv("GAGPO_NUM_ENV_RUNNERS", "4")
    assert scale_out_from_env() == (2, 4)
    monkeypatch.setenv("GAGPO_NUM_ENV_RUNNERS", "four")
    with pytest.raises(
        ValueError, match="GAGPO_NUM_ENV_RUNNERS: the number of EnvRunners, an int >= 0, got 'four'"
    ):
        scale_out_from_env()


def test_gpu_learners_train_fp32_masters_with_checkpointing_and_shard_on_request(
    tiny_policy_path, monkeypatch
) -> None:
    monkeypatch.delenv("GAGPO_LEARNER_SHARDING", raising=False)
    c = _config(tiny_policy_path, num_gpus=4, num_learners=2, num_env_runners=2)
    model_config = c.module_model_config()
    assert (model_config["dtype"], model_config["pure_low_precision"]) == ("bfloat16", False)
    assert model_config["gradient_checkpointing"] is True and c.learner_sharding == "ddp"
    assert _config(tiny_policy_path).module_model_config()["gradient_checkpointing"] is False  # CPU
    monkeypatch.setenv("GAGPO_LEARNER_SHARDING", "fsdp")
    assert sharding_from_env() == "fsdp"
    assert _config(tiny_policy_path, num_gpus=4, num_learners=2, num_env_runners=2).learner_sharding == "fsdp"
    # GPU learners' bundles hold CPUs for their host work (RLlib's "auto" gives a GPU learner none).
    monkeypatch.delenv("GAGPO_CPUS_PER_LEARNER", raising=False)
    assert c.num_cpus_per_learner == 4 and _config(tiny_policy_path).num_cpus_per_learner == "auto"
    monkeypatch.setenv("GAGPO_CPUS_PER_LEARNER", "8")
    assert _config(tiny_policy_path, num_gpus=4, num_learners=2, num_env_runners=2).num_cpus_per_learner == 8
    monkeypatch.setenv("GAGPO_LEARNER_SHARDING", "zero3")
    with pytest.raises(ValueError, match="GAGPO_LEARNER_SHARDING: one of \\('ddp', 'fsdp'\\), got 'zero3'"):
        _config(tiny_policy_path)


@pytest.mark.parametrize(("gpus", "learners", "runners"), [(2, 2, 2), (4, 4, 4), (1, 0, 1), (2, 1, 4)])
def test_colocated_plans_put_a_learner_and_an_engine_on_every_gpu(
    tiny_policy_path, gpus, learners, runners
) -> None:
    """One learner per GPU at most, the runners in what the learners leave, every share packs, the engines sleep
    during the update and their memory comes from the model, not a fixed slice."""
    c = _config(
        tiny_policy_path, num_gpus=gpus, num_learners=learners, num_env_runners=runners, colocate=True
    )
    learner, runner, valid = (
        c.num_gpus_per_learner,
        c.num_gpus_per_env_runner,
        c.evaluation_config["num_gpus_per_env_runner"],
    )
    assert learner > 0.5  # two learners can never share a GPU
    assert _packs(gpus, [learner] * max(1, learners) + [runner] * runners + [valid])
    if learners == gpus == runners:  # each GPU: exactly one learner and one training engine
        assert learner + runner + valid <= 1.0 + 1e-9 and 2 * runner + learner > 1.0 - valid
    assert c.sleep_engines_during_update is True and c.backend_kwargs["enable_sleep_mode"] is True
    assert c.evaluation_config["backend_kwargs"]["enable_sleep_mode"] is True
    assert transport_of(c) == "ipc"  # an engine beside each learner: its weights are shared, not copied
    with pytest.raises(ValueError, match="GAGPO_COLOCATE=1: one learner per GPU at most"):
        _config(
            tiny_policy_path, num_gpus=gpus, num_learners=gpus + 1, num_env_runners=runners, colocate=True
        )


def test_colocated_memory_fits_the_paper_models_and_names_what_does_not() -> None:
    """1.5B on 2 x 80 GB (DDP) and 7B on 4 x 80 GB (FSDP x4): learner state, both engines' weights and KV caches
    fit each GPU during the rollout, and the validation engine holds more than the weights (the fixed 0.15 slice of
    the separate plan held 11 GiB, less than 7B's 14.2 GiB); 7B replicated (DDP) does not fit and says so."""
    from gagpo_rllib.rllib.paper_setup import colocated_memory

    for params, learners, sharding in ((1_543_714_304, 2, "ddp"), (7_615_616_512, 4, "fsdp")):
        plan = colocated_memory(params, num_learners=learners, sharding=sharding, gpu_gib=74)
        assert plan.rollout_gib <= 74
        assert plan.valid_engine_share * 74 > plan.weights_gib + 1.0 and plan.valid_kv_gib >= 1.0
        assert plan.train_engine_share * 74 > plan.weights_gib + 4.0
    with pytest.raises(
        ValueError, match=r"7.62B model does not fit a 74 GiB GPU: learner state 127.7 GiB \(ddp"
    ):
        colocated_memory(7_615_616_512, num_learners=4, sharding="ddp", gpu_gib=74)


def test_the_parameter_count_comes_from_the_model_config(tiny_policy_path) -> None:
    from transformers import AutoModelForCausalLM

    from gagpo_rllib.rllib.paper_setup import model_param_count

    model = AutoModelForCausalLM.from_pretrained(tiny_policy_path)
    assert model_param_count(str(tiny_policy_path)) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="cannot read its config.json"):
        model_param_count(str(tiny_policy_path / "missing"))
