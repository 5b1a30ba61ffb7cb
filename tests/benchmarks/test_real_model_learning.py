"""The real-model benchmark's run summary: what its page reads from a run's CSV."""

from __future__ import annotations

import math

import benchmarks.real_model_learning as rml


def _row(phase: str, iteration: int, elapsed: float, **values) -> dict:
    return {"phase": phase, "iteration": str(iteration), "elapsed_s": str(elapsed), **values}


def test_summary_reads_start_end_and_grouping_means() -> None:
    rows = [
        _row(rml.WARM, 0, 60.0, seconds="60.0"),
        _row(rml.BEFORE, 0, 90.0, success="0.25", score="0.5"),
        _row(rml.TRAIN, 1, 120.0, episodes="8", singleton_share="0.2", adv_zero_share="0.4"),
        _row(rml.TRAIN, 2, 130.0, episodes="0", singleton_share="nan", adv_zero_share=""),  # nothing played
        _row(rml.TRAIN, 3, 150.0, singleton_share="0.6", adv_zero_share="0.8"),
        _row(rml.AFTER, 3, 180.0, success="0.5", score="0.75"),
    ]
    s = rml.summary(rows)
    assert (s["before"], s["after"], s["score_before"], s["score_after"]) == (0.25, 0.5, 0.5, 0.75)
    assert (s["iterations"], s["empty_iterations"], s["warm_start_s"], s["wall_s"]) == (3, 1, 60.0, 180.0)
    assert s["finished"]
    assert math.isclose(s["singleton_share"], 0.4) and math.isclose(s["adv_zero_share"], 0.6)


def test_summary_of_a_run_logged_before_the_grouping_columns() -> None:
    rows = [_row(rml.WARM, 0, 60.0, seconds="60.0"), _row(rml.TRAIN, 1, 120.0)]
    s = rml.summary(rows)
    assert math.isnan(s["singleton_share"]) and math.isnan(s["adv_zero_share"])
    assert not s["finished"] and (s["iterations"], s["empty_iterations"]) == (1, 0)
