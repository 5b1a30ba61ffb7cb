"""Distinct learner rows: equal rows share one key whatever their batch padding; length chunks cover every row."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gagpo_rllib.policy.logprobs import length_chunks, row_keys, unique_rows


def _rows(prompts, actions, allowed=None, pw=None, aw=None, k=None):
    """Padded arrays of the learner layout (prompts left-padded with 0, actions right-padded, allowed with -1)."""
    pw = pw or max(map(len, prompts))
    aw = aw or max(map(len, actions))
    p = np.zeros((len(prompts), pw), dtype=np.int64)
    a = np.zeros((len(actions), aw), dtype=np.int64)
    for i, (x, y) in enumerate(zip(prompts, actions, strict=True)):
        p[i, pw - len(x) :] = x
        a[i, : len(y)] = y
    al = None
    if allowed is not None:
        k = k or max(len(ids) for row in allowed for ids in row)
        al = np.full((len(actions), aw, k), -1, dtype=np.int64)
        for i, row in enumerate(allowed):
            for j, ids in enumerate(row):
                al[i, j, : len(ids)] = ids
    return p, [len(x) for x in prompts], a, [len(y) for y in actions], al


def test_equal_rows_share_a_key_and_differences_anywhere_split_them() -> None:
    prompts = [[5, 6, 7], [5, 6, 7], [6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]]
    actions = [[1, 2], [1, 2], [1, 2], [1, 3], [1], [1, 2]]
    allowed = [[[1], [2, 3]], [[1], [2, 3]], [[1], [2, 3]], [[1], [2, 3]], [[1]], [[1], [2]]]
    keys = row_keys(*_rows(prompts, actions, allowed))
    u = unique_rows(keys)
    # rows 0 and 1 are equal; 2 differs in the prompt (a shorter prompt, not a padded one), 3 in the action,
    # 4 in the action's length, 5 only in the allowed set
    assert u.index == [0, 2, 3, 4, 5]
    assert u.inverse.tolist() == [0, 0, 1, 2, 3, 4]
    assert u.share == pytest.approx(5 / 6)
    assert u.keys == [keys[i] for i in u.index]


def test_a_row_key_does_not_depend_on_the_batch_padding() -> None:
    prompts, actions, allowed = [[5, 6, 7]], [[1, 2]], [[[1, 4], [2]]]
    narrow = row_keys(*_rows(prompts, actions, allowed))
    wide = row_keys(*_rows(prompts, actions, allowed, pw=9, aw=5, k=7))
    assert narrow == wide
    assert row_keys(*_rows(prompts, actions)) != narrow  # unconstrained is another row


def test_length_chunks_sort_cover_and_respect_the_token_budget() -> None:
    lengths = [10, 3, 7, 3, 12, 1]
    chunks = length_chunks(lengths, max_tokens=14)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    flat = [lengths[i] for c in chunks for i in c]
    assert flat == sorted(lengths)
    for c in chunks:
        assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 14
    assert chunks == [[5, 1, 3], [2], [0], [4]]
    assert length_chunks([30, 2], max_tokens=8) == [[1], [0]]  # a row over the budget is a chunk alone
    with pytest.raises(ValueError, match="max_tokens"):
        length_chunks([1], max_tokens=0)


def test_token_chunks_count_prompt_and_answer_tokens_and_keep_units_whole():
    from gagpo_rllib.policy.logprobs import token_chunks

    # (rows, widest prompt + answer) per unit
    units = [(2, 10), (1, 40), (3, 12), (1, 11), (4, 39)]
    chunks = token_chunks(units, max_tokens=60)
    assert sorted(i for c in chunks for i in c) == list(range(len(units)))
    for chunk in chunks:
        rows = sum(units[i][0] for i in chunk)
        width = max(units[i][1] for i in chunk)
        assert rows * width <= 60 or len(chunk) == 1  # a unit over the budget is a chunk alone
    # the cuts are the cheapest contiguous partition of the width-sorted units (brute force over all of them)
    order = sorted(range(len(units)), key=lambda i: (units[i][1], i))

    def cost(parts):
        total = 0.0
        for part in parts:
            padded = sum(units[i][0] for i in part) * max(units[i][1] for i in part)
            if padded > 60 and len(part) > 1:
                return float("inf")
            total += padded + 60 / 32
        return total

    best = min(
        cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)), strict=True)])
        for k in range(len(order))
        for cuts in itertools.combinations(range(1, len(order)), k)
    )
    assert cost(chunks) == best
    assert [i for c in chunks for i in c] == order
    with pytest.raises(ValueError, match="max_tokens"):
        token_chunks(units, 0)
