"""The reference log-prob cache: stored rows come back exactly, counted, least recently used evicted first."""

from __future__ import annotations

import pytest
import torch

from gagpo_rllib.policy.logprobs import ReferenceLogprobCache


def test_rows_come_back_padded_and_hits_are_counted() -> None:
    cache = ReferenceLogprobCache(max_rows=10)
    assert cache.missing([b"a", b"b"]) == [0, 1]
    cache.put([b"a", b"b"], torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]), [2, 1])
    assert cache.missing([b"b", b"c", b"a"]) == [1]
    assert (cache.hits, cache.misses) == (2, 3)
    got = cache.gather([b"b", b"a"], width=4)
    torch.testing.assert_close(got, torch.tensor([[-0.5, 0.0, 0.0, 0.0], [-1.0, -2.0, 0.0, 0.0]]))


def test_least_recently_used_rows_are_evicted_and_zero_keeps_nothing() -> None:
    cache = ReferenceLogprobCache(max_rows=2)
    one = torch.zeros((1, 1))
    cache.put([b"a"], one, [1])
    cache.put([b"b"], one, [1])
    cache.gather([b"a"], width=1)  # "a" used last: "b" goes first
    cache.put([b"c"], one, [1])
    assert len(cache) == 2 and cache.missing([b"a", b"b", b"c"]) == [1]
    off = ReferenceLogprobCache(max_rows=0)
    off.put([b"a"], one, [1])
    assert len(off) == 0 and off.missing([b"a"]) == [0]
    with pytest.raises(ValueError, match="max_rows"):
        ReferenceLogprobCache(max_rows=-1)


def test_state_round_trip_keeps_values_order_and_counters() -> None:
    cache = ReferenceLogprobCache(max_rows=3)
    cache.put(
        [b"a", b"b", b"c"], torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0], [0.6, 0.0, 0.0]]), [3, 2, 1]
    )
    cache.missing([b"a", b"z"])
    cache.gather([b"a"], 3)  # a is now the most recently used
    restored = ReferenceLogprobCache(max_rows=3)
    restored.set_state(cache.get_state())
    assert (restored.hits, restored.misses) == (cache.hits, cache.misses) == (1, 1)
    assert torch.equal(restored.gather([b"b", b"c", b"a"], 3), cache.gather([b"b", b"c", b"a"], 3))
    restored.put([b"d"], torch.tensor([[0.7]]), [1])  # evicts the least recently used: b
    assert restored.missing([b"b"]) == [0] and restored.missing([b"c", b"a", b"d"]) == []
    smaller = ReferenceLogprobCache(max_rows=1)
    smaller.set_state(cache.get_state())
    assert len(smaller) == 1
    empty = ReferenceLogprobCache(max_rows=3)
    empty.set_state(ReferenceLogprobCache(max_rows=3).get_state())
    assert len(empty) == 0
    bad = cache.get_state() | {"lengths": [3, 2]}
    with pytest.raises(ValueError, match="reference cache state"):
        restored.set_state(bad)
