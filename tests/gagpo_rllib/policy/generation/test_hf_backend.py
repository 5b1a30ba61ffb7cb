"""The Hugging Face generation backend: one batched call, exact behaviour log-probs, seeds, weight updates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gagpo_rllib.policy.generation import HFGenerationBackend, SamplingConfig, make_backend
from gagpo_rllib.policy.models import load_policy

ADMISSIBLE = [["go north", "go south", "take key"], ["open door", "go"], ["look"]]


@pytest.fixture(scope="module")
def backend(tiny_policy_path: Path) -> HFGenerationBackend:
    return HFGenerationBackend(tiny_policy_path)


def _prompts(tok, n: int = 3) -> list[str]:
    msgs = [f"You are in room {i}. " * (1 + 3 * i) for i in range(n)]
    return [
        tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)
        for m in msgs
    ]


def test_outputs_are_consistent(backend: HFGenerationBackend) -> None:
    tok = backend.tokenizer
    prompts = _prompts(tok)
    outs = backend.generate(prompts, sampling=SamplingConfig(max_new_tokens=8), seed=0)
    assert len(outs) == len(prompts)
    for prompt, o in zip(prompts, outs, strict=True):
        assert o.prompt_ids == tok(prompt, add_special_tokens=False)["input_ids"]
        assert 1 <= len(o.action_ids) <= 8 and len(o.logprobs) == len(o.action_ids)
        assert all(lp <= 0 and math.isfinite(lp) for lp in o.logprobs)
        assert o.finished == (o.action_ids[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in o.action_ids[:-1]
        assert o.text == tok.decode(o.action_ids, skip_special_tokens=True)


def test_constrained_outputs_are_admissible(backend: HFGenerationBackend) -> None:
    prompts = _prompts(backend.tokenizer)
    for seed in range(4):
        outs = backend.generate(
            prompts, sampling=SamplingConfig(constrained=True), admissible=ADMISSIBLE, seed=seed
        )
        for acts, o in zip(ADMISSIBLE, outs, strict=True):
            assert o.finished and o.text in acts
    # a single admissible action is certain
    assert outs[2].logprobs == pytest.approx([0.0] * len(outs[2].logprobs), abs=1e-6)


def test_seeds_reproduce_and_isolate_the_global_rng(backend: HFGenerationBackend) -> None:
    prompts = _prompts(backend.tokenizer)
    cfg = SamplingConfig(max_new_tokens=6)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = backend.generate(prompts, sampling=cfg, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)  # the seeded call did not consume the global stream
    b = backend.generate(prompts, sampling=cfg, seed=7)
    assert [o.action_ids for o in a] == [o.action_ids for o in b]
    others = {
        tuple(o.action_ids) for s in range(8) for o in backend.generate(prompts[:1], sampling=cfg, seed=s)
    }
    assert len(others) > 1


def test_model_generation_defaults_do_not_leak(tiny_policy_path: Path) -> None:
    model, tok = load_policy(tiny_policy_path)
    model.generation_config.top_k = 1  # greedy if it were honoured
    model.generation_config.do_sample = False
    backend = HFGenerationBackend((model, tok))
    prompts = _prompts(tok, 1)
    firsts = {
        backend.generate(prompts, sampling=SamplingConfig(max_new_tokens=1), seed=s)[0].action_ids[0]
        for s in range(12)
    }
    assert len(firsts) > 1
    assert model.generation_config.top_k == 1  # restored after the call


def test_update_weights_changes_the_policy(tiny_policy_path: Path, tmp_path: Path) -> None:
    from gagpo_rllib.policy.models import build_tiny_policy

    other_path = build_tiny_policy(tmp_path / "other", seed=5)
    backend = HFGenerationBackend(tiny_policy_path)
    reference = HFGenerationBackend(other_path)
    prompts = _prompts(backend.tokenizer)
    cfg = SamplingConfig(max_new_tokens=5)
    assert backend.generate(prompts, sampling=cfg, seed=3) != reference.generate(
        prompts, sampling=cfg, seed=3
    )
    backend.update_weights(reference.model.state_dict())
    backend.reset_cache()
    got = backend.generate(prompts, sampling=cfg, seed=3)
    want = reference.generate(prompts, sampling=cfg, seed=3)
    assert [o.action_ids for o in got] == [o.action_ids for o in want]
    with pytest.raises(ValueError, match="state_dict"):
        backend.update_weights({"not.a.weight": torch.zeros(1)})


def test_bad_arguments_name_the_field(backend: HFGenerationBackend) -> None:
    prompts = _prompts(backend.tokenizer, 2)
    with pytest.raises(ValueError, match="admissible"):
        backend.generate(prompts, sampling=SamplingConfig(constrained=True))
    with pytest.raises(ValueError, match=r"admissible\[1\]"):
        backend.generate(prompts, sampling=SamplingConfig(constrained=True), admissible=[["look"], []])
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="backend"):
        make_backend("tgi", "x")
    assert backend.generate([], sampling=SamplingConfig()) == []


def test_free_generation_also_stops_on_the_model_end_tokens(tiny_policy_path: Path) -> None:
    model, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok, 1)
    cfg = SamplingConfig(max_new_tokens=10)
    plain = HFGenerationBackend((model, tok)).generate(prompts, sampling=cfg, seed=4)[0]
    stop = plain.action_ids[2]
    assert stop not in plain.action_ids[:2] and not plain.finished
    model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    stopped = HFGenerationBackend((model, tok)).generate(prompts, sampling=cfg, seed=4)[0]
    assert stopped.action_ids == plain.action_ids[:3] and stopped.finished
    assert stopped.logprobs == pytest.approx(plain.logprobs[:3], abs=1e-6)


def test_a_row_depends_only_on_its_own_seed(backend: HFGenerationBackend) -> None:
    prompts = _prompts(backend.tokenizer)
    cfg = SamplingConfig(max_new_tokens=6)
    both = backend.generate(prompts, sampling=cfg, seed=[21, 22, 23])
    alone = backend.generate(prompts[1:2], sampling=cfg, seed=[22])
    assert alone[0].action_ids == both[1].action_ids and alone[0].logprobs == both[1].logprobs
    # an int seed is mixed with each row's index: the same prompt twice gives two draws
    twice = backend.generate([prompts[0]] * 2, sampling=cfg, seed=5)
    assert twice[0].action_ids != twice[1].action_ids
    with pytest.raises(ValueError, match="seed"):
        backend.generate(prompts, sampling=cfg, seed=[1, 2])
    with pytest.raises(ValueError, match=r"seed\[0\]"):
        backend.generate(prompts[:1], sampling=cfg, seed=[1.5])


def test_no_tensor_grows_with_batch_times_length_times_vocab(backend: HFGenerationBackend) -> None:
    """The loop keeps one [B, V] of logits at a time: no op output reaches B x T x V elements."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                # new memory only: views of the weights (e.g. the tied head's transpose) allocate nothing
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    tok = backend.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    ]
    bsz, steps, vocab = 4, 16, backend.model.config.vocab_size
    with Largest():
        outs = backend.generate(prompts * bsz, sampling=SamplingConfig(max_new_tokens=steps), seed=3)
    assert sum(len(o.action_ids) for o in outs) > bsz * steps // 2  # most rows ran long
    assert bsz * vocab <= Largest.numel < bsz * steps * vocab // 4


def test_draws_follow_the_stored_probabilities(backend: HFGenerationBackend) -> None:
    """The sampled frequencies match exp(log-prob): the stored log-probs are of the distribution sampled."""
    tok = backend.tokenizer
    acts = ["go north", "look", "take key"]
    n = 400
    outs = backend.generate(
        _prompts(tok, 1) * n,
        sampling=SamplingConfig(constrained=True, temperature=0.05),  # sharp enough to tell apart
        admissible=[acts] * n,
        seed=list(range(n)),
    )
    probs = {o.action_ids[0]: math.exp(o.logprobs[0]) for o in outs}
    assert len(probs) == 3 and sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
    assert max(probs.values()) > 0.5  # far from uniform, so a wrong sampler would show
    for first, p in probs.items():
        freq = sum(o.action_ids[0] == first for o in outs) / n
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / n) + 0.01, (first, freq, p)


# three distinct prompts four times each and one singleton, interleaved; the prompts differ in length
REPEATED_ORDER = [0, 1, 0, 2, 3, 1, 2, 0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("constrained", [False, True])
def test_repeated_prompts_give_each_row_what_it_gets_alone(
    backend: HFGenerationBackend, constrained: bool
) -> None:
    """Sharing the prefill changes no row: each matches a batch of one with the same seed."""
    distinct = _prompts(backend.tokenizer, 4)
    prompts = [distinct[i] for i in REPEATED_ORDER]
    seeds = [100 + b for b in range(len(prompts))]
    actions = ADMISSIBLE + [["go north", "look"]]
    admissible = (
        [actions[(i + b) % len(actions)] for b, i in enumerate(REPEATED_ORDER)] if constrained else None
    )
    cfg = SamplingConfig(constrained=constrained, max_new_tokens=6)
    batch = backend.generate(prompts, sampling=cfg, admissible=admissible, seed=seeds)
    assert len({tuple(o.action_ids) for o in batch}) > 3  # the copies of a prompt drew apart
    for b, o in enumerate(batch):
        alone = backend.generate(
            prompts[b : b + 1],
            sampling=cfg,
            admissible=None if admissible is None else admissible[b : b + 1],
            seed=seeds[b : b + 1],
        )[0]
        assert o.prompt_ids == alone.prompt_ids
        assert o.action_ids == alone.action_ids, b
        assert torch.allclose(torch.tensor(o.logprobs), torch.tensor(alone.logprobs), atol=1e-5), b
        assert (o.text, o.finished) == (alone.text, alone.finished)
        if constrained:
            assert o.finished and o.text in admissible[b]


def test_the_prefill_runs_once_per_distinct_prompt(
    backend: HFGenerationBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill (the prompts' cache, then their last tokens) sees only the distinct prompts; the cache is copied
    to rows only when some repeat."""
    from transformers import DynamicCache

    sizes: list[int] = []
    copies: list[int] = []
    reorder = DynamicCache.reorder_cache

    def counting_reorder(cache: DynamicCache, index: torch.Tensor) -> None:
        copies.append(index.numel())
        reorder(cache, index)

    monkeypatch.setattr(DynamicCache, "reorder_cache", counting_reorder)
    hook = backend.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        distinct = _prompts(backend.tokenizer, 4)
        cfg = SamplingConfig(max_new_tokens=4)
        backend.generate([distinct[i] for i in REPEATED_ORDER], sampling=cfg, seed=0)
        assert sizes[:2] == [4, 4] and len(sizes) > 2
        assert set(sizes[2:]) == {len(REPEATED_ORDER)}  # then every row decodes
        assert copies == [len(REPEATED_ORDER)]
        sizes.clear()
        copies.clear()
        backend.generate(distinct, sampling=cfg, seed=0)
        assert set(sizes) == {4} and copies == []  # all distinct: nothing to copy
    finally:
        hook.remove()


def test_a_forced_closing_token_takes_no_forward_and_keeps_its_exact_log_prob(
    backend: HFGenerationBackend,
) -> None:
    """Actions of equal length: after the last word only the end token is allowed, for every row at once."""
    from gagpo_rllib.policy.generation.base import action_token_ids, allowed_token_masks
    from gagpo_rllib.policy.logprobs import action_logprobs

    tok = backend.tokenizer
    acts = ["go north", "go south", "go east"]
    depth = {len(ids) for ids in action_token_ids(tok, acts)}
    assert len(depth) == 1  # the same number of tokens each, the end token last
    prompts = _prompts(tok)
    calls: list[int] = []
    hook = backend.model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    try:
        outs = backend.generate(
            prompts,
            sampling=SamplingConfig(max_new_tokens=8, constrained=True),
            admissible=[acts] * 3,
            seed=1,
        )
    finally:
        hook.remove()
    (n,) = depth
    # the prefill's two forwards (the prompts' cache, their last tokens) and one per chosen token before the
    # forced end token
    assert len(calls) == n
    for o in outs:
        assert o.finished and tok.decode(o.action_ids, skip_special_tokens=True) in acts
        assert o.action_ids[-1] == tok.eos_token_id and o.logprobs[-1] == 0.0
    masks = [allowed_token_masks(tok, acts, o.action_ids, backend.model.config.vocab_size) for o in outs]
    logp, _, _ = action_logprobs(
        backend.model,
        [o.prompt_ids for o in outs],
        [o.action_ids for o in outs],
        pad_token_id=tok.pad_token_id,
        allowed_masks=masks,
    )
    for i, o in enumerate(outs):  # the learner scores the forced token 0 as well: ratio exactly 1 there
        torch.testing.assert_close(logp[i, : len(o.logprobs)], torch.tensor(o.logprobs), atol=1e-5, rtol=0)


def test_requests_submitted_one_by_one_answer_as_one_batched_call(backend: HFGenerationBackend) -> None:
    """The base class's per-request path gathers what was submitted into one batched call per collect."""
    from gagpo_rllib.policy.generation.base import GenerationRequest

    prompts = _prompts(backend.tokenizer)
    cfg = SamplingConfig(max_new_tokens=6)
    batched = backend.generate(prompts, sampling=cfg, seed=[31, 32, 33])
    backend.submit([GenerationRequest(key=("a", 0), prompt=prompts[0], seed=31)], sampling=cfg)
    backend.submit(
        [GenerationRequest(key=("a", k), prompt=prompts[k], seed=31 + k) for k in (1, 2)], sampling=cfg
    )
    assert backend.in_flight() == 3
    answers = dict(backend.collect())
    assert backend.in_flight() == 0 and backend.collect() == []
    for k in range(3):
        assert answers[("a", k)].action_ids == batched[k].action_ids
        assert answers[("a", k)].logprobs == batched[k].logprobs
    request = GenerationRequest(key="x", prompt=prompts[0], seed=1)
    with pytest.raises(ValueError, match="already in flight"):
        backend.submit([request, request], sampling=cfg)
    backend.submit([request], sampling=cfg)
    with pytest.raises(ValueError, match="already in flight"):
        backend.submit([request], sampling=cfg)
    assert backend.abort() == 1 and backend.in_flight() == 0
