"""Per-row generation seeds: pinned values, and the seed argument's checks."""

from __future__ import annotations

import pytest

from gagpo_rllib.method.seeds import mix_seed
from gagpo_rllib.policy.generation.base import row_seeds


def test_row_seeds_mix_the_call_seed_with_each_index() -> None:
    assert row_seeds(7, 3) == [1041839916, 184785996, 504589498]
    assert row_seeds(7, 3) == [mix_seed(7, i) for i in range(3)]
    assert row_seeds(None, 3) is None
    assert row_seeds([4, 5], 2) == [4, 5]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        row_seeds([4, 5], 3)
