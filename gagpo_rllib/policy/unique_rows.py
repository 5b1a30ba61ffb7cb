"""Distinct (prompt, action, allowed set) rows of a learner batch, and length-sorted chunks of them.

The K rollouts of a group often repeat a step exactly (same prompt, same action): on the built-in maze about 30% of
a batch's rows are repeats. A repeat has the same log-probs, ratio, KL and entropy as its first occurrence, so the
learner's forward runs once per distinct row and the per-row terms are gathered back (``inverse``); only the
advantage differs per row, and the loss, a per-row mean, is unchanged. The gather's backward sums the repeats'
gradients onto the shared row, which is the gradient of the full batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["UniqueRows", "back_in_order", "length_chunks", "row_keys", "unique_rows"]


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
        h = hashlib.blake2b(digest_size=16)
        h.update(np.ascontiguousarray(prompt_ids[i, width - n :], dtype=np.int64).tobytes())
        h.update(b"|")
        h.update(np.ascontiguousarray(action_ids[i, :m], dtype=np.int64).tobytes())
        if allowed_ids is not None:
            for pos in allowed_ids[i, :m]:
                h.update(b"/")
                h.update(np.ascontiguousarray(pos[pos >= 0], dtype=np.int64).tobytes())
        keys.append(h.digest())
    return keys


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


def back_in_order(order: Sequence[int]) -> torch.Tensor:
    """Indices that put outputs computed in ``order`` (the chunks' rows, concatenated) back in row order."""
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.as_tensor(list(order), dtype=torch.long)] = torch.arange(len(order))
    return back
