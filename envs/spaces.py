"""Text spaces for multi-turn text environments that survive vectorisation.

Plain ``gymnasium.spaces.Text`` batches as a tuple of str, which RLlib's EnvRunner later splits into single
characters. ``TextSpace`` batches as a 1-D numpy object array instead, so a vector of observations stays a vector
of whole strings. Any Unicode string up to ``max_length`` characters is a member (web pages and game texts are
not ASCII); the printable-ASCII charset is only used for ``sample()``.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Text
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

__all__ = ["TextSpace"]


class TextSpace(Text):
    """A Text space of arbitrary Unicode strings whose batched form is a 1-D object array."""

    def __init__(self, max_length: int = 1 << 20, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, TextSpace)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    __hash__ = Space.__hash__


class BatchedTextSpace(Space):
    """The batch of ``n`` TextSpace members: a 1-D numpy object array of str."""

    def __init__(self, single: TextSpace, n: int):
        self.single = single
        self.n = int(n)
        super().__init__(shape=(self.n,), dtype=object)

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        out = np.empty(self.n, dtype=object)
        out[:] = [self.single.sample() for _ in range(self.n)]
        return out

    def contains(self, x: Any) -> bool:
        return isinstance(x, np.ndarray) and x.shape == (self.n,) and all(self.single.contains(v) for v in x)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"BatchedTextSpace({self.single!r}, n={self.n})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, BatchedTextSpace) and other.single == self.single and other.n == self.n

    __hash__ = Space.__hash__


def _object_array(items: Any) -> np.ndarray:
    items = list(items)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


@batch_space.register(TextSpace)
def _batch_text(space: TextSpace, n: int = 1) -> Space:
    return BatchedTextSpace(space, n)


@create_empty_array.register(TextSpace)
def _empty_text(space: TextSpace, n: int = 1, fn: Any = np.zeros) -> np.ndarray:
    return _object_array([""] * n)


@concatenate.register(TextSpace)
def _concatenate_text(space: TextSpace, items: Any, out: Any) -> np.ndarray:
    return _object_array(items)


@iterate.register(BatchedTextSpace)
def _iterate_text(space: BatchedTextSpace, items: np.ndarray) -> Iterator[str]:
    return iter(items)
