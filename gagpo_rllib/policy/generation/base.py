"""The generation-backend interface: prompts in; token ids, behaviour log-probs and text out."""

from __future__ import annotations

import logging
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from gagpo_rllib.method.seeds import mix_seed

__all__ = ["GenerationBackend", "GenerationOutput", "SamplingConfig", "Seed", "row_seeds"]

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


class GenerationBackend(ABC):
    """Samples one answer per prompt in ONE batched call; follows the learner's weights via update_weights."""

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

    @abstractmethod
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
        ``row_seeds``.
        """

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
