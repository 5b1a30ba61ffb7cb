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
