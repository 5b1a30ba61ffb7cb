"""Shared fixtures: a tiny random-init policy built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagpo_rllib.models import build_tiny_policy


@pytest.fixture(scope="session")
def tiny_policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2-style policy (random weights, locally trained BPE tokenizer) in a session tmp folder."""
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_policy"), seed=0)
