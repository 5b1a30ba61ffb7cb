"""The vLLM backend's CPU-checkable parts: a clear error without vllm, and the canonical constrained mapping."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gagpo_rllib.generation import make_backend
from gagpo_rllib.generation.constraints import action_token_ids
from gagpo_rllib.generation.vllm import VLLMGenerationBackend


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
    assert not VLLMGenerationBackend.exact_logprobs_constrained
