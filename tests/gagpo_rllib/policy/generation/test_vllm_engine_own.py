"""The vLLM backend on the real engine (vLLM's CPU build), each test with an engine of its own: an untied model's
weight sync, and what building an in-process engine leaves in the host process.

One engine at a time: in-process engines share vLLM's process-wide state (see ``VLLMGenerationBackend.close``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gagpo_rllib.policy.generation import SamplingConfig, make_backend
from gagpo_rllib.policy.models import load_policy
from tests.gagpo_rllib.policy.generation.test_vllm_engine import MAX_MODEL_LEN, _build, _check_three_updates

pytestmark = pytest.mark.vllm_engine


@pytest.fixture(scope="module")
def tied_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("tied256"), tied=True)


def test_three_updates_reach_an_untied_model(real_vllm, tmp_path: Path) -> None:
    path = _build(tmp_path / "untied", tied=False)
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is False
    backend = make_backend("vllm", path, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0)
    try:
        _check_three_updates(backend, path)
    finally:
        backend.close()


def test_the_host_process_keeps_its_rng_threads_and_folders(
    real_vllm, tied_path: Path, vllm_files: Path
) -> None:
    torch.set_num_threads(2)
    set_num_threads = torch.set_num_threads
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(11)
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(11)
    host_tmp, host_tmpdir = tempfile.gettempdir(), os.environ.get("TMPDIR")
    backend = make_backend("vllm", tied_path, dtype="float32", max_model_len=256, seed=5)
    try:
        backend.update_weights(load_policy(tied_path)[0].state_dict())
        backend.generate(
            ["<|im_start|>user\nhello<|im_end|>\n"], sampling=SamplingConfig(max_new_tokens=3), seed=1
        )
        assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
        assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1  # still a working function, not vLLM's no-op
    finally:
        torch.set_num_threads(2)
        backend.close()
    # the host's temporary folder is its own again (Ray, for one, puts its sockets there) ...
    assert (tempfile.gettempdir(), os.environ.get("TMPDIR")) == (host_tmp, host_tmpdir)
    # ... and the engine's caches went to the session's folder (removed at the session's end)
    root = vllm_files.resolve()
    assert backend.files_dir == root
    assert Path(os.environ["VLLM_CACHE_ROOT"]).resolve() == root / "vllm-cache"
    assert root in Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).resolve().parents  # not torch's /tmp default
    assert any((root / "vllm-cache").iterdir()) and (root / "tmp").is_dir()
    # On CPU what it compiled is in inductor's cache, where the next process's engine loads it (the CPU build's own
    # AOT artifacts, kept under vllm-cache, fail to load: every start would compile again).
    if backend.cpu_engine:
        assert any((root / "inductor" / "fxgraph").rglob("*")), "the engine compiled outside inductor's cache"
