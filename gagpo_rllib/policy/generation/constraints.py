"""Constrained decoding to the admissible actions: a token trie shared by the sampler and the learner.

The learner must rebuild exactly the allowed set the sampler used at each position, otherwise the first-minibatch
ratio is not 1. Both sides therefore go through ``ActionTrie`` built from ``action_token_ids``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

__all__ = ["ActionTrie", "action_token_ids", "allowed_token_masks", "end_token_id"]


def end_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token that closes an action: the tokenizer's end-of-sequence token."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer.eos_token_id: the tokenizer has no end-of-sequence token")
    return int(eos)


# Encoded action texts per tokenizer: every step of every rollout lists its admissible actions again, and an
# environment has few distinct ones (encoding is deterministic, so a cached encoding is the encoding).
_ENCODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENCODED_MAX = 200_000


def action_token_ids(tokenizer: PreTrainedTokenizerBase, actions: list[str]) -> list[list[int]]:
    """Token ids of each action text (no special tokens added) followed by the end token."""
    eos = end_token_id(tokenizer)
    try:
        known = _ENCODED.setdefault(tokenizer, OrderedDict())
    except TypeError:  # a tokenizer that cannot be weakly referenced is encoded every time
        known = OrderedDict()
    new = list(dict.fromkeys(a for a in actions if a not in known))
    if new:
        for text, ids in zip(new, tokenizer(new, add_special_tokens=False)["input_ids"], strict=True):
            known[text] = tuple(ids)
    out = [[*known[a], eos] for a in actions]
    while len(known) > _ENCODED_MAX:
        known.popitem(last=False)
    return out


class ActionTrie:
    """A prefix tree over token sequences; ``allowed(prefix)`` lists the tokens that may follow ``prefix``."""

    def __init__(self, sequences: Sequence[Sequence[int]]):
        self._root: dict[int, dict] = {}
        self.depth = 0  # tokens of the longest sequence
        for seq in sequences:
            node = self._root
            for tok in seq:
                node = node.setdefault(int(tok), {})
            self.depth = max(self.depth, len(seq))

    def _node(self, prefix: Sequence[int]) -> dict[int, dict] | None:
        node = self._root
        for tok in prefix:
            node = node.get(int(tok))
            if node is None:
                return None
        return node

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        """Sorted next tokens after ``prefix``; empty when the prefix is complete or leaves the trie."""
        node = self._node(prefix)
        return sorted(node) if node else []

    def __bool__(self) -> bool:
        return bool(self._root)


def allowed_token_masks(
    tokenizer: PreTrainedTokenizerBase, admissible: list[str], action_ids: list[int], vocab_size: int
) -> torch.BoolTensor:
    """(len(action_ids), vocab_size) mask of the tokens allowed at each action position, as during sampling."""
    trie = ActionTrie(action_token_ids(tokenizer, admissible))
    mask = torch.zeros(len(action_ids), vocab_size, dtype=torch.bool)
    for k in range(len(action_ids)):
        allowed = trie.allowed(action_ids[:k])
        if int(action_ids[k]) not in allowed:
            raise ValueError(
                f"action_ids: token {int(action_ids[k])} at position {k} is not allowed by the admissible actions"
            )
        mask[k, allowed] = True
    return mask
