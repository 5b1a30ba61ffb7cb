"""Tokens/s of the rollout backend vs raw Hugging Face generate on the same batch shape, measured side by side.

The backend adds tokenisation, the per-step raw logits (output_logits) and the behaviour log-prob extraction;
the ratio shows what that costs. Runs the tiny offline policy by default; pass --model for any causal LM folder.

    python benchmarks/bench_rollout.py [--model PATH] [--batch 16] [--prompt-tokens 300] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from gagpo_rllib.generation import HFGenerationBackend, SamplingConfig
from gagpo_rllib.models import build_tiny_policy, load_policy


def _prompts(tok, batch: int, prompt_tokens: int) -> list[str]:
    """Chat prompts of varied length (down to 60% of ``prompt_tokens``) so the batch is left-padded."""
    words = [
        "you",
        "are",
        "in",
        "the",
        "hall",
        "exits",
        "north",
        "east",
        "south",
        "west",
        "a",
        "key",
        "lies",
        "on",
        "the",
        "table",
    ]
    prompts = []
    for i in range(batch):
        target = int(prompt_tokens * (0.6 + 0.4 * i / max(batch - 1, 1)))
        body = " ".join(words[j % len(words)] for j in range(target))
        ids = tok(body, add_special_tokens=False)["input_ids"][: max(target - 12, 1)]
        prompts.append(
            tok.apply_chat_template(
                [{"role": "user", "content": tok.decode(ids)}], add_generation_prompt=True, tokenize=False
            )
        )
    return prompts


def _raw_generate(model, tok, prompts: list[str], new_tokens: int, seed: int) -> int:
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt").to(model.device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            max_new_tokens=new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    new = out[:, enc["input_ids"].shape[1] :]
    count = 0
    for row in new.tolist():
        count += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
    return count


def _backend_generate(
    backend: HFGenerationBackend, prompts: list[str], new_tokens: int, seed: int, **kw
) -> int:
    outs = backend.generate(
        prompts, sampling=SamplingConfig(max_new_tokens=new_tokens, **kw.pop("cfg", {})), seed=seed, **kw
    )
    return sum(len(o.action_ids) for o in outs)


def _run(fn, seed: int) -> tuple[int, float]:
    """(new tokens, seconds) of one call."""
    t0 = time.perf_counter()
    n = fn(seed)
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder; default: a tiny offline policy (4 x 256)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build_tiny_policy(
            f"{tmp}/tiny", hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024
        )
        model, tok = load_policy(path, device=args.device)
        backend = HFGenerationBackend((model, tok), device=args.device)
        prompts = _prompts(tok, args.batch, args.prompt_tokens)
        admissible = [["go north", "go south", "take the key from the table", "look"]] * args.batch
        paths = {
            "raw HF generate": lambda seed: _raw_generate(model, tok, prompts, args.new_tokens, seed),
            "HFGenerationBackend": lambda seed: _backend_generate(backend, prompts, args.new_tokens, seed),
            "HFGenerationBackend, constrained": lambda seed: _backend_generate(
                backend, prompts, args.new_tokens, seed, admissible=admissible, cfg={"constrained": True}
            ),
        }
        for fn in paths.values():
            fn(0)  # warm-up
        totals = {name: [0, 0.0] for name in paths}
        for r in range(args.repeats):  # interleaved, so load changes hit every path alike
            for name, fn in paths.items():
                n, dt = _run(fn, r + 1)
                totals[name][0] += n
                totals[name][1] += dt
    rates = {name: n / dt for name, (n, dt) in totals.items()}
    raw = rates["raw HF generate"]
    model_name = "tiny 4 x 256" if args.model is None else args.model
    print(
        f"batch {args.batch} x ~{args.prompt_tokens} prompt tokens -> up to {args.new_tokens} new tokens, "
        f"{args.device}, {torch.get_num_threads()} threads, model {model_name}, {args.repeats} interleaved repeats"
    )
    for name, rate in rates.items():
        print(f"{name:34s}: {rate:9.1f} new tok/s   ratio to raw = {rate / raw:.3f}")
    print("(constrained answers are a few tokens each, so per-call costs weigh more in its tokens/s)")


if __name__ == "__main__":
    main()
