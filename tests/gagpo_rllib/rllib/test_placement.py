"""Placement checks: a config whose learners and EnvRunners do not fit the cluster fails before anything starts,
saying what was asked and what exists."""

from __future__ import annotations

import os

import pytest

from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.config import configure


def _config(**learners) -> GAGPOConfig:
    return (
        GAGPOConfig()
        .environment(MazeEnv, env_config={"split": "train"})
        .llm(model_path="/models/any")
        .gagpo(groups_per_iteration=2)
        .learners(**learners)
    )


def test_validation_says_what_was_asked_and_what_exists() -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = gpus + 1
    asked = rf"num_learners={n} x num_gpus_per_learner=1 .* asks for {n} GPUs; this machine has {gpus}"
    with pytest.raises(ValueError, match=asked):
        _config(num_learners=n, num_gpus_per_learner=1).gagpo(groups_per_iteration=n).validate()
    cores = os.cpu_count() or 1
    with pytest.raises(ValueError, match=rf"asks for {cores + 1} CPUs; this machine has {cores}"):
        _config().env_runners(num_env_runners=cores + 1).validate()


@pytest.fixture
def two_gpu_cluster():
    """A Ray cluster that declares 2 GPUs (logical: the placement arithmetic, not a device)."""
    import ray

    ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _gpu_config(**gagpo) -> GAGPOConfig:
    config = GAGPOConfig().environment(MazeEnv, env_config={"split": "train"})
    return configure(config, model_path="/models/any", groups_per_iteration=4, **gagpo)


def test_placement_checks_name_the_problem_before_anything_starts(two_gpu_cluster) -> None:
    from gagpo_rllib.rllib.evaluation import with_validation
    from gagpo_rllib.rllib.placement import gpu_placement_problem, resource_shortfall

    sharing = _gpu_config().learners(num_learners=2, num_gpus_per_learner=0.5)
    problem = gpu_placement_problem(sharing)
    assert "num_learners=2 with num_gpus_per_learner=0.5: NCCL needs a GPU per learner" in problem
    assert "set num_gpus_per_learner=1" in problem
    assert gpu_placement_problem(_gpu_config().learners(num_learners=2, num_gpus_per_learner=1)) is None
    # Over half a GPU each: never two learners on one device, EnvRunners beside them (the colocated plan).
    colocated = _gpu_config(backend="vllm").learners(num_learners=2, num_gpus_per_learner=0.51)
    colocated = colocated.env_runners(num_env_runners=2, num_gpus_per_env_runner=0.39)
    assert gpu_placement_problem(colocated) is None
    colocated.validate()

    too_many = _gpu_config().learners(num_learners=2, num_gpus_per_learner=1)
    too_many = too_many.env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    with pytest.raises(ValueError, match=r"asks for 3 GPUs; the Ray cluster has 2"):
        too_many.validate()

    vllm = _gpu_config(backend="vllm").env_runners(num_env_runners=1, num_gpus_per_env_runner=0.5)
    with pytest.raises(
        ValueError, match="num_gpus_per_env_runner=0 and backend 'vllm' on a cluster with 2 GPUs"
    ):
        _gpu_config(backend="vllm").env_runners(num_env_runners=1).validate()
    vllm.validate()
    # Evaluation runners count against the cluster and need a GPU share of their own with vLLM.
    assert gpu_placement_problem(with_validation(vllm, split="eval", interval=1)) is None  # inherits 0.5
    without = with_validation(vllm, split="eval", interval=1, num_gpus_per_env_runner=0)
    with pytest.raises(ValueError, match="evaluation_num_env_runners=1 with num_gpus_per_env_runner=0"):
        without.validate()
    with_validation(vllm, split="eval", interval=1, num_gpus_per_env_runner=0.2).validate()
    heavy = with_validation(vllm, split="eval", interval=1, num_env_runners=2, num_gpus_per_env_runner=1)
    assert "evaluation_num_env_runners=2 x 1 asks for 2.5 GPUs; the Ray cluster has 2" in resource_shortfall(
        heavy
    )
