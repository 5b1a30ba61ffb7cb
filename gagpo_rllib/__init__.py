"""GAGPO on Ray RLlib: ``from gagpo_rllib import GAGPOConfig``.

``GAGPOConfig`` and ``GAGPO`` are imported on first use (PEP 562), so ``import gagpo_rllib.method`` stays free of
Ray and RLlib.
"""

from __future__ import annotations

from typing import Any

from gagpo_rllib import moved

# Checkpoints of earlier versions name modules that have moved since (``gagpo_rllib.moved``).
moved.install()

__all__ = ["GAGPO", "GAGPOConfig"]


def __getattr__(name: str) -> Any:
    if name == "GAGPOConfig":
        from gagpo_rllib.rllib.config import GAGPOConfig

        return GAGPOConfig
    if name == "GAGPO":
        from gagpo_rllib.rllib.algorithm import GAGPO

        return GAGPO
    raise AttributeError(f"module 'gagpo_rllib' has no attribute {name!r}")
