"""The admissible-action token trie and the allowed-set masks the learner rebuilds."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gagpo_rllib.policy.generation.base import ActionTrie, action_token_ids, allowed_token_masks


@pytest.fixture(scope="module")
def tok(tiny_policy_path: Path):
    return AutoTokenizer.from_pretrained(tiny_policy_path)


def test_action_token_ids_append_the_end_token(tok) -> None:
    ids = action_token_ids(tok, ["go north", "take the key"])
    assert [seq[-1] for seq in ids] == [tok.eos_token_id] * 2
    assert tok.decode(ids[0][:-1]) == "go north"
    assert action_token_ids(tok, []) == []


def test_trie_allows_exactly_the_continuations() -> None:
    trie = ActionTrie([[1, 2, 9], [1, 2, 3, 9], [4, 9]])
    assert trie.allowed([]) == [1, 4]
    assert trie.allowed([1]) == [2]
    assert trie.allowed([1, 2]) == [3, 9]  # an action that is a prefix of another may end here
    assert trie.allowed([1, 2, 9]) == []
    assert trie.allowed([7]) == []
    assert not ActionTrie([])


def test_masks_follow_the_trie_per_position(tok) -> None:
    acts = ["go north", "go south", "look"]
    seq = action_token_ids(tok, acts)[1]
    mask = allowed_token_masks(tok, acts, seq, len(tok))
    assert mask.shape == (len(seq), len(tok))
    trie = ActionTrie(action_token_ids(tok, acts))
    for k in range(len(seq)):
        assert mask[k].nonzero().flatten().tolist() == trie.allowed(seq[:k])
    assert mask[0].sum() >= 2  # "go" and "look" start differently


def test_masks_reject_tokens_outside_the_admissible_set(tok) -> None:
    with pytest.raises(ValueError, match="position 0"):
        allowed_token_masks(tok, ["look"], action_token_ids(tok, ["go north"])[0], len(tok))
