"""Seed-level statistics of learning benchmarks: means with seeded percentile-bootstrap intervals, paired gaps.

A benchmark run gives one number per (estimator, seed), e.g. the area under the success curve. With a handful of
seeds, a mean +- std says little about ranking; a 95% bootstrap interval of the mean, and of the per-seed paired
difference between two estimators trained on the same seeds, do. Pure numpy, every resampling from an explicit
seed, so a table computed from the same CSVs is the same table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gagpo_rllib.method.seeds import BOOTSTRAP_SALT, salted_rng

__all__ = ["Interval", "bootstrap_interval", "mean_interval", "paired_differences"]


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values and its bootstrap interval [low, high] at `confidence`; NaN bounds when n < 2."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float

    def format(self, digits: int = 3) -> str:
        """'0.436 [0.370, 0.501]', or '0.436 (n=1)' when no interval exists."""
        if self.n < 2:
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _values(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"values must be finite, got {array.tolist()}")
    return array


def bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: resample the values with replacement `n_resamples` times.

    Returns the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of the resampled means; (nan, nan) for a
    single value (no spread to resample).
    """
    array = _values(values)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 100:
        raise ValueError(f"n_resamples must be an int >= 100, got {n_resamples!r}")
    if array.size < 2:
        return float("nan"), float("nan")
    rng = salted_rng(seed, BOOTSTRAP_SALT)
    means = array[rng.integers(array.size, size=(int(n_resamples), array.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def mean_interval(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> Interval:
    """The mean of `values` with its percentile-bootstrap interval (see ``bootstrap_interval``)."""
    array = _values(values)
    low, high = bootstrap_interval(array, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Interval(float(array.mean()), low, high, int(array.size), float(confidence))


def paired_differences(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """a[seed] - b[seed] over the seeds both have, in seed order; raises ValueError when they share none.

    Pairing by seed removes what the seed does to both runs (task draws, initial weights), so the interval of the
    mean difference is the one to read for "is A better than B".
    """
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError(f"no seed in common: a has {sorted(a)}, b has {sorted(b)}")
    return shared, np.array([float(a[s]) - float(b[s]) for s in shared])
