"""Per-token log-probs of actions given prompts, with the same numerics as the rollout backend.

The rollout backend and the learner both call ``scaled_logprobs`` on float32 logits, so on CPU the first-minibatch
ratio is 1 (up to the tiny difference between an incremental KV-cache forward and a full forward).

**Distinct rows** (``unique_rows``, ``length_chunks``, ``token_chunks``): the learner's forwards run once per distinct
(prompt, action, allowed set) row, in length-sorted chunks. The K rollouts of a group often repeat a step exactly
(same prompt, same action): on the built-in maze about 30% of a batch's rows are repeats. A repeat has the same
log-probs, ratio, KL and entropy as its first occurrence, so the per-row terms are gathered back (``inverse``);
only the advantage differs per row, and the loss, a per-row mean, is unchanged. The gather's backward sums the
repeats' gradients onto the shared row, which is the gradient of the full batch.

**Reference log-probs kept across updates** (``ReferenceLogprobCache``): the reference policy is frozen, so a row's
values never change. Multi-turn tasks revisit the same states with the same actions over iterations (on the built-in maze 90% of the
distinct rows of an iteration after the tenth were seen before), so most of the reference forward is a repeat.
Entries are keyed by ``row_keys`` (prompt, action and allowed tokens, padding stripped) and evicted
least recently used beyond ``max_rows``. A cached value equals a fresh forward up to float rounding of the batch
it was computed in.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

__all__ = [
    "ReferenceLogprobCache",
    "UniqueRows",
    "LAYOUTS",
    "action_logprobs",
    "back_in_order",
    "cache_keyword",
    "checkpointing",
    "kv_cache",
    "last_mlp_only_on_last_column",
    "left_pad",
    "length_chunks",
    "padded_positions",
    "prompt_cache",
    "row_keys",
    "row_keys_of",
    "scaled_logprobs",
    "shared_prompt_logprobs",
    "slice_tokens_for",
    "token_chunks",
    "token_scores",
    "unique_rows",
]

# How a chunk's rows are laid out for the forward (see ``action_logprobs``).
LAYOUTS = ("rows", "varlen")

# Bytes of float32 logits per slice of the LM head (``token_scores``): 256 MiB, ~440 tokens at Qwen2.5's vocabulary.
_SLICE_BYTES = 256 * 2**20


def slice_tokens_for(vocab: int) -> int:
    """Tokens per LM-head slice for a vocabulary of ``vocab`` words: float32 logits of ~256 MiB."""
    return max(64, _SLICE_BYTES // (4 * max(1, int(vocab))))


def scaled_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    allowed: Tensor | None = None,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log_softmax(logits / T) at ``tokens``, over ``allowed`` when given; and the entropy when asked.

    logits: [..., V]; tokens: [...]; allowed: bool [..., V] or None. Rows with no allowed token are treated as
    unconstrained (they are padding; callers mask them out). Only one [..., V] float copy is kept beyond the
    logits (two with a mask), since the vocabulary of real models is large.
    """
    scaled = logits.float() / float(temperature)
    masked = scaled
    if allowed is not None:
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        masked = scaled.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(masked, dim=-1)
    logp = masked.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        # H = lse - sum_v p_v * s_v; disallowed entries have p_v = 0, so the unmasked scores can be used
        probs = torch.exp(masked - lse.unsqueeze(-1))
        entropy = lse - (probs * scaled).sum(-1)
    return logp, entropy


def action_logprobs(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    action_ids: list[list[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    allowed_masks: list[Tensor | None] | None = None,
    with_entropy: bool = False,
    layout: str = "rows",
    slice_tokens: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Log-probs of each action token: returns (logp [B, M], mask [B, M], entropy [B, M] or None).

    Each row is its prompt followed by its action, with positions 0..n-1 (those of generation). ``layout``:
    ``"rows"`` right-pads the rows to the longest (padding = what sorting by total length leaves), ``"varlen"``
    packs them into one sequence whose positions restart at each row (no padding at all; Hugging Face turns that
    into varlen attention under flash attention and a block-causal mask under sdpa). The LM head runs only at the
    positions that predict an action token, in slices (``token_scores``), never on a [rows, length, vocab] tensor.
    ``allowed_masks[b]`` ([m_b, V] bool, or None) restricts the softmax to the allowed set at each position.
    """
    _check_rows(prompt_ids, action_ids, allowed_masks, rows=prompt_ids, rows_name="prompt_ids")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    device = next(model.parameters()).device
    rows = [list(p) + list(a) for p, a in zip(prompt_ids, action_ids, strict=True)]
    lengths = [len(r) for r in rows]
    if layout == "varlen":
        input_ids = torch.as_tensor([t for r in rows for t in r], dtype=torch.long).unsqueeze(0)
        position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        attn = None
        starts = torch.as_tensor(lengths).cumsum(0) - torch.as_tensor(lengths)
    else:
        width = max(lengths)
        input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            input_ids[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
            attn[b, : len(r)] = 1
        position_ids = padded_positions(attn)
        starts = torch.arange(len(rows)) * width
    # flat position of the token that predicts action token k of row b: start_b + len(prompt_b) - 1 + k
    predictors = torch.cat(
        [
            s + len(p) - 1 + torch.arange(len(a))
            for s, p, a in zip(starts.tolist(), prompt_ids, action_ids, strict=True)
        ]
    )
    targets = torch.cat([torch.as_tensor(a, dtype=torch.long) for a in action_ids])
    kwargs: dict[str, Any] = {"input_ids": input_ids.to(device), "position_ids": position_ids.to(device)}
    if attn is not None:
        kwargs["attention_mask"] = attn.to(device)
    return _scored_forward(
        model,
        kwargs,
        predictors,
        targets,
        action_ids,
        allowed_masks,
        temperature=temperature,
        with_entropy=with_entropy,
        slice_tokens=slice_tokens,
    )


def shared_prompt_logprobs(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    prompt_of_row: list[int],
    action_ids: list[list[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    allowed_masks: list[Tensor | None] | None = None,
    with_entropy: bool = False,
    slice_tokens: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``action_logprobs`` of rows whose prompts may repeat: each distinct prompt is forwarded once.

    Row r's prompt is ``prompt_ids[prompt_of_row[r]]``. All but the last token of each distinct prompt are
    forwarded with a KV cache (``prompt_cache``), the cache is copied to the rows, then every row's last prompt
    token and action tokens are forwarded on its copy (as generation decodes them); gradients reach the prompt
    forward through the cache. Values equal ``action_logprobs`` up to float rounding.
    """
    _check_rows(prompt_ids, action_ids, allowed_masks, rows=prompt_of_row, rows_name="prompt_of_row")
    device = next(model.parameters()).device
    bsz = len(action_ids)
    alen = max(len(a) for a in action_ids)
    input_ids, attn = left_pad(prompt_ids, pad_token_id)
    rows = torch.as_tensor(prompt_of_row, dtype=torch.long)
    targets = torch.full((bsz, alen), int(pad_token_id), dtype=torch.long)
    action_mask = torch.zeros((bsz, alen), dtype=torch.long)
    for b, a in enumerate(action_ids):
        targets[b, : len(a)] = torch.as_tensor(a, dtype=torch.long)
        action_mask[b, : len(a)] = 1
    row_attn = torch.cat([attn.index_select(0, rows), action_mask[:, : alen - 1]], dim=1)
    # left padding puts every prompt's last token in the last column; it predicts action token 0
    last = input_ids[:, -1:].index_select(0, rows)
    start = attn.sum(-1).index_select(0, rows).unsqueeze(1) - 1
    kwargs = {
        "input_ids": torch.cat([last, targets[:, : alen - 1]], dim=1).to(device),
        "attention_mask": row_attn.to(device),
        "position_ids": (start + torch.arange(alen)).to(device),
        "use_cache": True,
        **prompt_cache(model, input_ids.to(device), attn.to(device), rows=rows.to(device)),
    }
    predictors = torch.cat([b * alen + torch.arange(len(a)) for b, a in enumerate(action_ids)])
    flat_targets = torch.cat([torch.as_tensor(a, dtype=torch.long) for a in action_ids])
    return _scored_forward(
        model,
        kwargs,
        predictors,
        flat_targets,
        action_ids,
        allowed_masks,
        temperature=temperature,
        with_entropy=with_entropy,
        slice_tokens=slice_tokens,
    )


def prompt_cache(
    model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, *, rows: Tensor | None = None
) -> dict[str, Any]:
    """The forward keyword that continues from the KV cache of every left-padded prompt but its last token (empty
    for one-token prompts); with ``rows``, row r gets a copy of prompt ``rows[r]``'s cache.

    Those prompt positions feed the logits only through their keys and values, and the last decoder layer computes
    these before its MLP, so that MLP is skipped there: one layer's MLP over the prompt, a large share of a
    2-layer policy's compute and about 2% of a 28-layer model's.
    """
    if input_ids.shape[1] < 2:
        return {}
    prefix_mask = attention_mask[:, :-1]
    with last_mlp_only_on_last_column(model, keep_last=False):
        out = model(
            input_ids=input_ids[:, :-1],
            attention_mask=prefix_mask,
            position_ids=padded_positions(prefix_mask),
            use_cache=True,
            logits_to_keep=1,
        )
    cache = kv_cache(out)
    if rows is not None:
        cache.reorder_cache(rows)  # index_select per layer: a repeated index copies the prompt's cache
    return {cache_keyword(model): cache}


class _LastColumnMLP(torch.nn.Module):
    """An MLP applied at the last column only (``keep_last``) or nowhere; zeros elsewhere."""

    def __init__(self, mlp: torch.nn.Module, keep_last: bool):
        super().__init__()
        self.mlp = mlp
        self.keep_last = keep_last

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if not self.keep_last:
            return torch.zeros_like(hidden_states)
        rest = torch.zeros_like(hidden_states[:, :-1])
        return torch.cat([rest, self.mlp(hidden_states[:, -1:], *args, **kwargs)], dim=1)


@contextlib.contextmanager
def last_mlp_only_on_last_column(model: torch.nn.Module, *, keep_last: bool = True) -> Iterator[None]:
    """While the block runs, the last decoder layer's MLP runs on the last column only (or, ``keep_last=False``,
    nowhere); its output elsewhere is zeros.

    Exact wherever only the last column's output and the layers' keys and values are read (a prompt's KV cache, or
    the hidden state of a left-padded prompt's last token): the last layer's MLP feeds nothing else. ``model`` is a
    causal LM (``model.model.layers``) or its trunk (``model.layers``); other models, and models that recompute
    activations in backward (which would recompute the MLP unchanged), run unchanged.
    """
    if checkpointing(model):
        yield
        return
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "model", None), "layers", None)
    layer = layers[-1] if isinstance(layers, torch.nn.ModuleList) and len(layers) else None
    mlp = getattr(layer, "mlp", None)
    if not isinstance(mlp, torch.nn.Module):
        yield
        return
    layer.mlp = _LastColumnMLP(mlp, keep_last)
    try:
        yield
    finally:
        layer.mlp = mlp


def padded_positions(attention_mask: Tensor) -> Tensor:
    """Position ids of left-padded rows, cumsum(mask) - 1 (0 on padding): generation, the learner and the critic
    all use these, so a prompt's positions do not depend on how much padding its batch gave it."""
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)


def left_pad(ids: list[list[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists left-padded to the longest: (input ids, attention mask), both [B, width] long, on CPU."""
    width = max(len(p) for p in ids)
    input_ids = torch.full((len(ids), width), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((len(ids), width), dtype=torch.long)
    for b, p in enumerate(ids):
        input_ids[b, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        attn[b, width - len(p) :] = 1
    return input_ids, attn


def kv_cache(out: Any) -> Any:
    """The KV cache of a forward's output (``cache`` in newer transformers, ``past_key_values`` before)."""
    cache = out.get("cache", None)
    return out.get("past_key_values", None) if cache is None else cache


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's KV-cache argument: transformers renamed it from past_key_values to cache."""
    return _cache_keyword_of(type(model))


@functools.cache
def _cache_keyword_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether the model recomputes activations in backward (Hugging Face's flag; its name changed in v5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _check_rows(
    prompt_ids: list[list[int]],
    action_ids: list[list[int]],
    allowed_masks: list[Tensor | None] | None,
    *,
    rows: list,
    rows_name: str,
) -> None:
    """Errors naming the field: ``rows`` (one per action row) and the masks must match the actions; no prompt or
    action may be empty."""
    if len(rows) != len(action_ids):
        raise ValueError(f"{rows_name} ({len(rows)}) and action_ids ({len(action_ids)}) differ in length")
    if allowed_masks is not None and len(allowed_masks) != len(action_ids):
        raise ValueError(
            f"allowed_masks ({len(allowed_masks)}) and action_ids ({len(action_ids)}) differ in length"
        )
    for b, p in enumerate(prompt_ids):
        if not p:
            raise ValueError(f"prompt_ids[{b}]: empty prompt")
    for b, a in enumerate(action_ids):
        if not a:
            raise ValueError(f"action_ids[{b}]: empty action")


def _scored_forward(
    model: PreTrainedModel,
    kwargs: dict[str, Any],
    predictors: Tensor,
    targets: Tensor,
    action_ids: list[list[int]],
    allowed_masks: list[Tensor | None] | None,
    *,
    temperature: float,
    with_entropy: bool,
    slice_tokens: int | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Run ``model(**kwargs)`` with its LM head replaced by ``token_scores`` at the flat positions ``predictors``
    (row-major over the forward's [batch, length]); returns (logp, mask, entropy) as [B, M] right-padded."""
    device = next(model.parameters()).device
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0])
    allowed = _flat_allowed(allowed_masks, action_ids, vocab, device)
    predictors, targets = predictors.to(device), targets.to(device)
    score = functools.partial(
        token_scores,
        targets=targets,
        allowed=allowed,
        temperature=temperature,
        with_entropy=with_entropy,
        slice_tokens=slice_tokens or slice_tokens_for(vocab),
    )
    kwargs = {"use_cache": False, **kwargs}
    slot = _head_slot(model, head)
    if slot is None:  # a head we cannot stand in for: full logits, gathered at the predictors
        logits = model(**kwargs).logits
        logp, entropy = scaled_logprobs(
            logits.reshape(-1, logits.shape[-1]).index_select(0, predictors),
            targets,
            temperature=temperature,
            allowed=allowed,
            with_entropy=with_entropy,
        )
    else:
        parent, name = slot
        setattr(parent, name, _ScoringHead(head, predictors, score))
        try:
            scores = model(**kwargs).logits
        finally:
            setattr(parent, name, head)
        logp = scores[:, 0]
        entropy = scores[:, 1] if with_entropy else None
    lengths = torch.as_tensor([len(a) for a in action_ids], device=device)
    width = int(lengths.max())
    mask = (torch.arange(width, device=device) < lengths.unsqueeze(1)).float()
    flat = mask.flatten().nonzero().squeeze(1)

    def padded(values: Tensor) -> Tensor:
        out = values.new_zeros(mask.numel()).index_put((flat,), values.float())
        return out.view(mask.shape)

    return padded(logp), mask, padded(entropy) if entropy is not None else None


def _flat_allowed(
    allowed_masks: list[Tensor | None] | None, action_ids: list[list[int]], vocab: int, device: torch.device
) -> Tensor | None:
    """The per-row allowed masks as one [action tokens, V] bool tensor (None when no row is constrained)."""
    if allowed_masks is None or all(m is None for m in allowed_masks):
        return None
    parts = []
    for b, (m, a) in enumerate(zip(allowed_masks, action_ids, strict=True)):
        if m is None:
            parts.append(torch.ones((len(a), vocab), dtype=torch.bool))
            continue
        if tuple(m.shape) != (len(a), vocab):
            raise ValueError(f"allowed_masks[{b}]: shape {tuple(m.shape)}, expected ({len(a)}, {vocab})")
        parts.append(m.to("cpu", torch.bool))
    return torch.cat(parts).to(device)


def _head_slot(model: torch.nn.Module, head: torch.nn.Module) -> tuple[torch.nn.Module, str] | None:
    """(parent module, attribute) holding the LM head, when ``token_scores`` can stand in for it: a plain
    bias-free ``Linear`` whose output the model returns as it is (no final logit soft-capping)."""
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if getattr(getattr(model, "config", None), "final_logit_softcapping", None):
        return None
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is head:
                return parent, name
    return None


class _ScoringHead(torch.nn.Module):
    """Stands in for the LM head during one forward: hidden states at the predictor positions -> [N, 1 or 2]
    (log-prob, entropy). It calls the head's own weight inside the model's forward, so FSDP has it unsharded."""

    def __init__(self, head: torch.nn.Linear, predictors: Tensor, score: Any):
        super().__init__()
        self.head = head
        self.predictors = predictors
        self.score = score

    def forward(self, hidden: Tensor) -> Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self.predictors)
        logp, entropy = self.score(flat, self.head.weight)
        return torch.stack([logp, entropy], -1) if entropy is not None else logp.unsqueeze(-1)


def token_scores(
    hidden: Tensor,
    weight: Tensor,
    *,
    targets: Tensor,
    allowed: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    slice_tokens: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """``scaled_logprobs`` of ``hidden @ weight.T`` at ``targets``, computed ``slice_tokens`` rows at a time.

    hidden [N, H], weight [V, H], targets [N], allowed bool [N, V] or None. No [N, V] tensor exists at any time:
    the forward keeps one slice's logits and one float copy of them; the backward recomputes each slice's logits
    and turns them into their gradient in place, d logp_t / d x = onehot(t) - p and
    d H / d x = -p (log p + H), with x = logits / T. The matmuls run in the autocast dtype when autocast is on.
    """
    device_type = hidden.device.type
    compute = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    )
    args = (
        hidden,
        weight,
        targets,
        allowed,
        float(temperature),
        int(slice_tokens),
        bool(with_entropy),
        compute,
    )
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        out = _TokenScores.apply(*args)
        return out[0], out[1] if with_entropy else None
    with torch.no_grad():
        return _scores_forward(*args)


def _slice_scaled(
    h: Tensor, weight: Tensor, allowed: Tensor | None, temperature: float, compute: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """One slice's float32 logits / T with disallowed words at -inf (a single [n, V] float tensor), and the
    slice's allowed mask (rows with no allowed word count as unconstrained, as in ``scaled_logprobs``).
    Called with autocast off."""
    x = torch.nn.functional.linear(h.to(compute), weight.to(compute)).float()
    if temperature != 1.0:
        x.div_(temperature)
    if allowed is not None:
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        x.masked_fill_(~allowed, float("-inf"))
    return x, allowed


def _scores_forward(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    allowed: Tensor | None,
    temperature: float,
    slice_tokens: int,
    with_entropy: bool,
    compute: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """Slice by slice: lse = m + log sum exp(x - m), logp = x_t - lse, H = lse - sum_v p_v x_v (as
    ``scaled_logprobs``), with the exponentials written over x (no entropy) or into one more [n, V] buffer."""
    n = hidden.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if with_entropy else None
    with torch.autocast(hidden.device.type, enabled=False):  # float32 here; the matmul casts to ``compute``
        for s in range(0, n, slice_tokens):
            _score_slice(
                hidden, weight, targets, allowed, temperature, compute, logp, entropy, s, slice_tokens
            )
    return logp, entropy


def _score_slice(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    allowed: Tensor | None,
    temperature: float,
    compute: torch.dtype,
    logp: Tensor,
    entropy: Tensor | None,
    s: int,
    slice_tokens: int,
) -> None:
    """Rows [s, s + slice_tokens) of ``logp`` (and ``entropy``), written in place."""
    e = min(hidden.shape[0], s + slice_tokens)
    x, keep = _slice_scaled(
        hidden[s:e], weight, None if allowed is None else allowed[s:e], temperature, compute
    )
    picked = x.gather(-1, targets[s:e].unsqueeze(-1)).squeeze(-1)
    top = x.amax(dim=-1, keepdim=True)
    if entropy is None:
        total = x.sub_(top).exp_().sum(-1)
        lse = top.squeeze(-1) + total.log()
    else:
        p = x.sub(top).exp_()
        total = p.sum(-1)
        lse = top.squeeze(-1) + total.log()
        p.div_(total.unsqueeze(-1))
        if keep is not None:
            x.masked_fill_(~keep, 0.0)  # p_v = 0 there
        entropy[s:e] = lse - torch.bmm(p.unsqueeze(1), x.unsqueeze(2)).view(-1)
    logp[s:e] = picked - lse


class _TokenScores(torch.autograd.Function):
    """``token_scores`` with grad: saves the inputs only; the backward recomputes slice by slice."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, allowed, temperature, slice_tokens, with_entropy, compute):
        logp, entropy = _scores_forward(
            hidden, weight, targets, allowed, temperature, slice_tokens, with_entropy, compute
        )
        ctx.save_for_backward(hidden, weight, targets, allowed, entropy)
        ctx.settings = (temperature, slice_tokens, with_entropy, compute)
        return logp, entropy if entropy is not None else logp.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, allowed, entropy = ctx.saved_tensors
        temperature, slice_tokens, with_entropy, compute = ctx.settings
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        with torch.autocast(hidden.device.type, enabled=False):
            _TokenScores._backward_slices(
                ctx, hidden, weight, targets, allowed, entropy, grad_logp, grad_entropy, grad_h, grad_w
            )
        return (
            grad_h,
            grad_w.to(weight.dtype) if need_w else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )

    @staticmethod
    def _backward_slices(
        ctx, hidden, weight, targets, allowed, entropy, grad_logp, grad_entropy, grad_h, grad_w
    ):
        temperature, slice_tokens, with_entropy, compute = ctx.settings
        need_h, need_w = grad_h is not None, grad_w is not None
        w = weight.to(compute)
        n = hidden.shape[0]
        for s in range(0, n, slice_tokens):
            e = min(n, s + slice_tokens)
            h = hidden[s:e].to(compute)
            x, keep = _slice_scaled(
                h, weight, None if allowed is None else allowed[s:e], temperature, compute
            )
            x.sub_(x.amax(dim=-1, keepdim=True))
            g1 = grad_logp[s:e].float().unsqueeze(-1)
            if with_entropy and grad_entropy is not None:
                p = torch.exp(x)
                total = p.sum(-1, keepdim=True)
                p.div_(total)
                x.sub_(total.log())  # log p
                # x <- -p * (g_logp + g_H * (log p + H)): the softmax terms of both gradients
                x.add_(entropy[s:e].unsqueeze(-1)).mul_(grad_entropy[s:e].float().unsqueeze(-1)).add_(g1)
                x.mul_(p).neg_()
                if keep is not None:
                    x.masked_fill_(~keep, 0.0)
                del p
            else:
                x.exp_()
                x.div_(x.sum(-1, keepdim=True)).mul_(g1).neg_()  # -p g_logp
            x.scatter_add_(-1, targets[s:e].unsqueeze(-1), g1)
            if temperature != 1.0:
                x.div_(temperature)
            g = x.to(compute)
            del x
            if need_h:
                grad_h[s:e] = (g @ w).to(hidden.dtype)
            if need_w:
                grad_w += (g.t() @ h).float()
            del g, h  # before the next slice's logits


class ReferenceLogprobCache:
    """An LRU map from row key to that row's reference log-prob per action token (float32, CPU)."""

    def __init__(self, max_rows: int):
        if max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        self.max_rows = int(max_rows)
        self._rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._rows)

    def missing(self, keys: list[bytes]) -> list[int]:
        """Positions of the keys without an entry (counted as misses; the others as hits)."""
        out = [j for j, key in enumerate(keys) if key not in self._rows]
        self.misses += len(out)
        self.hits += len(keys) - len(out)
        return out

    def put(self, keys: list[bytes], logp: torch.Tensor, lengths: list[int]) -> None:
        """Store row j's first ``lengths[j]`` values of ``logp`` [n, M] under ``keys[j]``."""
        if self.max_rows == 0:
            return
        values = logp.detach().to("cpu", torch.float32)
        for key, row, n in zip(keys, values, lengths, strict=True):
            self._rows[key] = row[:n].clone()
            self._rows.move_to_end(key)
        while len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)

    def get_state(self) -> dict:
        """The entries in LRU order and the counters, as flat arrays: a restored learner needs the same values,
        since a recomputed one differs from the cached one by the rounding of the batch it came in."""
        rows = list(self._rows.values())
        return {
            "max_rows": self.max_rows,
            "keys": list(self._rows.keys()),
            "lengths": np.array([len(r) for r in rows], dtype=np.int64),
            "values": torch.cat(rows).numpy() if rows else np.zeros(0, dtype=np.float32),
            "hits": self.hits,
            "misses": self.misses,
        }

    def set_state(self, state: dict) -> None:
        """Replace the entries and counters with ``state`` (from ``get_state``); this cache's ``max_rows`` holds."""
        keys, lengths = state["keys"], np.asarray(state["lengths"], dtype=np.int64)
        values = torch.as_tensor(np.array(state["values"], dtype=np.float32))
        if len(keys) != len(lengths) or int(lengths.sum()) != values.numel():
            raise ValueError(
                f"reference cache state: {len(keys)} keys, {len(lengths)} lengths summing to {int(lengths.sum())}, "
                f"{values.numel()} values"
            )
        self._rows = OrderedDict(zip(keys, torch.split(values, lengths.tolist()), strict=True))
        while len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)
        self.hits, self.misses = int(state["hits"]), int(state["misses"])

    def gather(self, keys: list[bytes], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The stored rows as one [len(keys), width] tensor, zero-padded on the right; every key must be stored."""
        out = torch.zeros((len(keys), width), dtype=torch.float32)
        for j, key in enumerate(keys):
            row = self._rows[key]
            self._rows.move_to_end(key)
            out[j, : len(row)] = row
        return out.to(device)


@dataclass(frozen=True)
class UniqueRows:
    """``index[j]``: the first batch row of distinct row j; ``inverse[i]``: the distinct row of batch row i."""

    index: list[int]
    inverse: torch.Tensor
    keys: list[Hashable]

    @property
    def share(self) -> float:
        """Distinct rows per batch row (1.0: nothing repeats)."""
        return len(self.index) / max(1, len(self.inverse))


def row_keys(
    prompt_ids: np.ndarray,
    prompt_len: Sequence[int],
    action_ids: np.ndarray,
    action_len: Sequence[int],
    allowed_ids: np.ndarray | None = None,
) -> list[bytes]:
    """A digest per row of its prompt tokens, action tokens and (when constrained) allowed tokens per position.

    Padding is stripped first (``prompt_ids`` left-padded, ``action_ids`` right-padded, ``allowed_ids`` padded
    with -1), so a row's key does not depend on the batch it came in: the reference cache relies on that.
    """
    width = prompt_ids.shape[1]
    keys = []
    for i, (n, m) in enumerate(zip(prompt_len, action_len, strict=True)):
        allowed = None if allowed_ids is None else [pos[pos >= 0] for pos in allowed_ids[i, :m]]
        keys.append(_digest(prompt_ids[i, width - n :], action_ids[i, :m], allowed))
    return keys


def row_keys_of(
    prompts: Sequence[Sequence[int]],
    actions: Sequence[Sequence[int]],
    allowed_masks: Sequence[torch.Tensor | None] | None = None,
) -> list[bytes]:
    """``row_keys`` of unpadded rows: prompt and action token lists and optional [m, V] allowed masks."""
    keys = []
    for b, (p, a) in enumerate(zip(prompts, actions, strict=True)):
        mask = None if allowed_masks is None else allowed_masks[b]
        allowed = None if mask is None else [torch.nonzero(row).flatten().numpy() for row in mask.cpu()]
        keys.append(_digest(p, a, allowed))
    return keys


def _digest(prompt: Sequence[int], action: Sequence[int], allowed: Sequence[np.ndarray] | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(prompt, dtype=np.int64).tobytes())
    h.update(b"|")
    h.update(np.ascontiguousarray(action, dtype=np.int64).tobytes())
    if allowed is not None:
        for pos in allowed:
            h.update(b"/")
            h.update(np.ascontiguousarray(pos, dtype=np.int64).tobytes())
    return h.digest()


def unique_rows(keys: Sequence[Hashable]) -> UniqueRows:
    """Group equal keys: the distinct rows in order of first occurrence and each row's distinct index."""
    first: dict[Hashable, int] = {}
    index: list[int] = []
    inverse = []
    for i, key in enumerate(keys):
        j = first.get(key)
        if j is None:
            j = first[key] = len(index)
            index.append(i)
        inverse.append(j)
    return UniqueRows(
        index=index, inverse=torch.as_tensor(inverse, dtype=torch.long), keys=[keys[i] for i in index]
    )


def length_chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Positions of ``lengths`` sorted by length and cut into chunks of at most ``max_tokens`` padded tokens.

    A batch is padded to its longest row; sorting first keeps short rows (first steps without history) out of
    long rows' padding. Every chunk holds at least one row, so a row longer than ``max_tokens`` is a chunk alone.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # rows are sorted ascending, so the chunk's width is the newest row's length
        if current and (len(current) + 1) * lengths[i] > max_tokens:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def token_chunks(units: Sequence[tuple[int, int]], max_tokens: int) -> list[list[int]]:
    """Positions of ``units`` ((rows, width) each: rows forwarded together, the longest prompt + answer among
    them) sorted by width and cut into chunks of at most ``max_tokens`` padded tokens, rows x widest width.

    The learner's chunks: the budget counts every token a forward holds, answers included, so a chunk's
    activation memory is bounded whatever the answers' lengths. The cuts minimise the padded tokens plus
    ``max_tokens / 32`` per chunk (a forward's fixed cost), by dynamic programming over the sorted units: padding
    stays a few percent where a greedy cut leaves the long tail of answer lengths in wide chunks. A unit over the
    budget is a chunk alone.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(units)), key=lambda i: (units[i][1], i))
    rows = [units[i][0] for i in order]
    widths = [units[i][1] for i in order]
    penalty = max_tokens / 32
    # best[j]: least cost of the first j sorted units; start[j]: where the last chunk of that solution begins
    best = [0.0] + [math.inf] * len(order)
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        held = 0
        for i in range(j - 1, -1, -1):
            held += rows[i]
            padded = held * widths[j - 1]  # sorted: the chunk's widest unit is its last
            if padded > max_tokens and i < j - 1:
                break
            cost = best[i] + padded + penalty
            if cost < best[j]:
                best[j], start[j] = cost, i
    chunks: list[list[int]] = []
    j = len(order)
    while j:
        chunks.append(order[start[j] : j])
        j = start[j]
    return chunks[::-1]


def back_in_order(order: Sequence[int]) -> torch.Tensor:
    """Indices that put outputs computed in ``order`` (the chunks' rows, concatenated) back in row order."""
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.as_tensor(list(order), dtype=torch.long)] = torch.arange(len(order))
    return back
