"""Task plans and episode seeds: pure functions of the seeds, pinned to the values the project has always drawn."""

from __future__ import annotations

import numpy as np
import pytest

from gagpo_rllib.method.seeds import derive_seed, shuffle_rng
from gagpo_rllib.rllib.evaluation import EvalSettings
from gagpo_rllib.rllib.group_sampling import (
    EXTRA_GROUP_ID_BASE,
    episode_gen_seed,
    evaluation_plan,
    extra_plan,
    split_plan,
    task_plan,
    validation_seed,
)

K = 2


def rows(plan) -> list[tuple[int, int, int, int]]:
    return [(p.group_id, p.task_id, p.member, p.env_seed) for p in plan]


def test_plans_are_pinned() -> None:
    assert rows(task_plan(10, groups=3, group_size=2, seed=1, iteration=5)) == [
        (15, 1, 0, 1512519744),
        (15, 1, 1, 1606465660),
        (16, 2, 0, 78574531),
        (16, 2, 1, 486626800),
        (17, 6, 0, 2040719223),
        (17, 6, 1, 1354591572),
    ]
    # A seed above 32 bits: the task draw and the env seeds use its low 32 bits.
    assert rows(task_plan(7, groups=2, group_size=1, seed=2**33 + 3, iteration=2)) == [
        (4, 2, 0, 480164916),
        (5, 3, 0, 880429255),
    ]
    first = EXTRA_GROUP_ID_BASE + 7
    assert rows(
        extra_plan(10, groups=2, group_size=2, seed=1, iteration=5, round_index=2, first_group_id=first)
    ) == [
        (first, 3, 0, 336208737),
        (first, 3, 1, 1982593639),
        (first + 1, 9, 0, 1739129690),
        (first + 1, 9, 1, 756325985),
    ]
    assert rows(evaluation_plan(50, EvalSettings(num_tasks=4, episodes_per_task=2, seed=3))) == [
        (0, 7, 0, 1290012232),
        (0, 7, 1, 1501564303),
        (1, 26, 0, 159575955),
        (1, 26, 1, 1291064344),
        (2, 35, 0, 534269669),
        (2, 35, 1, 288076117),
        (3, 46, 0, 1265337922),
        (3, 46, 1, 804981650),
    ]


def test_episode_seeds_are_pinned() -> None:
    plan = task_plan(10, groups=1, group_size=1, seed=0, iteration=3)
    assert episode_gen_seed(0, 3, plan[0], 1) == derive_seed(0, 3, plan[0].group_id, 0, 1)
    item = evaluation_plan(5, EvalSettings(seed=0))[0]
    assert episode_gen_seed(0, 3, item, 0) == 733663066
    assert validation_seed(0) == derive_seed(0, 0xE7A1) != 0
    assert shuffle_rng(3, 4, 1, 0).permutation(6).tolist() == [2, 4, 1, 0, 3, 5]
    assert np.array_equal(shuffle_rng(3, 4, 1, 0).random(3), np.random.default_rng([3, 4, 1, 0]).random(3))


def test_task_plan_is_a_function_of_seed_and_iteration() -> None:
    a = task_plan(10, groups=4, group_size=3, seed=1, iteration=5)
    assert a == task_plan(10, groups=4, group_size=3, seed=1, iteration=5)
    assert [p.task_id for p in a] != [
        p.task_id for p in task_plan(10, groups=4, group_size=3, seed=1, iteration=6)
    ]
    assert len({p.task_id for p in a}) == 4  # without replacement while N <= num_tasks
    assert [p.member for p in a[:3]] == [0, 1, 2] and len({p.group_id for p in a}) == 4
    assert len({p.env_seed for p in a}) == 12
    shares = split_plan(a, 5)
    assert sum(shares, []) == a and max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError, match="num_tasks"):
        task_plan(0, groups=1, group_size=1, seed=0, iteration=0)


def test_extra_plans_are_deterministic_and_never_reuse_a_group_id() -> None:
    a = extra_plan(
        10, groups=3, group_size=K, seed=1, iteration=5, round_index=1, first_group_id=EXTRA_GROUP_ID_BASE
    )
    assert a == extra_plan(
        10, groups=3, group_size=K, seed=1, iteration=5, round_index=1, first_group_id=EXTRA_GROUP_ID_BASE
    )
    b = extra_plan(
        10, groups=3, group_size=K, seed=1, iteration=5, round_index=2, first_group_id=EXTRA_GROUP_ID_BASE + 3
    )
    assert not {p.group_id for p in a} & {p.group_id for p in b}
    assert not {p.env_seed for p in a} & {p.env_seed for p in b}
    first = task_plan(10, groups=4, group_size=K, seed=1, iteration=5)
    assert not {p.group_id for p in first} & {p.group_id for p in a}
    assert not {p.env_seed for p in first} & {p.env_seed for p in a}
    other_seed = extra_plan(
        10, groups=3, group_size=K, seed=2, iteration=5, round_index=1, first_group_id=EXTRA_GROUP_ID_BASE
    )
    assert [p.env_seed for p in other_seed] != [p.env_seed for p in a]
    with pytest.raises(ValueError, match="round_index"):
        extra_plan(10, groups=1, group_size=1, seed=0, iteration=0, round_index=0, first_group_id=0)
