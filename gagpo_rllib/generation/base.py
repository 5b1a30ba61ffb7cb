"""The generation-backend interface: prompts in; token ids, behaviour log-probs and text out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

__all__ = ["GenerationBackend", "GenerationOutput", "SamplingConfig"]


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

    @abstractmethod
    def generate(
        self,
        prompts: list[str],
        *,
        sampling: SamplingConfig,
        admissible: list[list[str]] | None = None,
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        """Sample one answer per prompt; ``admissible`` (one list per prompt) is required when constrained."""

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
