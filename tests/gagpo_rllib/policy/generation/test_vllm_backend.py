"""The vLLM backend where vLLM's CPU build cannot show it: GPU sleep levels and the multiprocess engine's RPC
encoding, on the vLLM 0.33 stand-in (tests/fakes/vllm); plus what needs no engine at all.

Log-probs, stops, constraints, seeds and weight sync run on the real engine (test_vllm_engine*.py).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gagpo_rllib.policy.generation import SamplingConfig, make_backend
from gagpo_rllib.policy.generation.base import action_token_ids
from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.models import load_policy
from tests.fakes.vllm_path import fake_vllm_on_path

ADMISSIBLE = [["go north", "go south", "take key"], ["open door", "go"], ["look"]]


@pytest.fixture
def fake_vllm():
    with fake_vllm_on_path() as vllm:
        yield vllm


def _backend(path: Path, **kw) -> VLLMGenerationBackend:
    return make_backend("vllm", path, device="cpu", max_model_len=kw.pop("max_model_len", 512), **kw)


def _prompts(tok, n: int = 3) -> list[str]:
    msgs = [f"You are in room {i}. " * (1 + 3 * i) for i in range(n)]
    return [
        tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)
        for m in msgs
    ]


def _hf_logprobs(model, outs, tok, temperature: float) -> list[list[float]]:
    logp, mask, _ = action_logprobs(
        model,
        [o.prompt_ids for o in outs],
        [o.action_ids for o in outs],
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
    )
    return [logp[b, : int(mask[b].sum())].tolist() for b in range(len(outs))]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_gives_a_clear_error(tiny_policy_path: Path) -> None:
    with pytest.raises(ImportError, match=r"gagpo-rllib\[vllm\]"):
        make_backend("vllm", tiny_policy_path)


def test_constrained_answers_map_to_the_canonical_tokenisation(tiny_policy_path: Path) -> None:
    backend = object.__new__(VLLMGenerationBackend)  # no engine: only the pure mapping is exercised
    backend.tokenizer = AutoTokenizer.from_pretrained(tiny_policy_path)
    tok = backend.tokenizer
    canonical = action_token_ids(tok, ["go north"])[0]
    ids, lps, text = backend._canonical(["go north", "look"], canonical, [-0.5] * len(canonical), "go north")
    assert (ids, lps, text) == (canonical, [-0.5] * len(canonical), "go north")
    other = [tok.convert_tokens_to_ids(c) for c in "go"] + canonical[1:]  # a non-canonical spelling
    ids, lps, text = backend._canonical(["go north"], other, [-0.1] * len(other), "go north")
    assert ids == canonical and all(math.isnan(x) for x in lps) and len(lps) == len(ids)
    assert backend.noncanonical_answers == 1
    assert not VLLMGenerationBackend.exact_logprobs_constrained


def test_the_multiprocess_engine_refuses_weights_in_rpc_arguments(
    fake_vllm, tiny_policy_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        _backend(tiny_policy_path)
    llm = fake_vllm.LLM(str(tiny_policy_path))  # the stand-in reproduces why: the engine runs elsewhere
    weights = list(llm.worker.model.state_dict().items())
    with pytest.raises(TypeError, match="not serializable"):
        llm.collective_rpc(lambda worker: None)
    with pytest.raises(AttributeError, match="list"):  # tensors arrive as [dtype, shape, index]
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})


def test_sleeping_engines_wake_for_the_weight_update(fake_vllm, tiny_policy_path: Path) -> None:
    backend = _backend(tiny_policy_path, enable_sleep_mode=True)
    model, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok, 1)
    cfg = SamplingConfig(max_new_tokens=4)
    for level in (1, 2):
        backend.sleep(level)
        with pytest.raises(RuntimeError, match="asleep"):
            backend.generate(prompts, sampling=cfg, seed=0)
        backend.update_weights(model.state_dict())
        outs = backend.generate(prompts, sampling=cfg, seed=0)
        assert outs[0].logprobs == pytest.approx(_hf_logprobs(model, outs, tok, 1.0)[0], abs=1e-5)
    backend.sleep(1)
    backend.wake_up()
    assert backend.generate(prompts, sampling=cfg, seed=0) == outs


def test_an_engine_folder_of_a_process_that_is_gone_is_removed_by_the_next(
    monkeypatch, tmp_path: Path
) -> None:
    """A killed Ray actor runs no exit hook: the next engine files folder made removes its orphan, and only it."""
    import os
    import subprocess
    import sys
    import tempfile

    from gagpo_rllib.policy.generation import vllm as vllm_backend

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in (vllm_backend.FILES_ENV, *vllm_backend._FILE_ENVS):
        monkeypatch.setenv(name, "")  # recorded, so what engine_files_dir sets is undone after the test
        monkeypatch.delenv(name)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan = tmp_path / f"gagpo-vllm-{int(gone.stdout)}-abc"
    (orphan / "tmp").mkdir(parents=True)
    kept = [tmp_path / f"gagpo-vllm-{os.getppid()}-def", tmp_path / "gagpo-vllm-old", tmp_path / "other-1-x"]
    for path in kept:
        path.mkdir()
    root = vllm_backend.engine_files_dir()
    assert not orphan.exists() and all(path.is_dir() for path in kept)
    assert root.parent == tmp_path and root.name.startswith(f"gagpo-vllm-{os.getpid()}-")
    assert vllm_backend.remove_orphaned_files_dirs() == []  # this process's own folder stays


def test_without_a_chosen_folder_the_compile_caches_outlive_the_process(
    monkeypatch, caplog, tmp_path: Path
) -> None:
    """What an engine compiled is found again by the next process's engine (vLLM's and inductor's caches in the
    user's cache folder); sockets and temporary files stay in the process's folder. A chosen folder holds all."""
    import logging
    import os
    import tempfile

    from gagpo_rllib.policy.generation import vllm as vllm_backend

    def fresh_process_env() -> None:
        for name in (vllm_backend.FILES_ENV, *vllm_backend._FILE_ENVS):
            monkeypatch.setenv(name, "")  # recorded, so what engine_files_dir sets is undone after the test
            monkeypatch.delenv(name)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fresh_process_env()
    root = vllm_backend.engine_files_dir()
    caches = tmp_path / "cache" / "gagpo_rllib" / "vllm"
    assert vllm_backend.compile_cache_dir() == caches
    assert Path(os.environ["VLLM_CACHE_ROOT"]) == caches / "vllm-cache"
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == caches / "inductor"
    assert Path(os.environ["VLLM_RPC_BASE_PATH"]) == root / "rpc" and root.parent == tmp_path / "tmp"

    fresh_process_env()
    chosen = vllm_backend.engine_files_dir(tmp_path / "chosen")
    assert chosen == (tmp_path / "chosen").resolve()
    assert {Path(os.environ[name]).parent for name in vllm_backend._FILE_ENVS} == {chosen}

    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not_a_folder"))
    fresh_process_env()
    with caplog.at_level(logging.WARNING, logger=vllm_backend.__name__):
        root = vllm_backend.engine_files_dir()
    assert Path(os.environ["VLLM_CACHE_ROOT"]) == root / "vllm-cache"
    assert "cannot create" in caplog.text and "not_a_folder" in caplog.text
