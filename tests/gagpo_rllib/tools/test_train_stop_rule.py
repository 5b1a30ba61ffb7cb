"""StopRule: Tune's stop thresholds, the plateau rule and the reason each trial stopped."""

from __future__ import annotations

import pytest

from gagpo_rllib.tools.train import StopRule


def _result(it: int, success: float) -> dict:
    return {"training_iteration": it, "gagpo": {"success_rate": success}}


def test_a_threshold_stops_and_says_which() -> None:
    rule = StopRule({"gagpo/success_rate": 0.8, "training_iteration": 150})
    assert not rule("t", _result(1, 0.5))
    assert rule("t", _result(2, 0.82))
    assert rule.reasons["t"] == "stopped at iteration 2: gagpo/success_rate = 0.82 reached 0.8"


def test_the_budget_stops_and_names_the_goal_not_reached() -> None:
    rule = StopRule({"gagpo/success_rate": 0.8, "training_iteration": 3})
    assert not rule("t", _result(1, 0.2)) and not rule("t", _result(2, 0.6))
    assert rule("t", _result(3, 0.4))
    assert "budget of 3 iterations is spent before reaching gagpo/success_rate 0.8" in rule.reasons["t"]
    assert "best success 60.0%" in rule.reasons["t"]


def test_a_plateau_stops_after_patience_iterations_without_a_rise() -> None:
    rule = StopRule({"training_iteration": 150}, plateau_patience=10, window=5)
    stopped_at = None
    for it in range(1, 151):
        success = min(0.625, 0.1 + 0.02 * it)  # rises, then sits at 62.5% from iteration 27 on
        if rule("t", _result(it, success)):
            stopped_at = it
            break
    assert stopped_at is not None and 35 <= stopped_at <= 45
    assert "success has plateaued" in rule.reasons["t"] and "62.5%" in rule.reasons["t"]
    assert "for 10 iterations" in rule.reasons["t"] and "same return" not in rule.reasons["t"]
    rule = StopRule({}, plateau_patience=3, window=1)
    flat = [
        {**_result(it, 0.5), "gagpo": {"success_rate": 0.5, "uniform_group_share": 1.0}} for it in range(1, 6)
    ]
    assert [rule("u", r) for r in flat] == [False, False, False, True, True]
    assert "100% of the last iteration's groups got the same return" in rule.reasons["u"]


def test_a_slow_rise_is_not_a_plateau_and_other_trials_are_separate() -> None:
    rule = StopRule({"training_iteration": 100}, plateau_patience=10, window=5)
    for it in range(1, 100):
        assert not rule("rising", _result(it, 0.005 * it))  # +2.5% over every 5 iterations
        assert not rule("noisy", _result(it, [0.2, 0.25][it % 2] + 0.004 * it))
    assert "rising" not in rule.reasons


def test_without_patience_a_flat_run_uses_its_budget() -> None:
    rule = StopRule({"training_iteration": 50})
    assert not any(rule("t", _result(it, 0.625)) for it in range(1, 50))
    assert rule("t", _result(50, 0.625))


def test_bad_patience_is_refused() -> None:
    with pytest.raises(ValueError, match="plateau_patience"):
        StopRule({}, plateau_patience=0)


def test_a_train_file_may_set_its_plateau_patience(tmp_path) -> None:
    from gagpo_rllib.tools.train import load_train_file

    head = "from gagpo_rllib import GAGPOConfig\nconfig = GAGPOConfig()\n"
    (tmp_path / "a.py").write_text(head + "PLATEAU_PATIENCE = 12\n")
    (tmp_path / "b.py").write_text(head)
    (tmp_path / "c.py").write_text(head + "PLATEAU_PATIENCE = 0\n")
    assert load_train_file(tmp_path / "a.py").plateau_patience == 12
    assert load_train_file(tmp_path / "b.py").plateau_patience is None
    with pytest.raises(ValueError, match="PLATEAU_PATIENCE must be an int >= 1"):
        load_train_file(tmp_path / "c.py")
