"""The reference log-prob cache: stored rows come back exactly, counted, least recently used evicted first."""

from __future__ import annotations

import pytest
import torch

from gagpo_rllib.policy.reference_cache import ReferenceLogprobCache


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
