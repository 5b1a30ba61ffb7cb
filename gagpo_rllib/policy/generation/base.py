"""The generation-backend interface: prompts in; token ids, behaviour log-probs and text out.

Constrained decoding to the admissible actions uses a token trie shared by the sampler and the learner. The
learner must rebuild exactly the allowed set the sampler used at each position, otherwise the first-minibatch ratio
is not 1. Both sides therefore go through ``ActionTrie`` built from ``action_token_ids``.
"""

from __future__ import annotations

import logging
import numbers
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from gagpo_rllib.method.seeds import mix_seed

__all__ = [
    "ActionTrie",
    "GenerationBackend",
    "GenerationOutput",
    "GenerationRequest",
    "SamplingConfig",
    "Seed",
    "action_token_ids",
    "allowed_token_masks",
    "end_token_id",
    "row_seeds",
]

logger = logging.getLogger(__name__)

# One seed for the call (mixed with each request's index) or one seed per prompt.
Seed = int | Sequence[int] | None


def row_seeds(seed: Seed, n: int) -> list[int] | None:
    """Per-prompt seeds: None stays None; an int is mixed with each prompt's index; a sequence is used as given.

    A row's sampling noise depends on its own seed only, so a prompt draws the same answer whatever else is in
    the batch.
    """
    if seed is None:
        return None
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [mix_seed(int(seed), i) for i in range(n)]
    if isinstance(seed, (str, bytes)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise ValueError(f"seed: expected None, an int or one int per prompt, got {type(seed).__name__}")
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"seed: {len(seeds)} seeds for {n} prompts (one per prompt expected)")
    for i, s in enumerate(seeds):
        if not isinstance(s, numbers.Integral) or isinstance(s, bool):
            raise ValueError(f"seed[{i}]: expected an int, got {s!r}")
    return [int(s) for s in seeds]


@dataclass
class SamplingConfig:
    """Pure ancestral sampling at ``temperature`` (no top-k/top-p), so the behaviour log-prob is exact."""

    temperature: float = 1.0
    max_new_tokens: int = 64
    constrained: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationOutput:
    """One sampled answer.

    ``logprobs[k]`` is log_softmax(logits / T) at ``action_ids[k]``, over the allowed set when constrained.
    ``finished`` is False when the answer hit max_new_tokens without an end token.
    """

    prompt_ids: list[int]
    action_ids: list[int]
    logprobs: list[float]
    text: str
    finished: bool = True


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt submitted on its own (``GenerationBackend.submit``); ``key`` names its answer in ``collect``."""

    key: Hashable
    prompt: str
    admissible: list[str] | None = None
    seed: int | None = None


@dataclass(frozen=True)
class SampleBatch:
    """``generate``'s checked arguments: non-empty prompts, their sampling, admissible lists and one seed per row
    (None: the global RNG)."""

    prompts: list[str]
    sampling: SamplingConfig
    admissible: list[list[str]] | None
    seeds: list[int] | None


class GenerationBackend(ABC):
    """Samples one answer per prompt; follows the learner's weights via update_weights.

    Two ways in: ``generate`` (one batched call, returns when its longest answer ends) and ``submit`` /
    ``collect`` (requests join whenever they are ready and answers come back as each ends, so a caller keeps
    the engine busy with whatever is ready). The base ``collect`` answers everything submitted so far in one
    ``generate`` call per sampling config; an engine with continuous batching (vLLM) overrides both.
    """

    tokenizer: PreTrainedTokenizerBase
    # False when constrained behaviour log-probs cannot match the learner's trie masks exactly (then the learner
    # recomputes the old log-probs itself before the first update).
    exact_logprobs_constrained: bool = True
    # Calls whose constrained token budget was widened beyond max_new_tokens to fit the longest admissible action.
    budget_widenings: int = 0

    def token_budget(self, sampling: SamplingConfig, longest_action: int) -> int:
        """Tokens one constrained call may generate: ``max_new_tokens``, widened to fit the longest action.

        Constrained decoding must be able to emit every admissible action (its tokens and the end token); cutting
        one short would leave a truncated, unparseable answer. A widening is counted and logged.
        """
        budget = int(sampling.max_new_tokens)
        if longest_action > budget:
            self.budget_widenings += 1
            logger.warning(
                "constrained decoding: the longest admissible action needs %d tokens (with its end token), "
                "more than max_new_tokens=%d; widening this call's budget (widened calls so far: %d)",
                longest_action,
                budget,
                self.budget_widenings,
            )
            budget = int(longest_action)
        return budget

    def generate(
        self,
        prompts: list[str],
        *,
        sampling: SamplingConfig,
        admissible: list[list[str]] | None = None,
        seed: Seed = None,
    ) -> list[GenerationOutput]:
        """Sample one answer per prompt; ``admissible`` (one list per prompt) is required when constrained.

        ``seed``: None (the global RNG), an int (mixed with each prompt's index) or one int per prompt; see
        ``row_seeds``. The template of every backend: check (``check_ready``), then ``sample`` with one seed per row.
        """
        if not prompts:
            return []
        self.check_ready(prompts, sampling, admissible, "generate")
        return self.sample(SampleBatch(prompts, sampling, admissible, row_seeds(seed, len(prompts))))

    def check_ready(
        self, prompts: list[str], sampling: SamplingConfig, admissible: list[list[str]] | None, call: str
    ) -> None:
        """What ``generate`` and ``submit`` check first (base: one admissible list per prompt when constrained)."""
        self.check_admissible(prompts, sampling, admissible)

    @abstractmethod
    def sample(self, batch: SampleBatch) -> list[GenerationOutput]:
        """``generate``'s work on checked, non-empty arguments (``SampleBatch``)."""

    def submit(self, requests: Sequence[GenerationRequest], *, sampling: SamplingConfig) -> None:
        """Queue requests; their answers come back from ``collect``. Keys must be unique among those in flight."""
        queued = self.__dict__.setdefault("_queued", {})
        keys = [r.key for r in requests]
        for i, key in enumerate(keys):
            if key in queued or key in keys[:i]:
                raise ValueError(f"submit: request key {key!r} is already in flight")
        for request in requests:
            queued[request.key] = (sampling, request)

    def in_flight(self) -> int:
        """Requests submitted and not yet collected."""
        return len(self.__dict__.get("_queued", {}))

    def abort(self) -> int:
        """Drop every request in flight (a caller that stops early); returns how many were dropped."""
        queued = self.__dict__.setdefault("_queued", {})
        dropped = len(queued)
        queued.clear()
        return dropped

    def collect(self) -> list[tuple[Hashable, GenerationOutput]]:
        """Answers of submitted requests, at least one while any is in flight ([] when none is).

        Base: one ``generate`` call per distinct sampling config over everything queued, in submission order; a
        row's answer depends on its own seed only (``row_seeds``), so how requests were gathered does not matter.
        """
        queued = self.__dict__.setdefault("_queued", {})
        calls: dict[int, tuple[SamplingConfig, list[GenerationRequest]]] = {}
        for sampling, request in queued.values():
            calls.setdefault(id(sampling), (sampling, []))[1].append(request)
        queued.clear()
        answers = []
        for sampling, requests in calls.values():
            seeds = [r.seed for r in requests]
            outs = self.generate(
                [r.prompt for r in requests],
                sampling=sampling,
                admissible=[list(r.admissible or []) for r in requests] if sampling.constrained else None,
                seed=None if any(s is None for s in seeds) else seeds,
            )
            answers.extend((r.key, o) for r, o in zip(requests, outs, strict=True))
        return answers

    @abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the learner's weights (the HF model's state-dict names) into the rollout model."""

    @abstractmethod
    def reset_cache(self) -> None:
        """Drop any cached computation that depends on the old weights (e.g. a prefix cache)."""

    @staticmethod
    def check_admissible(
        prompts: list[str], sampling: SamplingConfig, admissible: list[list[str]] | None
    ) -> None:
        """Shared argument checks: one non-empty admissible list per prompt when constrained."""
        if not sampling.constrained:
            return
        if admissible is None or len(admissible) != len(prompts):
            got = None if admissible is None else len(admissible)
            raise ValueError(
                f"admissible: constrained decoding needs one list per prompt ({len(prompts)}), got {got}"
            )
        for i, acts in enumerate(admissible):
            if not acts:
                raise ValueError(f"admissible[{i}]: empty; constrained decoding needs at least one action")


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
