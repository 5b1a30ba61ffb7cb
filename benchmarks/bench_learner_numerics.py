"""Learner numerics and speed per dtype: how far the first minibatch's ratio sits from 1 when the old log-probs
were computed in other chunks (another batch composition and padding), and fwd+bwd tokens/s of the GAGPO loss.

A random-init Qwen2 of the chosen shape (default: Qwen2.5-1.5B's) needs no download. Meant for a GPU:

    python benchmarks/bench_learner_numerics.py --device cuda [--dtypes float32 bfloat16] [--shape tiny]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from gagpo_rllib.method.loss import gagpo_policy_loss
from gagpo_rllib.policy.logprobs import action_logprobs

SHAPES = {
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "tiny": dict(
        vocab_size=4096,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    ),
}


def random_steps(n: int, vocab: int, prompt_range: tuple[int, int], seed: int) -> tuple[list, list]:
    g = torch.Generator().manual_seed(seed)

    def seq(lo: int, hi: int) -> list[int]:
        length = int(torch.randint(lo, hi, (1,), generator=g))
        return torch.randint(10, vocab - 1, (length,), generator=g).tolist()

    return [seq(*prompt_range) for _ in range(n)], [seq(8, 64) for _ in range(n)]


def measure(shape: str, dtype: torch.dtype, device: str, steps: int, chunk: int, minibatch: int) -> str:
    cfg = Qwen2Config(
        **SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True, attention_dropout=0.0
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device, dtype)
    model.gradient_checkpointing_enable()
    prompts, actions = random_steps(
        steps, cfg.vocab_size, (300, 1200) if shape != "tiny" else (20, 120), seed=1
    )
    common = dict(pad_token_id=0, temperature=1.0)
    old = []
    with torch.no_grad():
        for s in range(0, steps, chunk):
            logp, mask, _ = action_logprobs(model, prompts[s : s + chunk], actions[s : s + chunk], **common)
            old += [row[keep.bool()].float() for row, keep in zip(logp, mask, strict=True)]
    rows = torch.randperm(steps, generator=torch.Generator().manual_seed(2))[:minibatch].tolist()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    logp, mask, entropy = action_logprobs(
        model, [prompts[i] for i in rows], [actions[i] for i in rows], with_entropy=True, **common
    )
    old_logp = torch.zeros_like(logp, dtype=torch.float32)
    for r, i in enumerate(rows):
        old_logp[r, : len(old[i])] = old[i]
    advantages = torch.randn(len(rows), device=logp.device)
    loss, _ = gagpo_policy_loss(
        logp.float(),
        old_logp,
        None,
        advantages,
        mask,
        kl_coeff=0.0,
        entropy=entropy.float(),
        entropy_coeff=1e-3,
    )
    loss.backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(prompts[i]) + len(actions[i]) for i in rows)
    with torch.no_grad():
        m = mask.float()
        ratio = torch.exp(((logp.float() - old_logp) * m).sum(-1) / m.sum(-1))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    return (
        f"{shape} {str(dtype).removeprefix('torch.')}: first-minibatch max|ratio-1| "
        f"{float((ratio - 1).abs().max()):.2e}, fwd+bwd {tokens / seconds:,.0f} tokens/s "
        f"({len(rows)} steps, {tokens} tokens, first call), peak {peak:.1f} GiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument(
        "--steps", type=int, default=128, help="steps in the batch whose old log-probs are computed"
    )
    parser.add_argument("--chunk", type=int, default=64, help="rows per chunk when computing old log-probs")
    parser.add_argument("--minibatch", type=int, default=32, help="steps in the (reshuffled) first minibatch")
    args = parser.parse_args()
    for name in args.dtypes:
        print(measure(args.shape, getattr(torch, name), args.device, args.steps, args.chunk, args.minibatch))


if __name__ == "__main__":
    main()
