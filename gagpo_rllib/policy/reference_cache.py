"""Reference log-probs kept across updates: the reference policy is frozen, so a row's values never change.

Multi-turn tasks revisit the same states with the same actions over iterations (on the built-in maze 90% of the
distinct rows of an iteration after the tenth were seen before), so most of the reference forward is a repeat.
Entries are keyed by ``unique_rows.row_keys`` (prompt, action and allowed tokens, padding stripped) and evicted
least recently used beyond ``max_rows``. A cached value equals a fresh forward up to float rounding of the batch
it was computed in.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["ReferenceLogprobCache"]


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

    def gather(self, keys: list[bytes], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The stored rows as one [len(keys), width] tensor, zero-padded on the right; every key must be stored."""
        out = torch.zeros((len(keys), width), dtype=torch.float32)
        for j, key in enumerate(keys):
            row = self._rows[key]
            self._rows.move_to_end(key)
            out[j, : len(row)] = row
        return out.to(device)
