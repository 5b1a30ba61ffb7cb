"""Generation backends: the interface, the Hugging Face implementation, and the optional vLLM one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gagpo_rllib.policy.generation.base import (
    ActionTrie,
    GenerationBackend,
    GenerationOutput,
    SamplingConfig,
    action_token_ids,
    allowed_token_masks,
)
from gagpo_rllib.policy.generation.hf import HFGenerationBackend

if TYPE_CHECKING:
    from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend

__all__ = [
    "ActionTrie",
    "GenerationBackend",
    "GenerationOutput",
    "HFGenerationBackend",
    "SamplingConfig",
    "VLLMGenerationBackend",
    "action_token_ids",
    "allowed_token_masks",
    "make_backend",
]


def __getattr__(name: str) -> Any:
    if name == "VLLMGenerationBackend":  # vllm is an optional GPU-only extra: import on first use
        from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend

        return VLLMGenerationBackend
    raise AttributeError(name)


def make_backend(kind: str, model_path: Any, **kwargs: Any) -> GenerationBackend:
    """Build a backend by name ("hf" or "vllm")."""
    if kind == "hf":
        return HFGenerationBackend(model_path, **kwargs)
    if kind == "vllm":
        from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend

        return VLLMGenerationBackend(model_path, **kwargs)
    raise ValueError(f"backend: unknown generation backend {kind!r} (expected 'hf' or 'vllm')")
