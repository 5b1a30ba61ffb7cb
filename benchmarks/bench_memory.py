"""Learner memory you can plan with: measured here, checked against a formula, extrapolated to Qwen2.5 on GPUs.

    python benchmarks/bench_memory.py [--chunk-tokens 16384] [--prompt-tokens 1000] [--action-tokens 512]

1. **State per learner** (tiny Qwen2, CPU): weights, gradients and Adam state of the fp32 masters and the bf16
   reference, held by 1 learner and by each of 2 FSDP learners over gloo (``gagpo_rllib.policy.fsdp.shard``, the learners'
   own sharding), against the formula 4P + 4P + 8P + 2P bytes (divided by N under FSDP).
2. **Activations per token** saved for backward (``saved_tensors_hooks``), bf16 autocast over fp32 masters, with
   and without gradient checkpointing: per decoder layer and token a*h + b*i + c*kv elements (h hidden, i MLP,
   kv key/value width) and per action token d*V bytes for the fp32 log-prob/entropy over the vocabulary. The
   coefficients are fitted on five small shapes and checked on two others (printed: formula vs measured).
3. **Vocabulary working memory**: the LM head runs on answer positions only, in slices of
   ``slice_tokens_for(V)`` tokens (``policy.logprobs.token_scores``); the peak of live [tokens, V] tensors during
   its forward and backward is measured here in units of one slice's float32 logits and enters the table as that
   multiple of the slice, whatever the chunk's answers.
4. **The per-GPU table** for Qwen2.5-1.5B/7B/14B x {DDP, FSDP over 2/4/8 learners, LoRA rank ``--lora-rank`` on one
   learner} at the paper's minibatch (64 steps of ``--prompt-tokens`` + ``--action-tokens``): state + one chunk's
   activations (the learner runs backward chunk by chunk) + FSDP's all-gathered bf16 layers, against 80 GB and
   141 GB GPUs.
5. **Layouts of the paper set-ups** (1.5B on 2 GPUs, 7B on 4; 80 GB = 74 GiB and 141 GB = 131 GiB): per GPU, the
   rollout phase and the update phase of the separate plan (learners on whole GPUs, engines on the GPUs left, the
   validation engine a fixed 0.15 slice) and of the colocated one (``paper_setup.colocated_memory``: a learner and
   a training engine on every GPU, the engines asleep during the update, the validation engine sized from the
   model beside one of them).

LoRA (``GAGPOConfig.lora_rank``): the learner holds the bf16 base (2P, also the reference: adapters disabled) and
fp32 adapters with their gradients and Adam moments (16A, A adapter parameters on every linear kind); measured in 1.
on the tiny model with peft's adapters, and its table rows use the full-weight activation formula (the saved layer
inputs under checkpointing are the same; the recomputed layer's adapter inputs add a little).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from gagpo_rllib.method.loss import gagpo_policy_loss
from gagpo_rllib.policy.logprobs import action_logprobs, slice_tokens_for, token_scores
from gagpo_rllib.policy.rl_module import enable_checkpointing
from gagpo_rllib.rllib.paper_setup import (
    CUDA_CONTEXT_GIB,
    ENGINE_WORKING_GIB,
    LEARNER_STATE_BYTES_PER_PARAM,
    TRAIN_ENGINE_MEMORY,
    VALID_ENGINE_MEMORY,
    colocated_memory,
    decoder_param_count,
)

GIB = 1024**3
QWEN = {  # layers, hidden, intermediate, heads, kv heads, vocab, tied embeddings
    "Qwen2.5-1.5B": (28, 1536, 8960, 12, 2, 151936, True),
    "Qwen2.5-7B": (28, 3584, 18944, 28, 4, 152064, False),
    "Qwen2.5-14B": (48, 5120, 13824, 40, 8, 152064, False),
}
# (layers, hidden, intermediate, heads, kv heads, vocab): fitted on the first five, checked on the last two.
CALIBRATION = [
    (2, 64, 256, 2, 2, 2048),
    (2, 128, 256, 4, 2, 2048),
    (2, 64, 512, 2, 1, 2048),
    (3, 64, 256, 4, 4, 4096),
    (2, 96, 192, 3, 3, 3072),
]
CHECK = [(3, 96, 384, 3, 1, 4096), (4, 128, 512, 4, 2, 3072)]


def _config(layers, hidden, inter, heads, kv, vocab, tied=True) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )


def param_count(layers, hidden, inter, heads, kv, vocab, tied) -> int:
    """Qwen2 parameters (``paper_setup.decoder_param_count``, which sizes the colocated engines)."""
    return decoder_param_count(layers, hidden, inter, heads, kv, vocab, tied)


def lora_param_count(layers, hidden, inter, heads, kv, rank) -> int:
    """LoRA adapter parameters with rank ``rank`` on q, k, v, o, gate, up, down: rank * (in + out) each."""
    kv_dim = kv * hidden // heads
    shapes = [(hidden, hidden), (hidden, kv_dim), (hidden, kv_dim), (hidden, hidden)]
    shapes += [(hidden, inter), (hidden, inter), (inter, hidden)]
    return layers * sum(rank * (a + b) for a, b in shapes)


def lora_state_bytes(params: int, adapters: int) -> dict[str, float]:
    """LoRA learner: bf16 base (the reference too), fp32 adapters, their gradients and Adam's two moments."""
    return {
        "weights": 2 * params + 4 * adapters,
        "gradients": 4 * adapters,
        "optimizer": 8 * adapters,
        "reference": 0,
    }


def state_bytes(params: int, learners: int = 1) -> dict[str, float]:
    """Per learner: fp32 masters, fp32 gradients, Adam's two fp32 moments, the bf16 reference (sharded by N);
    together ``paper_setup.LEARNER_STATE_BYTES_PER_PARAM`` per parameter."""
    parts = {"weights": 4, "gradients": 4, "optimizer": 8, "reference": 2}
    assert sum(parts.values()) == LEARNER_STATE_BYTES_PER_PARAM
    return {k: v * params / learners for k, v in parts.items()}


# ------------------------------------------------------------------------------------------------ 1. state
def _held(model, ref, optim) -> dict[str, float]:
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    size = lambda ts: float(sum(local(t).numel() * local(t).element_size() for t in ts))  # noqa: E731
    return {
        "weights": size(model.parameters()),
        "gradients": size(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer": size(
            t for s in optim.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()
        ),
        "reference": size(ref.parameters()),
    }


def _train_once(model, ref) -> torch.optim.Optimizer:
    optim = torch.optim.Adam(model.parameters(), lr=1e-6)
    prompts, actions = [[5, 6, 7, 8]] * 2, [[9, 10]] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, mask, _ = action_logprobs(model, prompts, actions, pad_token_id=0)
        with torch.no_grad():
            ref_logp, _, _ = action_logprobs(ref, prompts, actions, pad_token_id=0)
    loss, _ = gagpo_policy_loss(logp, logp.detach(), ref_logp, torch.ones(2), mask)
    loss.backward()
    optim.step()
    return optim


def _tiny_models(tied: bool):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(2, 64, 256, 2, 2, 2048, tied))
    ref = Qwen2ForCausalLM(_config(2, 64, 256, 2, 2, 2048, tied)).to(torch.bfloat16).requires_grad_(False)
    return model, ref


def _fsdp_worker(rank: int, world: int, port: int, out: str) -> None:
    from gagpo_rllib.policy.fsdp import shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model, ref = _tiny_models(tied=False)
    shard(model, compute_dtype=torch.bfloat16)
    shard(ref, compute_dtype=torch.bfloat16, frozen=True)
    optim = _train_once(model, ref)
    torch.save(_held(model, ref, optim), f"{out}/{rank}.pt")
    dist.destroy_process_group()


def measure_lora_state(rank: int = 8) -> tuple[str, dict, dict]:
    """(set-up, measured, formula) of a LoRA learner: the tiny model's base in bf16 with peft adapters in fp32;
    the reference is the base with the adapters disabled (no tensor of its own)."""
    from gagpo_rllib.policy.lora import adapters_disabled, apply_lora

    torch.manual_seed(0)
    shape = (2, 64, 256, 2, 2, 2048)
    base = Qwen2ForCausalLM(_config(*shape, False)).to(torch.bfloat16)
    params = sum(p.numel() for p in base.parameters())
    peft_model = apply_lora(base, rank=rank, alpha=2 * rank, dropout=0.0, target_modules="all-linear")
    trainable = [p for p in base.parameters() if p.requires_grad]
    optim = torch.optim.Adam(trainable, lr=1e-6)
    prompts, actions = [[5, 6, 7, 8]] * 2, [[9, 10]] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, mask, _ = action_logprobs(base, prompts, actions, pad_token_id=0)
        with torch.no_grad(), adapters_disabled(peft_model):
            ref_logp, _, _ = action_logprobs(base, prompts, actions, pad_token_id=0)
    loss, _ = gagpo_policy_loss(logp, logp.detach(), ref_logp, torch.ones(2), mask)
    loss.backward()
    optim.step()
    size = lambda ts: float(sum(t.numel() * t.element_size() for t in ts))  # noqa: E731
    held = {
        "weights": size(base.parameters()),
        "gradients": size(p.grad for p in base.parameters() if p.grad is not None),
        "optimizer": size(
            t for s in optim.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()
        ),
        "reference": 0.0,  # nothing beyond the base
    }
    adapters = lora_param_count(*shape[:5], rank)
    assert adapters == sum(p.numel() for p in trainable)
    return f"LoRA rank {rank}, 1 learner", held, lora_state_bytes(params, adapters)


def measure_state() -> list[tuple[str, dict, dict]]:
    """(set-up, measured, formula) per learner for 1 learner and for rank 0 of 2 FSDP learners."""
    model, ref = _tiny_models(tied=False)
    params = sum(p.numel() for p in model.parameters())
    rows = [("1 learner", _held(model, ref, _train_once(model, ref)), state_bytes(params))]
    with tempfile.TemporaryDirectory() as out:
        port = 29500 + os.getpid() % 1000
        mp.spawn(_fsdp_worker, args=(2, port, out), nprocs=2, join=True)
        for rank in range(2):
            rows.append((f"FSDP 2, rank {rank}", torch.load(f"{out}/{rank}.pt"), state_bytes(params, 2)))
    return rows


# ------------------------------------------------------------------------------------------ 2. activations
def saved_bytes(shape, *, rows: int, prompt: int, action: int, checkpoint: bool) -> float:
    """Peak bytes saved for backward over one forward + backward of the GAGPO loss (bf16 autocast)."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(*shape))
    if checkpoint:
        enable_checkpointing(model)
    model.train()
    live = {"now": 0, "peak": 0}

    class Saved:
        def __init__(self, t):
            self.t, self.n = t.detach(), t.numel() * t.element_size()
            if isinstance(t, torch.nn.Parameter) or t.data_ptr() in weights:
                self.n = 0  # the weights themselves are state, not activations
            live["now"] += self.n
            live["peak"] = max(live["peak"], live["now"])

        def __del__(self):
            live["now"] -= self.n

    weights = {p.data_ptr() for p in model.parameters()}
    g = torch.Generator().manual_seed(1)
    vocab = shape[-1]
    prompts = torch.randint(10, vocab, (rows, prompt), generator=g).tolist()
    actions = torch.randint(10, vocab, (rows, action), generator=g).tolist()
    with (
        torch.autograd.graph.saved_tensors_hooks(Saved, lambda s: s.t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        logp, mask, ent = action_logprobs(model, prompts, actions, pad_token_id=0, with_entropy=True)
        loss, _ = gagpo_policy_loss(
            logp, logp.detach(), None, torch.ones(rows), mask, kl_coeff=0.0, entropy=ent, entropy_coeff=0.001
        )
        loss.backward()
    return float(live["peak"])


def per_token(shape, checkpoint: bool) -> tuple[float, float]:
    """(bytes per token in the decoder layers, bytes per action token over the vocabulary) of ``shape``."""
    base = saved_bytes(shape, rows=2, prompt=64, action=1, checkpoint=checkpoint)
    longer = saved_bytes(shape, rows=2, prompt=128, action=1, checkpoint=checkpoint)
    acting = saved_bytes(shape, rows=2, prompt=64, action=33, checkpoint=checkpoint)
    token = (longer - base) / (2 * 64)
    return token, (acting - base) / (2 * 32) - token


def _features(shape) -> list[float]:
    layers, hidden, inter, heads, kv, _ = shape
    return [layers * hidden, layers * inter, layers * kv * hidden // heads, hidden]


class ActivationFormula:
    """Bytes per token = sum of coefficients x (L*h, L*i, L*kv, h); per action token = d * V."""

    def __init__(self, checkpoint: bool):
        self.checkpoint = checkpoint
        measured = [per_token(s, checkpoint) for s in CALIBRATION]
        x = np.array([_features(s) for s in CALIBRATION])
        self.coef = np.linalg.lstsq(x, np.array([m[0] for m in measured]), rcond=None)[0]
        self.vocab = float(np.mean([m[1] / s[-1] for m, s in zip(measured, CALIBRATION, strict=True)]))

    def token(self, shape) -> float:
        return float(np.dot(self.coef, _features(shape)))

    def action_token(self, vocab: int) -> float:
        return self.vocab * vocab


# -------------------------------------------------------------------------------------- 3. vocabulary side
def vocabulary_peak_slices(
    vocab: int = 4096, hidden: int = 64, tokens: int = 1000, slice_tokens: int = 256
) -> float:
    """Peak live [tokens, vocab] bytes of ``token_scores`` with entropy, forward + backward under bf16 autocast,
    over one slice's float32 logits (``bench_learner.VocabPeak`` tracks them)."""
    from bench_learner import VocabPeak

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = (0.02 * torch.randn(vocab, hidden)).requires_grad_(True)
    targets = torch.randint(0, vocab, (tokens,))
    tracker = VocabPeak(vocab, hidden)
    with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = token_scores(h, w, targets=targets, with_entropy=True, slice_tokens=slice_tokens)
        (logp.sum() + ent.sum()).backward()
    return tracker.peak / (slice_tokens * vocab * 4)


# ------------------------------------------------------------------------------------------------ 4. table
def gpu_table(args, formulas: dict[bool, ActivationFormula], slices: float) -> list[str]:
    lines = [
        f"Per GPU, GiB (state + one chunk of {args.chunk_tokens:,} tokens with checkpointing + the LM head's "
        f"vocabulary working memory ({slices:.2f} slices) + FSDP's gathered bf16 layers); paper minibatch 64 x "
        f"({args.prompt_tokens} + {args.action_tokens}) tokens",
        "| model | set-up | state | activations | vocabulary | gathered | total | 80 GB | 141 GB |"
        " no chunks, no checkpointing |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    step = args.prompt_tokens + args.action_tokens
    steps_per_chunk = max(1, args.chunk_tokens // step)
    for name, (layers, hidden, inter, heads, kv, vocab, tied) in QWEN.items():
        params = param_count(layers, hidden, inter, heads, kv, vocab, tied)
        shape = (layers, hidden, inter, heads, kv, vocab)
        ck, plain = formulas[True], formulas[False]
        chunk = steps_per_chunk * (step * ck.token(shape) + args.action_tokens * ck.action_token(vocab))
        whole = 64 * (step * plain.token(shape) + args.action_tokens * plain.action_token(vocab))
        layer = param_count(1, hidden, inter, heads, kv, 0, True) - hidden
        root = vocab * hidden * (1 if tied else 2)
        working = slices * slice_tokens_for(vocab) * vocab * 4
        for learners in (1, 2, 4, 8):
            fsdp = learners > 1
            state = sum(state_bytes(params, learners if fsdp else 1).values())
            gathered = (2 * 2 * layer + 2 * root) if fsdp else 0.0
            total = state + chunk + working + gathered
            setup = f"FSDP x{learners}" if fsdp else "DDP (any N)"
            fits = ["yes" if total < cap * 1e9 * 0.92 else "no" for cap in (80, 141)]
            lines.append(
                f"| {name} ({params / 1e9:.2f}B) | {setup} | {state / GIB:.1f} | {chunk / GIB:.1f} | "
                f"{working / GIB:.1f} | {gathered / GIB:.1f} | {total / GIB:.1f} | {fits[0]} | {fits[1]} | "
                f"{(state + whole) / GIB:.0f} |"
            )
        adapters = lora_param_count(layers, hidden, inter, heads, kv, args.lora_rank)
        state = sum(lora_state_bytes(params, adapters).values())
        total = state + chunk + working
        fits = ["yes" if total < cap * 1e9 * 0.92 else "no" for cap in (80, 141)]
        lines.append(
            f"| {name} ({params / 1e9:.2f}B) | LoRA r{args.lora_rank} ({adapters / 1e6:.1f}M), 1 learner | "
            f"{state / GIB:.1f} | {chunk / GIB:.1f} | {working / GIB:.1f} | 0.0 | {total / GIB:.1f} | {fits[0]} | "
            f"{fits[1]} | "
            f"{(state + whole) / GIB:.0f} |"
        )
    return lines


# ------------------------------------------------------------------------------------------------ 5. layouts
def _learner_update_bytes(
    args, formulas, slices, name: str, learners: int, fsdp: bool
) -> tuple[float, float]:
    """(resident state, update peak) bytes of one learner: the table's state, one chunk, vocabulary, gathered."""
    layers, hidden, inter, heads, kv, vocab, tied = QWEN[name]
    params = param_count(layers, hidden, inter, heads, kv, vocab, tied)
    shape = (layers, hidden, inter, heads, kv, vocab)
    step = args.prompt_tokens + args.action_tokens
    chunk = max(1, args.chunk_tokens // step) * (
        step * formulas[True].token(shape) + args.action_tokens * formulas[True].action_token(vocab)
    )
    layer = param_count(1, hidden, inter, heads, kv, 0, True) - hidden
    root = vocab * hidden * (1 if tied else 2)
    gathered = (2 * 2 * layer + 2 * root) if fsdp else 0.0
    state = sum(state_bytes(params, learners if fsdp else 1).values())
    return state, state + chunk + slices * slice_tokens_for(vocab) * vocab * 4 + gathered


def layout_table(args, formulas: dict[bool, ActivationFormula], slices: float) -> list[str]:

    lines = [
        "Per GPU, GiB, the fullest GPU of each layout: rollout phase / update phase (engines asleep in the update"
        " when colocated: weights in host memory, KV cache freed; each process adds its CUDA context)",
        "| model, GPUs | layout | GPU | learners | rollout | update | fits | GPUs busy in rollout / update |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ctx = CUDA_CONTEXT_GIB * GIB
    for name, gpus, separate_learners in (("Qwen2.5-1.5B", 2, 1), ("Qwen2.5-7B", 4, 3)):
        layers, hidden, inter, heads, kv, vocab, tied = QWEN[name]
        params = param_count(layers, hidden, inter, heads, kv, vocab, tied)
        weights = 2 * params
        for gpu_gib in (74, 131):
            gpu = gpu_gib * GIB
            # Separate: learners on whole GPUs (FSDP when 2+), both engines on the last GPU.
            fsdp = separate_learners > 1
            state, update = _learner_update_bytes(args, formulas, slices, name, separate_learners, fsdp)
            learner_gpu = update + ctx
            engines = (TRAIN_ENGINE_MEMORY + VALID_ENGINE_MEMORY) * gpu + 2 * ctx
            valid_ok = VALID_ENGINE_MEMORY * gpu > weights + ENGINE_WORKING_GIB * GIB
            worst = max(learner_gpu, engines)
            fits = (
                "yes"
                if worst <= gpu and valid_ok
                else ("no: the validation engine's slice < the weights" if not valid_ok else "no")
            )
            setup = f"{separate_learners} {'FSDP' if fsdp else 'DDP'} learner(s) + 1 engine GPU"
            lines.append(
                f"| {name}, {gpus} x {gpu_gib} GiB | separate | learner / engines | {setup} | "
                f"{state / GIB + 1:.1f} / {engines / GIB:.1f} | {learner_gpu / GIB:.1f} / {engines / GIB:.1f} | "
                f"{fits} | {gpus - separate_learners} of {gpus} / {separate_learners} of {gpus} |"
            )
            # Colocated: one learner and one training engine per GPU (+ the validation engine on one of them).
            sharding = "fsdp" if name != "Qwen2.5-1.5B" else "ddp"
            try:
                plan = colocated_memory(params, num_learners=gpus, sharding=sharding, gpu_gib=gpu_gib)
            except ValueError as err:
                lines.append(
                    f"| {name}, {gpus} x {gpu_gib} GiB | colocated | - | {gpus} {sharding} | - | - | no: {err} | - |"
                )
                continue
            state, update = _learner_update_bytes(args, formulas, slices, name, gpus, sharding == "fsdp")
            asleep = 2 * ENGINE_WORKING_GIB * GIB  # what a sleeping engine may keep (allocator, graphs), both
            update_gpu = update + asleep + 3 * ctx
            fits = "yes" if plan.rollout_gib <= gpu_gib and update_gpu <= gpu else "no"
            lines.append(
                f"| {name}, {gpus} x {gpu_gib} GiB | colocated | each | {gpus} {sharding.upper()} | "
                f"{plan.rollout_gib:.1f} (engines {plan.train_engine_share:.3f} + {plan.valid_engine_share:.3f} of "
                f"the GPU, KV {plan.train_kv_gib:.1f} + {plan.valid_kv_gib:.1f}) | {update_gpu / GIB:.1f} | {fits} | "
                f"{gpus} of {gpus} / {gpus} of {gpus} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunk-tokens", type=int, default=16384, help="GAGPOConfig.train_chunk_tokens")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument(
        "--action-tokens", type=int, default=512, help="answer tokens of every step (the cap)"
    )
    parser.add_argument("--lora-rank", type=int, default=64, help="rank of the LoRA rows (every linear kind)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(
        "1. State each learner holds (bytes), measured vs formula 4P + 4P + 8P + 2P (/N under FSDP);"
        " LoRA: 2P + 4A, 4A, 8A, 0"
    )
    print("| learner | part | measured | formula | ratio |\n| --- | --- | --- | --- | --- |")
    for setup, held, formula in [*measure_state(), measure_lora_state()]:
        for part in ("weights", "gradients", "optimizer", "reference"):
            print(
                f"| {setup} | {part} | {held[part]:,.0f} | {formula[part]:,.0f} | "
                f"{held[part] / formula[part] if formula[part] else float(held[part] == 0):.3f} |"
            )

    print(
        "\n2. Activation bytes saved for backward per token, measured vs the fitted formula (checked shapes)"
    )
    print(
        "| checkpointing | shape (L, h, i, heads, kv, V) | per token measured | formula | per action token"
        " measured | formula |\n| --- | --- | --- | --- | --- | --- |"
    )
    formulas = {}
    for checkpoint in (False, True):
        formula = formulas[checkpoint] = ActivationFormula(checkpoint)
        for shape in CHECK:
            token, action = per_token(shape, checkpoint)
            print(
                f"| {'on' if checkpoint else 'off'} | {shape} | {token:,.0f} | {formula.token(shape):,.0f} | "
                f"{action:,.0f} | {formula.action_token(shape[-1]):,.0f} |"
            )
    for name, spec in QWEN.items():
        shape = spec[:6]
        print(
            f"   {name}: {formulas[False].token(shape) / 2**20:.2f} MiB/token without checkpointing, "
            f"{formulas[True].token(shape) / 2**10:.0f} KiB/token with; "
            f"{formulas[True].action_token(spec[5]) / 2**20:.2f} MiB per action token"
        )

    slices = vocabulary_peak_slices()
    print(
        f"\n3. Vocabulary working memory of the LM head (token_scores, entropy, forward + backward, bf16 autocast): "
        f"peak {slices:.2f} x one slice's float32 logits"
    )
    for name, spec in QWEN.items():
        vocab = spec[5]
        print(
            f"   {name}: slices of {slice_tokens_for(vocab)} tokens, "
            f"{slices * slice_tokens_for(vocab) * vocab * 4 / GIB:.2f} GiB whatever the chunk's answers"
        )
    print()
    print("\n".join(gpu_table(args, formulas, slices)))
    print()
    print("\n".join(layout_table(args, formulas, slices)))


if __name__ == "__main__":
    main()
