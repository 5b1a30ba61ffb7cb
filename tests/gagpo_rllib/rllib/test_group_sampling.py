"""group_sampling's settings and plan split, without Ray (the runs on real EnvRunners: test_fault_tolerance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagpo_rllib.rllib.group_sampling import split_plan, task_plan
from tests.gagpo_rllib.toy_env import make_config


def test_fault_tolerance_sets_group_settings_and_rllibs(tiny_policy_path: Path) -> None:
    config = make_config(tiny_policy_path).fault_tolerance(
        max_group_attempts=5, group_sampling_timeout_s=None, delay_between_env_runner_restarts_s=1.0
    )
    config.validate()
    assert config.max_group_attempts == 5 and config.group_sampling_timeout_s is None
    assert config.delay_between_env_runner_restarts_s == 1.0
    default = make_config(tiny_policy_path)
    assert default.max_group_attempts == 3 and default.group_sampling_timeout_s == 3600.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_group_attempts", 0),
        ("max_group_attempts", 2.5),
        ("max_group_attempts", True),
        ("group_sampling_timeout_s", 0),
        ("group_sampling_timeout_s", "60"),
    ],
)
def test_bad_fault_tolerance_settings_name_the_field(tiny_policy_path: Path, field: str, value) -> None:
    config = make_config(tiny_policy_path).fault_tolerance(**{field: value})
    with pytest.raises(ValueError, match=f"GAGPOConfig.{field}"):
        config.validate()


def test_split_plan_keeps_order_and_can_split_a_group() -> None:
    plan = task_plan(10, groups=3, group_size=2, seed=0, iteration=4)
    shares = split_plan(plan, 2)
    assert sum(shares, []) == plan and [len(s) for s in shares] == [3, 3]
    assert {p.group_id for p in shares[0]} & {p.group_id for p in shares[1]} == {plan[2].group_id}
    assert sorted(len(s) for s in split_plan(plan[:1], 2)) == [0, 1]  # fewer episodes than runners
