"""The learner's compute, side by side in one run: real tokens/s against a plain forward + backward, padding, and
the vocabulary-side memory peak.

Rows are ALFWorld-like multi-turn steps (``--scale`` divides the lengths): groups of K rollouts, prompts that grow
with the history, answers of median ~110 tokens with a few at the 512 cap, first prompts shared by the group. Each
variant trains one minibatch (forward, loss, backward, Adam) on the same rows and model:

- ``plain``: a plain Hugging Face step, no RL: rows sorted by total length in chunks of the token budget, the LM
  head on answer positions only, cross-entropy, backward, Adam. The ceiling for the learner.
- ``before``: the previous learner layout: chunks budgeted by prompt tokens only, prompts left-padded and answers
  right-padded, the LM head on every answer column of the padded batch, float32 copies of [rows, answer, vocab].
- ``learner``: the learner's own path (``policy.logprobs.action_logprobs`` over ``unique_rows.token_chunks``, the
  loss ``method.loss.gagpo_policy_loss``), with the update's no-grad pass (old and reference log-probs) counted in
  its time (``--no-passes`` leaves it out: what runs with exact rollout log-probs and kl_coeff 0).

Printed per variant: real (answer + prompt) tokens/s and the ratio to ``plain``, padding share (padded / real
tokens - 1 over every forward), and the peak of live vocabulary-sized tensors (last dimension = vocabulary) over
one LM-head slice's float32 logits. On CUDA also peak memory and model FLOPs utilisation.

It needs torch and transformers only (no Ray): ``python benchmarks/bench_learner.py`` (CPU defaults, fp32 and
bf16), ``--model 1.5b --device cuda --dtype bfloat16 --scale 1`` for a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gagpo_rllib.method.loss import gagpo_policy_loss  # noqa: E402
from gagpo_rllib.policy.logprobs import action_logprobs, length_chunks, slice_tokens_for, token_chunks  # noqa: E402  # noqa: E402

# Qwen2 shapes (random init): a CPU-sized one with the real vocabulary, and the paper's.
SHAPES = {
    "cpu": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}
VOCAB = 151_936
# Dense bf16 peak of the GPU, for model FLOPs utilisation (H100/H200 SXM).
PEAK_FLOPS = {"bfloat16": 989e12, "float32": 67e12}


def make_rows(
    groups: int, k: int, steps: int, scale: float, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, answers) of ``groups`` x ``k`` episodes of ``steps`` turns, ALFWorld-like lengths / ``scale``."""
    rng = np.random.default_rng(seed)
    prompts, answers = [], []
    for _ in range(groups):
        first = rng.integers(5, VOCAB, size=int(700 / scale)).tolist()
        for _ in range(k):
            history: list[int] = []
            for t in range(steps):
                prompt = first + history[-int(600 / scale) :] if t else first
                n = int(min(512, max(8, rng.lognormal(math.log(110), 0.6))) / scale)
                answer = rng.integers(5, VOCAB, size=max(1, n)).tolist()
                prompts.append(prompt)
                answers.append(answer)
                history += answer + rng.integers(5, VOCAB, size=int(60 / scale)).tolist()
    return prompts, answers


class VocabPeak(TorchDispatchMode):
    """Tracks live tensors whose last dimension is the vocabulary (logits, their copies, masks, gradients); the
    LM head's weight and its casts ([V, hidden] storages, seen as their transposes) are not counted."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.vocab, self.hidden, self.live, self.peak, self.seen = vocab, hidden, 0, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab and t.dim() >= 2:
                key = t.untyped_storage().data_ptr()
                if t.untyped_storage().nbytes() == self.vocab * self.hidden * t.element_size():
                    continue
                if key not in self.seen:
                    nbytes = t.untyped_storage().nbytes()
                    self.seen[key] = nbytes
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t.untyped_storage(), self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)


def plain_step(model, prompts, answers, budget: int) -> int:
    """A plain step: sorted chunks of the token budget, LM head on answer positions, cross-entropy."""
    padded = 0
    n_answer = sum(len(a) for a in answers)
    chunks = token_chunks([(1, len(p) + len(a)) for p, a in zip(prompts, answers, strict=True)], budget)
    device = next(model.parameters()).device
    for chunk in chunks:
        rows = [prompts[i] + answers[i] for i in chunk]
        width = max(len(r) for r in rows)
        padded += width * len(rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, r in enumerate(rows):
            ids[b, : len(r)] = torch.as_tensor(r)
            attn[b, : len(r)] = 1
        hidden = model.model(input_ids=ids.to(device), attention_mask=attn.to(device)).last_hidden_state
        pos = torch.cat(
            [b * width + len(prompts[i]) - 1 + torch.arange(len(answers[i])) for b, i in enumerate(chunk)]
        )
        tgt = torch.cat([torch.as_tensor(answers[i]) for i in chunk]).to(device)
        logits = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[pos.to(device)])
        loss = torch.nn.functional.cross_entropy(logits.float(), tgt, reduction="sum") / n_answer
        loss.backward()
    return padded


def before_logprobs(model, prompts, answers, with_entropy: bool):
    """The previous layout: left-padded prompts, right-padded answers, full logits over the answer columns."""
    device = next(model.parameters()).device
    plen, alen = max(len(p) for p in prompts), max(len(a) for a in answers)
    ids = torch.zeros((len(prompts), plen + alen), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        ids[b, plen - len(p) : plen] = torch.as_tensor(p)
        ids[b, plen : plen + len(a)] = torch.as_tensor(a)
        attn[b, plen - len(p) : plen + len(a)] = 1
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    out = model(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=pos.to(device),
        logits_to_keep=alen + 1,
        use_cache=False,
    )
    scaled = out.logits[:, :-1].float()
    lse = torch.logsumexp(scaled, -1)
    logp = scaled.gather(-1, ids[:, plen:].to(device).unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        ent = lse - (torch.exp(scaled - lse.unsqueeze(-1)) * scaled).sum(-1)
    mask = attn[:, plen:].to(device).float()
    return logp * mask, mask, ent, ids.numel()


def rl_step(
    model, ref, prompts, answers, budget: int, variant: str, passes: bool, layout: str = "rows"
) -> int:
    """One learner step of ``variant`` ("before" or "learner"): the no-grad pass (old + reference log-probs),
    then each chunk's forward, GAGPO loss and backward. Returns the padded tokens of all forwards."""
    n = len(prompts)
    adv = torch.randn(n, generator=torch.Generator().manual_seed(0))
    device = next(model.parameters()).device
    padded = 0
    if variant == "before":
        chunks = length_chunks([len(p) for p in prompts], budget)
    else:
        chunks = token_chunks([(1, len(p) + len(a)) for p, a in zip(prompts, answers, strict=True)], budget)

    def run(m, idx, grad: bool, entropy: bool):
        nonlocal padded
        ps, acts = [prompts[i] for i in idx], [answers[i] for i in idx]
        if variant == "before":
            logp, mask, ent, tokens = before_logprobs(m, ps, acts, entropy)
            padded += tokens
            return logp, mask, ent
        lengths = [len(p) + len(a) for p, a in zip(ps, acts, strict=True)]
        padded += sum(lengths) if layout == "varlen" else len(idx) * max(lengths)
        return action_logprobs(m, ps, acts, pad_token_id=0, with_entropy=entropy, layout=layout)

    fixed = {}
    if passes:
        with torch.no_grad():
            for idx in chunks:
                old, _, _ = run(model, idx, False, False)
                refl, _, _ = run(ref, idx, False, False)
                fixed[tuple(idx)] = (old, refl)
    for idx in chunks:
        logp, mask, ent = run(model, idx, True, True)
        old, refl = fixed.get(tuple(idx), (logp.detach(), None))
        loss, _ = gagpo_policy_loss(
            logp,
            old[:, : logp.shape[1]],
            refl if refl is None else refl[:, : logp.shape[1]],
            adv[idx].to(device),
            mask,
            kl_coeff=0.01 if passes else 0.0,
            entropy=ent,
            entropy_coeff=0.001,
            weights=torch.full((len(idx),), len(idx) / n, device=device),
        )
        loss.backward()
    return padded


def measure(args, dtype: str) -> list[dict]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, **SHAPES[args.model])
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config).to(args.device)  # fp32 master weights, as the learner keeps them
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref = copy.deepcopy(model).to(getattr(torch, dtype)).requires_grad_(False)
    optim = torch.optim.Adam(model.parameters(), lr=1e-6)
    prompts, answers = make_rows(args.groups, args.k, args.steps, args.scale, args.seed)
    real = sum(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    params = sum(p.numel() for p in model.parameters())
    autocast = (
        torch.autocast(args.device, dtype=torch.bfloat16)
        if dtype == "bfloat16"
        else torch.autocast(args.device, enabled=False)
    )
    results = []
    variants = [("plain", None), ("before", True), ("learner", True), ("learner", False)]
    if args.no_passes:
        variants = [("plain", None), ("before", False), ("learner", False)]
    for name, passes in variants:
        times, padded = [], 0
        tracker = VocabPeak(VOCAB, config.hidden_size)
        # a warm-up, the timed repeats, then one untimed step under the vocabulary tracker
        for rep in range(args.repeats + 2):
            tracked = rep == args.repeats + 1
            optim.zero_grad(set_to_none=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            with autocast, tracker if tracked else contextlib.nullcontext():
                if name == "plain":
                    padded = plain_step(model, prompts, answers, args.budget)
                else:
                    padded = rl_step(model, ref, prompts, answers, args.budget, name, passes, args.layout)
            optim.step()
            if args.device == "cuda":
                torch.cuda.synchronize()
                if not tracked:
                    peak = torch.cuda.max_memory_allocated()
            if 0 < rep <= args.repeats:
                times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        # fwd + bwd = 6 N per token, the no-grad pass 2 N per token per model.
        flops = 6 * params * real + (4 * params * real if passes else 0)
        row = dict(
            variant=name if passes is None else f"{name}{'' if passes else ' (no passes)'}",
            dtype=dtype,
            seconds=seconds,
            tokens_s=real / seconds,
            padding=padded / (real * (3 if passes else 1)) - 1 if name != "plain" else padded / real - 1,
            vocab_peak_gib=tracker.peak / 2**30,
            vocab_peak_slices=tracker.peak / (slice_tokens_for(VOCAB) * VOCAB * 4),
        )
        if args.device == "cuda":
            row["peak_gib"] = peak / 2**30
            row["mfu"] = flops / seconds / PEAK_FLOPS[dtype]
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(SHAPES), default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="turns per episode")
    parser.add_argument("--scale", type=float, default=4.0, help="ALFWorld lengths divided by this")
    parser.add_argument("--budget", type=int, default=16384, help="tokens per chunk (train_chunk_tokens)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument(
        "--layout", choices=["rows", "varlen"], default="rows", help="the learner's row layout"
    )
    parser.add_argument("--no-passes", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    rows = []
    for dtype in args.dtype:
        rows += measure(args, dtype)
    plain = {r["dtype"]: r["tokens_s"] for r in rows if r["variant"] == "plain"}
    print(
        f"model {args.model} on {args.device}, {args.groups}x{args.k} episodes x {args.steps} turns, lengths / "
        f"{args.scale}, budget {args.budget}, checkpointing {args.checkpointing}"
    )
    prompts, answers = make_rows(args.groups, args.k, args.steps, args.scale, args.seed)
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for p in prompts:
        repeated += len(p) if tuple(p) in seen else 0
        seen.add(tuple(p))
    real = sum(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    print(
        f"prompt tokens of rows whose prompt an earlier row of the minibatch has (all that shared-prompt reuse"
        f" could skip): {100 * repeated / real:.1f}% of the real tokens"
    )
    head = f"{'variant':<24}{'dtype':<10}{'s/step':>8}{'tok/s':>10}{'/plain':>8}{'padding':>9}{'vocab GiB':>11}{'/slice':>8}"
    if args.device == "cuda":
        head += f"{'peak GiB':>10}{'MFU':>7}"
    print(head)
    for r in rows:
        line = (
            f"{r['variant']:<24}{r['dtype']:<10}{r['seconds']:>8.2f}{r['tokens_s']:>10.0f}"
            f"{r['tokens_s'] / plain[r['dtype']]:>8.2f}{100 * r['padding']:>8.1f}%{r['vocab_peak_gib']:>11.3f}"
            f"{r['vocab_peak_slices']:>8.2f}"
        )
        if args.device == "cuda":
            line += f"{r['peak_gib']:>10.1f}{100 * r['mfu']:>6.1f}%"
        print(line)
    if len(plain) == 2:
        for name in {r["variant"] for r in rows}:
            by = {r["dtype"]: r["tokens_s"] for r in rows if r["variant"] == name}
            print(f"bf16 / fp32 tokens/s, {name}: {by['bfloat16'] / by['float32']:.2f}")


if __name__ == "__main__":
    main()
