"""What the learners agree on: the world, summed counts, and one optimizer step's statistics.

Every function here is a collective when the learners form a process group (N > 1): all learners must call it
the same number of times, in the same order. With one learner they compute the same thing locally.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

__all__ = ["StepStats", "agree_max", "agree_sum", "reduce_step_stats", "world"]


def world() -> tuple[int, int]:
    """(world size, rank) of the learners' process group; (1, 0) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _all_reduce(values: list[float], op: dist.ReduceOp, device: torch.device) -> list[float]:
    if world()[0] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.cpu().tolist()


def agree_sum(value: float, device: torch.device) -> float:
    """The sum of ``value`` over the learners."""
    return _all_reduce([float(value)], dist.ReduceOp.SUM, device)[0]


def agree_max(value: float, device: torch.device) -> float:
    """The largest ``value`` over the learners."""
    return _all_reduce([float(value)], dist.ReduceOp.MAX, device)[0]


@dataclasses.dataclass
class StepStats:
    """One optimizer step's statistics on this learner, accumulated over its chunks.

    ``rows`` counts the step's trained rows (``global_rows``: on all learners, once reduced); ``means`` are
    weighted by the rows they were taken over, ``highs`` / ``lows`` are extremes; ``finite`` is False as soon as a
    chunk's loss was not finite (``skipped``: the learners agreed to skip the step); ``samples`` keeps per-row
    values a statistic needs whole (explained variance).
    """

    rows: float = 0.0
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    highs: dict[str, float] = dataclasses.field(default_factory=dict)
    lows: dict[str, float] = dataclasses.field(default_factory=dict)
    finite: bool = True
    global_rows: float = 0.0
    skipped: bool = False
    samples: dict[str, list[torch.Tensor]] = dataclasses.field(default_factory=dict)

    def add(self, rows: float, means: dict[str, float], *, highs=None, lows=None) -> None:
        """Means over ``rows`` rows of a chunk and its extremes (ignored when ``rows`` is 0)."""
        if rows <= 0:
            return
        for name, value in means.items():
            self.sums[name] = self.sums.get(name, 0.0) + value * rows
            self.weights[name] = self.weights.get(name, 0.0) + rows
        for name, value in (highs or {}).items():
            self.highs[name] = max(self.highs.get(name, -math.inf), value)
        for name, value in (lows or {}).items():
            self.lows[name] = min(self.lows.get(name, math.inf), value)


def reduce_step_stats(
    stats: StepStats, device: torch.device, *, means: Iterable[str], highs: Iterable[str], lows: Iterable[str]
) -> tuple[dict[str, float], float]:
    """(statistics over all learners' rows, their row count): row-weighted means, maxima and minima.

    The names are fixed by the config, so every learner reduces vectors of the same length (two all-reduces).
    A name no learner has a value for is left out; a learner without rows contributes nothing.
    """
    means, highs, lows = list(means), list(highs), list(lows)
    sums = _all_reduce(
        [stats.rows] + [stats.sums.get(k, 0.0) for k in means] + [stats.weights.get(k, 0.0) for k in means],
        dist.ReduceOp.SUM,
        device,
    )
    extremes = _all_reduce(
        [stats.highs.get(k, -math.inf) for k in highs] + [-stats.lows.get(k, math.inf) for k in lows],
        dist.ReduceOp.MAX,
        device,
    )
    total = sums[0]
    if total <= 0:
        return {}, 0.0
    n = len(means)
    out = {k: s / w for k, s, w in zip(means, sums[1 : 1 + n], sums[1 + n :], strict=True) if w > 0}
    for i, (k, v) in enumerate(zip(highs + lows, extremes, strict=True)):
        if math.isfinite(v):
            out[k] = v if i < len(highs) else -v
    return out, total
