"""Reference log-probs kept across updates: the reference policy is frozen, so a row's values never change.

Multi-turn tasks revisit the same states with the same actions over iterations (on the built-in maze 90% of the
distinct rows of an iteration after the tenth were seen before), so most of the reference forward is a repeat.
Entries are keyed by ``unique_rows.row_keys`` (prompt, action and allowed tokens, padding stripped) and evicted
least recently used beyond ``max_rows``. A cached value equals a fresh forward up to float rounding of the batch
it was computed in.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
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
