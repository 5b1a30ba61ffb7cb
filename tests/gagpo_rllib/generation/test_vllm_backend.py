"""The vLLM backend against the vLLM 0.33 stand-in (tests/fakes/vllm): sampled ids, log-probs, stops, seeds, sync.

The stand-in reproduces vLLM 0.33's behaviour at the API the backend uses (see its docstring), backed by the tiny
Hugging Face policy; these tests check the backend's use of that API, not vLLM's kernels.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from gagpo_rllib.generation import HFGenerationBackend, SamplingConfig, make_backend
from gagpo_rllib.generation.constraints import action_token_ids
from gagpo_rllib.generation.vllm import VLLMGenerationBackend
from gagpo_rllib.logprobs import action_logprobs
from gagpo_rllib.models import build_tiny_policy, load_policy
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


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_free_answers_are_the_sampled_ids_with_the_hf_models_logprobs(
    fake_vllm, tiny_policy_path: Path, temperature: float
) -> None:
    backend = _backend(tiny_policy_path)
    model, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok)
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=10)
    outs = backend.generate(prompts, sampling=cfg, seed=[3, 4, 5])
    # What the engine returned, request by request, with the same per-request seeds.
    params = [backend._params(cfg, s, 10, None) for s in (3, 4, 5)]
    raw = backend.llm.generate(
        [fake_vllm.TokensPrompt(prompt_token_ids=o.prompt_ids) for o in outs], params, use_tqdm=False
    )
    for p, o, r in zip(prompts, outs, raw, strict=True):
        assert o.action_ids == list(r.outputs[0].token_ids) and o.text == r.outputs[0].text
        assert o.prompt_ids == tok(p, add_special_tokens=False)["input_ids"]
        assert o.finished == (r.outputs[0].finish_reason == "stop")
    for got, want in zip(
        [o.logprobs for o in outs], _hf_logprobs(model, outs, tok, temperature), strict=True
    ):
        assert got == pytest.approx(want, abs=1e-5)


def test_the_models_own_end_token_is_kept_and_nothing_is_appended(
    fake_vllm, tiny_policy_path: Path, tmp_path: Path
) -> None:
    model, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok, 1)
    cfg = SamplingConfig(max_new_tokens=10)
    plain = _backend(tiny_policy_path).generate(prompts, sampling=cfg, seed=[7])[0]
    stop = plain.action_ids[1]
    assert stop != tok.eos_token_id and stop not in plain.action_ids[:1]
    # A chat model whose generation config ends a turn with another token than the tokenizer's eos.
    folder = tmp_path / "chat"
    shutil.copytree(tiny_policy_path, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen["eos_token_id"] = [tok.eos_token_id, stop]
    (folder / "generation_config.json").write_text(json.dumps(gen))
    out = _backend(folder).generate(prompts, sampling=cfg, seed=[7])[0]
    assert out.action_ids == plain.action_ids[:2] and out.finished
    assert all(math.isfinite(x) for x in out.logprobs)
    assert out.logprobs == pytest.approx(plain.logprobs[:2], abs=1e-6)


def test_constrained_answers_are_admissible_in_the_canonical_tokens(
    fake_vllm, tiny_policy_path: Path
) -> None:
    backend = _backend(tiny_policy_path)
    model, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok)
    cfg = SamplingConfig(constrained=True, max_new_tokens=8)
    free_logp = None
    for seed in range(3):
        outs = backend.generate(prompts, sampling=cfg, admissible=ADMISSIBLE, seed=seed)
        for acts, o in zip(ADMISSIBLE, outs, strict=True):
            assert o.finished and o.text in acts
            assert o.action_ids == action_token_ids(tok, [o.text])[0]
            if not all(math.isnan(x) for x in o.logprobs):
                # the grammar only removes competitors, so each kept token is at least as likely as unmasked
                free_logp = _hf_logprobs(model, [o], tok, 1.0)[0]
                assert all(x <= 1e-6 for x in o.logprobs)
                assert all(g >= f - 1e-5 for g, f in zip(o.logprobs, free_logp, strict=True))
    assert free_logp is not None  # at least one answer was sampled in its canonical spelling
    assert backend.noncanonical_answers > 0  # and the stand-in's grammar allowed other spellings too


def test_a_row_depends_only_on_its_own_seed(fake_vllm, tiny_policy_path: Path) -> None:
    backend = _backend(tiny_policy_path)
    prompts = _prompts(backend.tokenizer)
    cfg = SamplingConfig(max_new_tokens=6)
    both = backend.generate(prompts[:2], sampling=cfg, seed=[11, 12])
    alone = backend.generate(prompts[1:2], sampling=cfg, seed=[12])
    assert alone[0].action_ids == both[1].action_ids
    assert backend.generate(prompts[:2], sampling=cfg, seed=5) == backend.generate(
        prompts[:2], sampling=cfg, seed=5
    )
    # an int seed is mixed with the request index: the same prompt twice gives two draws
    twice = backend.generate([prompts[0]] * 2, sampling=cfg, seed=5)
    assert twice[0].action_ids != twice[1].action_ids
    with pytest.raises(ValueError, match="seed"):
        backend.generate(prompts, sampling=cfg, seed=[1, 2])


def test_weights_reach_the_in_process_engine_and_the_prefix_cache_is_dropped(
    fake_vllm, tiny_policy_path: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    backend = _backend(tiny_policy_path)
    assert torch.get_num_threads() == 2 and torch.equal(torch.rand(3), expected)  # caller state restored
    other, tok = load_policy(build_tiny_policy(tmp_path / "other", seed=5))
    prompts = _prompts(tok, 2)
    cfg = SamplingConfig(max_new_tokens=4)
    backend.generate(prompts, sampling=cfg, seed=1)  # fills the prefix cache with the old weights
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    backend.update_weights(other.state_dict())
    assert torch.equal(torch.rand(3), expected)
    for name, weight in backend.llm.weights():
        assert torch.equal(weight, other.state_dict()[name]), name
    outs = backend.generate(prompts, sampling=cfg, seed=1)
    for got, want in zip([o.logprobs for o in outs], _hf_logprobs(other, outs, tok, 1.0), strict=True):
        assert got == pytest.approx(want, abs=1e-5)  # no stale cached prompt of the old weights
    # numpy arrays (as RLlib ships them) are accepted too, converted to the engine's dtype
    backend.update_weights({k: v.numpy() * 0 for k, v in other.state_dict().items()})
    assert all(not w.any() for _, w in backend.llm.weights())
    with pytest.raises(KeyError):
        backend.update_weights({"not.a.weight": torch.zeros(1)})


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


def test_temperatures_outside_vllms_range_are_refused(fake_vllm, tiny_policy_path: Path) -> None:
    backend = _backend(tiny_policy_path)
    prompts = _prompts(backend.tokenizer, 1)
    for t in (2.5, 0.005):
        with pytest.raises(ValueError, match="temperature"):
            backend.generate(prompts, sampling=SamplingConfig(temperature=t), seed=0)


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_constrained_budget_widens_to_the_longest_action(
    fake_vllm, tiny_policy_path: Path, kind: str
) -> None:
    long_action = "take the small brass key from the wooden table"
    backend = HFGenerationBackend(tiny_policy_path) if kind == "hf" else _backend(tiny_policy_path)
    tok = backend.tokenizer
    need = len(action_token_ids(tok, [long_action])[0])
    cfg = SamplingConfig(constrained=True, max_new_tokens=3)
    assert need > cfg.max_new_tokens
    outs = backend.generate(
        _prompts(tok, 2), sampling=cfg, admissible=[[long_action], [long_action, "look"]], seed=1
    )
    assert outs[0].finished and outs[0].text == long_action and len(outs[0].action_ids) == need
    assert backend.budget_widenings == 1
