"""The seed hashes and salts: pinned values (a changed value changes which tasks and samples a seed gives)."""

from __future__ import annotations

import numpy as np
import pytest

from gagpo_rllib.method import seeds
from gagpo_rllib.method.seeds import SALTS, derive_seed, mix_seed, salted_rng


def test_derive_seed_keeps_the_low_words_only() -> None:
    assert [derive_seed(1, 2, 3), derive_seed(2**40 + 5, 7), derive_seed(0)] == [
        1911094848,
        1262370631,
        1484405855,
    ]
    assert derive_seed(2**40 + 5, 7) == derive_seed(5, 7)
    assert all(0 <= derive_seed(s, 9) < 2**31 for s in range(50))


def test_mix_seed_keeps_the_high_words_and_differs_from_derive_seed() -> None:
    assert [mix_seed(1, 2, 3), mix_seed(2**40 + 5, 7), mix_seed(7, 0)] == [1626151614, 1446790504, 1041839916]
    assert mix_seed(2**40 + 5, 7) != mix_seed(5, 7)
    assert mix_seed(1, 2, 3) != derive_seed(1, 2, 3)


def test_salts_are_pinned_and_distinct() -> None:
    assert SALTS == {
        "TASK_PLAN_SALT": 0x6A6,
        "EXTRA_PLAN_SALT": 0xD5,
        "EVALUATION_SALT": 0xE7A1,
        "BOOTSTRAP_SALT": 0x626F6F74,
        "DEMONSTRATION_TASKS_SALT": 0xDE30,
        "EXPERT_FALLBACK_SALT": 0xDE31,
        "SFT_HELDOUT_SALT": 0x5F7,
        "SFT_ORDER_SALT": 0x5F8,
        "SFT_SUBSET_SALT": 0x5F9,
    }
    assert len(set(SALTS.values())) == len(SALTS)
    assert all(getattr(seeds, name) == value for name, value in SALTS.items())
    assert {n for n in seeds.__all__ if n.endswith("_SALT")} == set(SALTS)


@pytest.mark.parametrize(
    ("salt", "draw"),
    [
        (0x626F6F74, [193153, 376756, 272439]),
        (0xDE30, [767896, 702489, 759917]),
        (0x5F7, [46207, 341594, 884564]),
        (0x5F8, [277204, 504346, 311144]),
        (0x5F9, [516050, 566254, 969496]),
        (0xE7A1, [824435, 554797, 176020]),
    ],
)
def test_salted_streams_are_pinned(salt: int, draw: list[int]) -> None:
    assert salted_rng(5, salt).integers(0, 10**6, 3).tolist() == draw
    expected = np.random.default_rng(np.random.SeedSequence([5, salt])).integers(0, 10**6, 3).tolist()
    assert expected == draw
