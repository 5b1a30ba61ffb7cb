"""Seed-level statistics: bootstrap intervals against exact and large-sample known cases, paired differences."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from gagpo_rllib.method.stats import Interval, bootstrap_interval, mean_interval, paired_differences


def test_interval_of_a_constant_is_the_constant() -> None:
    assert bootstrap_interval([0.4] * 6) == pytest.approx((0.4, 0.4))


def test_two_values_give_their_full_range() -> None:
    """Resampled means of [0, 1] are 0, 1/2, 1 with probability 1/4, 1/2, 1/4: the 95% interval is [0, 1]."""
    assert bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)


def test_exact_resampling_distribution_of_one_success_in_four() -> None:
    """Means of 4 draws from [0, 0, 0, 1] are Binomial(4, 1/4) / 4: P(mean <= 0.5) = 0.949, so the 97.5%
    quantile is 0.75 and the 2.5% quantile is 0 (P(mean = 0) = 0.316)."""
    assert bootstrap_interval([0.0, 0.0, 0.0, 1.0]) == (0.0, 0.75)
    assert bootstrap_interval([0.0, 0.0, 0.0, 1.0], confidence=0.8) == (0.0, 0.5)  # P(mean <= 0.5) > 0.9


def test_large_sample_interval_matches_the_normal_approximation() -> None:
    values = np.random.default_rng(7).normal(2.0, 3.0, size=400)
    low, high = bootstrap_interval(values)
    half = 1.96 * values.std(ddof=1) / np.sqrt(values.size)
    assert low == pytest.approx(values.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(values.mean() + half, abs=0.1 * half)


def test_agrees_with_scipy_percentile_bootstrap() -> None:
    values = np.random.default_rng(11).exponential(0.3, size=12)
    ours = bootstrap_interval(values, n_resamples=20_000)
    ref = scipy_stats.bootstrap(
        (values,), np.mean, method="percentile", n_resamples=20_000, random_state=np.random.default_rng(1)
    ).confidence_interval
    width = ref.high - ref.low
    assert ours == pytest.approx((ref.low, ref.high), abs=0.05 * width)


def test_covers_the_true_mean_about_as_often_as_stated_at_eight_seeds() -> None:
    """Percentile bootstrap with n = 8 under-covers a little (about 0.90 for 0.95); far off means a bug."""
    rng = np.random.default_rng(5)
    covered = [
        low <= 0.5 <= high
        for low, high in (
            bootstrap_interval(rng.normal(0.5, 0.1, size=8), n_resamples=2_000, seed=i) for i in range(300)
        )
    ]
    assert 0.84 <= np.mean(covered) <= 0.97


def test_same_seed_same_interval_and_different_seed_close() -> None:
    values = np.random.default_rng(9).uniform(size=7)
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    assert bootstrap_interval(values, seed=3) != bootstrap_interval(values, seed=4)
    assert bootstrap_interval(values, seed=3) == pytest.approx(bootstrap_interval(values, seed=4), abs=0.02)


def test_interval_narrows_with_more_values_and_contains_the_mean() -> None:
    rng = np.random.default_rng(2)
    small, large = rng.uniform(size=8), rng.uniform(size=128)
    for values in (small, large):
        low, high = bootstrap_interval(values)
        assert low < values.mean() < high
    assert np.subtract(*bootstrap_interval(large)[::-1]) < 0.5 * np.subtract(*bootstrap_interval(small)[::-1])


def test_one_value_has_no_interval() -> None:
    interval = mean_interval([0.42])
    assert interval.mean == 0.42 and interval.n == 1 and np.isnan(interval.low) and np.isnan(interval.high)
    assert interval.format() == "0.420 (n=1)"


def test_mean_interval_formats_mean_and_bounds() -> None:
    interval = mean_interval([0.0, 1.0])
    assert interval == Interval(0.5, 0.0, 1.0, 2, 0.95)
    assert interval.format(2) == "0.50 [0.00, 1.00]"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"values": []}, "values"),
        ({"values": [[0.1, 0.2]]}, "values"),
        ({"values": [0.1, float("nan")]}, "values"),
        ({"values": [0.1, 0.2], "confidence": 1.0}, "confidence"),
        ({"values": [0.1, 0.2], "n_resamples": 10}, "n_resamples"),
    ],
)
def test_bad_input_raises_naming_the_argument(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        bootstrap_interval(**kwargs)


def test_paired_differences_use_the_shared_seeds_in_order() -> None:
    seeds, diff = paired_differences({2: 0.5, 0: 0.4, 1: 0.3}, {1: 0.1, 0: 0.4, 5: 0.9})
    assert seeds == [0, 1]
    np.testing.assert_allclose(diff, [0.0, 0.2])
    with pytest.raises(ValueError, match="no seed in common"):
        paired_differences({0: 1.0}, {1: 1.0})


def test_paired_interval_excludes_zero_when_one_side_is_consistently_better() -> None:
    """Seed effects dominate both runs (a +- 0.2) but A beats B by 0.05 on every seed: the paired interval
    excludes 0 although the unpaired intervals overlap."""
    seed_effect = np.random.default_rng(4).uniform(-0.2, 0.2, size=8)
    a = {s: 0.5 + e + 0.05 for s, e in enumerate(seed_effect)}
    b = {s: 0.5 + e + 0.01 * (s % 3) for s, e in enumerate(seed_effect)}
    _, diff = paired_differences(a, b)
    low, high = bootstrap_interval(diff)
    assert low > 0.0
    ia, ib = mean_interval(list(a.values())), mean_interval(list(b.values()))
    assert ia.low < ib.high
