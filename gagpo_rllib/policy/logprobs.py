"""Per-token log-probs of actions given prompts, with the same numerics as the rollout backend.

The rollout backend and the learner both call ``scaled_logprobs`` on float32 logits, so on CPU the first-minibatch
ratio is 1 (up to the tiny difference between an incremental KV-cache forward and a full forward).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

__all__ = [
    "action_logprobs",
    "cache_keyword",
    "checkpointing",
    "kv_cache",
    "last_mlp_only_on_last_column",
    "left_pad",
    "padded_positions",
    "prompt_cache",
    "scaled_logprobs",
    "shared_prompt_logprobs",
]


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
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Log-probs of each action token: returns (logp [B, M], mask [B, M], entropy [B, M] or None).

    Prompts are left-padded, actions right-padded; position ids are cumsum(attention_mask) - 1 as in generate.
    ``allowed_masks[b]`` ([m_b, V] bool, or None) restricts the softmax to the allowed set at each position.
    """
    _check_rows(prompt_ids, action_ids, allowed_masks, rows=prompt_ids, rows_name="prompt_ids")
    device = next(model.parameters()).device
    bsz = len(prompt_ids)
    plen = max(len(p) for p in prompt_ids)
    alen = max(len(a) for a in action_ids)
    input_ids = torch.full((bsz, plen + alen), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((bsz, plen + alen), dtype=torch.long)
    for b, (p, a) in enumerate(zip(prompt_ids, action_ids, strict=True)):
        input_ids[b, plen - len(p) : plen] = torch.as_tensor(p, dtype=torch.long)
        input_ids[b, plen : plen + len(a)] = torch.as_tensor(a, dtype=torch.long)
        attn[b, plen - len(p) : plen + len(a)] = 1
    position_ids = padded_positions(attn)
    targets = input_ids[:, plen:].to(device)
    mask = attn[:, plen:].to(device=device, dtype=torch.float32)

    out = model(
        input_ids=input_ids.to(device),
        attention_mask=attn.to(device),
        position_ids=position_ids.to(device),
        logits_to_keep=alen + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # position plen-1+k predicts action token k
    return _masked_scores(logits, targets, mask, allowed_masks, action_ids, temperature, with_entropy)


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
    out = model(
        input_ids=torch.cat([last, targets[:, : alen - 1]], dim=1).to(device),
        attention_mask=row_attn.to(device),
        position_ids=(start + torch.arange(alen)).to(device),
        use_cache=True,
        **prompt_cache(model, input_ids.to(device), attn.to(device), rows=rows.to(device)),
    )
    mask = action_mask.to(device=device, dtype=torch.float32)
    return _masked_scores(
        out.logits, targets.to(device), mask, allowed_masks, action_ids, temperature, with_entropy
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


def _allowed_tensor(
    allowed_masks: list[Tensor | None] | None,
    action_ids: list[list[int]],
    bsz: int,
    alen: int,
    vocab: int,
    device: torch.device,
) -> Tensor | None:
    """The per-row allowed masks as one [B, alen, V] bool tensor (None when no row is constrained)."""
    if allowed_masks is None or all(m is None for m in allowed_masks):
        return None
    allowed = torch.zeros((bsz, alen, vocab), dtype=torch.bool, device=device)
    for b, m in enumerate(allowed_masks):
        if m is None:
            allowed[b] = True
            continue
        if m.shape != (len(action_ids[b]), vocab):
            raise ValueError(
                f"allowed_masks[{b}]: shape {tuple(m.shape)}, expected ({len(action_ids[b])}, {vocab})"
            )
        allowed[b, : m.shape[0]] = m.to(device)
    return allowed


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


def _masked_scores(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    allowed_masks: list[Tensor | None] | None,
    action_ids: list[list[int]],
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logp, mask, entropy) of the action tokens from their logits [B, alen, V], zero where ``mask`` is 0."""
    bsz, alen, vocab = logits.shape
    allowed = _allowed_tensor(allowed_masks, action_ids, bsz, alen, vocab, logits.device)
    logp, entropy = scaled_logprobs(
        logits, targets, temperature=temperature, allowed=allowed, with_entropy=with_entropy
    )
    logp = logp * mask
    if entropy is not None:
        entropy = entropy * mask
    return logp, mask, entropy
