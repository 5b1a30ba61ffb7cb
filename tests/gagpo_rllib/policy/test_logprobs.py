"""Learner log-probs: they reproduce the rollout backend's behaviour log-probs (ratio 1) on left-padded batches."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gagpo_rllib.policy.generation import HFGenerationBackend, SamplingConfig, allowed_token_masks
from gagpo_rllib.policy.generation.base import action_token_ids
from gagpo_rllib.policy.logprobs import action_logprobs, scaled_logprobs

ADMISSIBLE = [["go north", "go south", "take the key"], ["open door", "go"], ["look", "inventory"], ["wait"]]


@pytest.fixture(scope="module")
def backend(tiny_policy_path: Path) -> HFGenerationBackend:
    return HFGenerationBackend(tiny_policy_path)


def _prompts(tok) -> list[str]:
    # very different lengths, so the batch is heavily left-padded
    msgs = [
        "hi",
        "You are in the hall. " * 6,
        "Task: find the key. Exits: north, east. " * 5,
        "a b c d e f g h",
    ]
    return [
        tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)
        for m in msgs
    ]


def _old(outs, like: torch.Tensor) -> torch.Tensor:
    old = torch.zeros_like(like)
    for b, o in enumerate(outs):
        old[b, : len(o.logprobs)] = torch.tensor(o.logprobs)
    return old


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("constrained", [False, True])
def test_ratio_is_one_on_left_padded_batches(
    backend: HFGenerationBackend, constrained: bool, temperature: float
) -> None:
    tok = backend.tokenizer
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=12, constrained=constrained)
    outs = backend.generate(_prompts(tok), sampling=cfg, admissible=ADMISSIBLE, seed=11)
    assert len({len(o.prompt_ids) for o in outs}) == len(outs)
    masks = None
    if constrained:
        vocab = backend.model.config.vocab_size
        masks = [
            allowed_token_masks(tok, a, o.action_ids, vocab) for a, o in zip(ADMISSIBLE, outs, strict=True)
        ]
    logp, mask, _ = action_logprobs(
        backend.model,
        [o.prompt_ids for o in outs],
        [o.action_ids for o in outs],
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        allowed_masks=masks,
    )
    old = _old(outs, logp)
    assert mask.sum(1).tolist() == [len(o.action_ids) for o in outs]
    ratio = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), ratio
    assert torch.allclose(logp * mask, old, atol=1e-4)


def test_unconstrained_logprobs_differ_from_constrained(backend: HFGenerationBackend) -> None:
    """Guards the test above: forgetting the masks on the learner side must break the ratio."""
    tok = backend.tokenizer
    outs = backend.generate(
        _prompts(tok), sampling=SamplingConfig(constrained=True), admissible=ADMISSIBLE, seed=2
    )
    logp, _, _ = action_logprobs(
        backend.model,
        [o.prompt_ids for o in outs],
        [o.action_ids for o in outs],
        pad_token_id=tok.pad_token_id,
    )
    assert (logp - _old(outs, logp)).abs().max() > 0.1


def test_constrained_probabilities_sum_to_one(backend: HFGenerationBackend) -> None:
    tok = backend.tokenizer
    acts = ADMISSIBLE[0] + ["go"]  # "go" is a prefix of two others
    prompt = tok(_prompts(tok)[1], add_special_tokens=False)["input_ids"]
    seqs = action_token_ids(tok, acts)
    vocab = backend.model.config.vocab_size
    masks = [allowed_token_masks(tok, acts, s, vocab) for s in seqs]
    logp, mask, ent = action_logprobs(
        backend.model,
        [prompt] * len(seqs),
        seqs,
        pad_token_id=tok.pad_token_id,
        allowed_masks=masks,
        with_entropy=True,
    )
    total = logp.sum(1).exp().sum().item()
    assert total == pytest.approx(1.0, abs=1e-5)
    assert ((ent >= -1e-6) & (ent <= math.log(len(acts)) + 1e-5)).all()


def test_matches_a_plain_forward_and_is_padding_invariant(backend: HFGenerationBackend) -> None:
    model, tok = backend.model, backend.tokenizer
    short = tok("go north", add_special_tokens=False)["input_ids"]
    long = tok("You are in the hall. " * 8, add_special_tokens=False)["input_ids"]
    action = tok(" take the key", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([short + action])).logits[0].float(), -1)
    want = torch.stack([full[len(short) - 1 + k, t] for k, t in enumerate(action)])
    alone, _, _ = action_logprobs(model, [short], [action], pad_token_id=tok.pad_token_id)
    batch, mask, _ = action_logprobs(
        model, [long, short], [action[:2], action], pad_token_id=tok.pad_token_id
    )
    assert torch.allclose(alone[0], want, atol=1e-5)
    assert torch.allclose(batch[1], want, atol=1e-5)
    assert mask[0].tolist() == [1.0, 1.0] + [0.0] * (len(action) - 2)
    assert (batch[0, 2:] == 0).all()


def test_gradients_flow(backend: HFGenerationBackend) -> None:
    model, tok = backend.model, backend.tokenizer
    logp, mask, ent = action_logprobs(
        model, [[5, 6, 7]], [[8, 9]], pad_token_id=tok.pad_token_id, with_entropy=True
    )
    (logp.sum() + ent.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_bad_inputs_name_the_field(backend: HFGenerationBackend) -> None:
    model, pad = backend.model, backend.tokenizer.pad_token_id
    with pytest.raises(ValueError, match="differ in length"):
        action_logprobs(model, [[1]], [[2], [3]], pad_token_id=pad)
    with pytest.raises(ValueError, match=r"action_ids\[0\]"):
        action_logprobs(model, [[1]], [[]], pad_token_id=pad)
    with pytest.raises(ValueError, match=r"allowed_masks\[0\]"):
        action_logprobs(
            model, [[1]], [[2, 3]], pad_token_id=pad, allowed_masks=[torch.ones(1, 4, dtype=torch.bool)]
        )


def test_scaled_logprobs_match_a_direct_computation() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 3
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    allowed = torch.rand(3, 5, 11, generator=gen) > 0.5
    allowed.scatter_(-1, tokens.unsqueeze(-1), True)
    allowed[2, 4] = False  # a padding row: treated as unconstrained
    logp, ent = scaled_logprobs(logits, tokens, temperature=0.7, allowed=allowed, with_entropy=True)
    for b in range(3):
        for k in range(5):
            row = logits[b, k] / 0.7
            keep = allowed[b, k] if allowed[b, k].any() else torch.ones(11, dtype=torch.bool)
            sub = torch.log_softmax(row[keep], -1)
            pos = keep[: tokens[b, k]].sum()
            assert logp[b, k].item() == pytest.approx(sub[pos].item(), abs=1e-5)
            assert ent[b, k].item() == pytest.approx(-(sub.exp() * sub).sum().item(), abs=1e-5)
    plain, none = scaled_logprobs(logits, tokens)
    assert none is None
    assert torch.allclose(
        plain, torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1), atol=1e-5
    )


@pytest.mark.parametrize("constrained", [False, True])
def test_shared_prompt_forward_equals_the_per_row_forward_with_its_gradient(
    backend: HFGenerationBackend, constrained: bool
) -> None:
    from gagpo_rllib.policy.logprobs import shared_prompt_logprobs

    tok, model = backend.tokenizer, backend.model
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok)[:3]]
    # one state, several actions of different lengths: rows 0, 2 and 4 share prompt 0, rows 1 and 3 prompt 1
    prompt_of = [0, 1, 0, 1, 0, 2]
    adm = [ADMISSIBLE[j] for j in prompt_of]
    actions = [action_token_ids(tok, a)[k] for a, k in zip(adm, [0, 0, 2, 1, 1, 1], strict=True)]
    masks = None
    if constrained:
        masks = [
            allowed_token_masks(tok, a, act, model.config.vocab_size)
            for a, act in zip(adm, actions, strict=True)
        ]
    kw = dict(pad_token_id=tok.pad_token_id, temperature=0.7, allowed_masks=masks, with_entropy=True)
    model.train()
    try:
        shared = shared_prompt_logprobs(model, prompts, prompt_of, actions, **kw)
        plain = action_logprobs(model, [prompts[j] for j in prompt_of], actions, **kw)
    finally:
        model.eval()
    for a, b in zip(shared, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    weights = torch.linspace(-1.0, 1.5, len(actions)).unsqueeze(1)
    params = [p for p in model.parameters() if p.requires_grad]
    g_shared = torch.autograd.grad((shared[0] * weights).sum() + shared[2].sum(), params)
    g_plain = torch.autograd.grad((plain[0] * weights).sum() + plain[2].sum(), params)
    for a, b in zip(g_shared, g_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prompt_forward_runs_the_last_mlp_on_one_prompt_token_per_row(
    backend: HFGenerationBackend,
) -> None:
    """Only the last prompt token and the action tokens reach the last layer's MLP; the other prompt positions
    contribute their keys and values only, and the log-probs and gradients stay those of the plain forward."""
    from gagpo_rllib.policy.logprobs import shared_prompt_logprobs

    tok, model = backend.tokenizer, backend.model
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok)] + [
        [tok.pad_token_id + 1]
    ]
    prompt_of = [0, 1, 2, 3, 4, 1]
    actions = [
        action_token_ids(tok, ["go north", "open door", "look", "wait", "go", "go"])[k] for k in range(6)
    ]
    seen: dict[str, int] = {}

    def count(name: str):
        def hook(module, args, output) -> None:
            seen[name] = seen.get(name, 0) + int(args[0].shape[0] * args[0].shape[1])

        return hook

    layers = model.model.layers
    handles = [
        layers[-1].mlp.register_forward_hook(count("last")),
        layers[0].mlp.register_forward_hook(count("first")),
    ]
    kw = dict(pad_token_id=tok.pad_token_id, temperature=0.8, with_entropy=True)
    try:
        shared = shared_prompt_logprobs(model, prompts, prompt_of, actions, **kw)
    finally:
        for h in handles:
            h.remove()
    width = max(len(p) for p in prompts)
    alen = max(len(a) for a in actions)
    assert seen["last"] == len(actions) * alen  # per row: its last prompt token and alen - 1 action tokens
    assert seen["first"] == len(prompts) * (width - 1) + len(actions) * alen
    assert isinstance(layers[-1].mlp, type(layers[0].mlp))  # the MLP is back after the forward
    plain = action_logprobs(model, [prompts[j] for j in prompt_of], actions, **kw)
    for a, b in zip(shared, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    params = [p for p in model.parameters() if p.requires_grad]
    g_shared = torch.autograd.grad(shared[0].sum() + shared[2].sum(), params)
    g_plain = torch.autograd.grad(plain[0].sum() + plain[2].sum(), params)
    for a, b in zip(g_shared, g_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _direct_scores(hidden, weight, targets, allowed, temperature):
    """The definition: full [N, V] logits, log-softmax over the allowed words, entropy of that distribution."""
    x = (hidden @ weight.t()) / temperature
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    logp_all = torch.log_softmax(x, -1)
    p = logp_all.exp()
    entropy = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sliced_token_scores_equal_the_full_logits_with_their_gradients(
    constrained: bool, temperature: float
):
    from gagpo_rllib.policy.logprobs import token_scores

    torch.manual_seed(0)
    n, hidden_size, vocab = 37, 16, 301
    hidden = torch.randn(n, hidden_size, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (n,))
    allowed = None
    if constrained:
        allowed = torch.rand(n, vocab) < 0.1
        allowed[torch.arange(n), targets] = True
    g_logp, g_ent = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    want = _direct_scores(hidden, weight, targets, allowed, temperature)
    torch.autograd.backward(want, (g_logp, g_ent))
    want_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got = token_scores(
        hidden,
        weight,
        targets=targets,
        allowed=allowed,
        temperature=temperature,
        with_entropy=True,
        slice_tokens=5,
    )
    # float32 inside: values to float32 rounding, gradients to ~1e-6 relative
    torch.testing.assert_close(got[0].double(), want[0].detach(), atol=2e-5, rtol=0)
    torch.testing.assert_close(got[1].double(), want[1].detach(), atol=2e-5, rtol=0)
    torch.autograd.backward(got, (g_logp.float(), g_ent.float()))
    for ours, theirs in zip((hidden.grad, weight.grad), want_grads, strict=True):
        assert float((ours - theirs).norm() / theirs.norm()) < 1e-5


@pytest.mark.parametrize("autocast", [False, True])
def test_token_scores_hold_at_most_two_slices_of_vocabulary_logits(autocast: bool):
    """Forward and backward with entropy keep at most 2x one slice's float32 logits of [tokens, V] tensors alive,
    whatever the number of tokens (the old path held 5-10x the whole chunk's logits)."""
    from benchmarks.bench_learner import VocabPeak
    from gagpo_rllib.policy.logprobs import token_scores

    n, hidden_size, vocab, slice_tokens = 1000, 32, 4096, 128
    hidden = torch.randn(n, hidden_size, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, hidden_size)).requires_grad_(True)
    tracker = VocabPeak(vocab, hidden_size)
    with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp, ent = token_scores(
            hidden,
            weight,
            targets=torch.randint(0, vocab, (n,)),
            with_entropy=True,
            slice_tokens=slice_tokens,
        )
        (logp.sum() + ent.sum()).backward()
    assert tracker.peak > 0
    assert tracker.peak <= 2.0 * slice_tokens * vocab * 4


def test_packed_and_padded_layouts_give_the_same_logprobs_and_gradients(backend: HFGenerationBackend) -> None:
    tok = backend.tokenizer
    model = backend.model
    prompts = [tok(p)["input_ids"] for p in _prompts(tok)]
    actions = [[5, 9, 11], [7], [12, 13, 14, 15, 16], [8, 8]]
    out = {}
    for layout in ("rows", "varlen"):
        model.zero_grad()
        logp, mask, ent = action_logprobs(
            model, prompts, actions, pad_token_id=tok.pad_token_id, with_entropy=True, layout=layout
        )
        (logp.sum() + ent.sum()).backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        out[layout] = (logp.detach(), mask, ent.detach(), grad)
    model.zero_grad()
    rows, packed = out["rows"], out["varlen"]
    torch.testing.assert_close(rows[0], packed[0], atol=1e-5, rtol=0)
    assert torch.equal(rows[1], packed[1])
    torch.testing.assert_close(rows[2], packed[2], atol=1e-5, rtol=0)
    assert float((rows[3] - packed[3]).norm() / rows[3].norm()) < 1e-5
    with pytest.raises(ValueError, match="layout"):
        action_logprobs(model, prompts, actions, pad_token_id=tok.pad_token_id, layout="padded")
