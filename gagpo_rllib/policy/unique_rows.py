"""Distinct (prompt, action, allowed set) rows of a learner batch, and length-sorted chunks of them.

The K rollouts of a group often repeat a step exactly (same prompt, same action): on the built-in maze about 30% of
a batch's rows are repeats. A repeat has the same log-probs, ratio, KL and entropy as its first occurrence, so the
learner's forward runs once per distinct row and the per-row terms are gathered back (``inverse``); only the
advantage differs per row, and the loss, a per-row mean, is unchanged. The gather's backward sums the repeats'
gradients onto the shared row, which is the gradient of the full batch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "UniqueRows",
    "back_in_order",
    "length_chunks",
    "row_keys",
    "row_keys_of",
    "token_chunks",
    "unique_rows",
]


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
