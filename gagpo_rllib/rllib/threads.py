"""torch's intra-op thread count for EnvRunners and Learners: the CPUs Ray gave the actor.

torch defaults to every core of the machine; on a shared 2-core machine two such processes decoding at once ran
7x slower per token than with one thread each. Each actor therefore sets its threads to its own CPU share (the
config's ``torch_threads`` overrides it).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

__all__ = ["assigned_cpus", "set_torch_threads"]

logger = logging.getLogger(__name__)


def assigned_cpus(main_process_cpus: float | None = None) -> float | None:
    """The CPUs Ray assigned to this Ray worker; in the driver, ``main_process_cpus`` (None: unknown)."""
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            if ctx.worker.mode == ray.WORKER_MODE:
                return float(ctx.get_assigned_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - no Ray context is fine: fall back to the main process's share
        logger.debug("assigned_cpus: no Ray runtime context", exc_info=True)
    return None if main_process_cpus is None else float(main_process_cpus)


def set_torch_threads(config: Any, role: str) -> int:
    """Set ``torch.set_num_threads`` from ``config.torch_threads`` or the assigned CPUs (at least 1); returns it."""
    wanted = getattr(config, "torch_threads", None)
    if wanted is None:
        main = getattr(config, "num_cpus_for_main_process", None)
        cpus = assigned_cpus(main if isinstance(main, (int, float)) else None)
        if cpus is None:
            return torch.get_num_threads()
        wanted = max(1, math.floor(cpus))
    wanted = int(wanted)
    if torch.get_num_threads() != wanted:
        logger.info("%s: torch threads %d -> %d", role, torch.get_num_threads(), wanted)
        torch.set_num_threads(wanted)
    return wanted
