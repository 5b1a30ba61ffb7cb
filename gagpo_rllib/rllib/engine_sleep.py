"""Rollout engines asleep during the learner update, so a learner fits beside them on one GPU.

A vLLM engine reserves its share of the GPU (weights + KV cache) at start and keeps it; a 7B bf16 learner with
AdamW does not fit on 80 GB beside a training and an evaluation engine (``gagpo_rllib/policy/generation/vllm.py``).
With ``GAGPOConfig.sleep_engines_during_update`` the driver puts every started engine to sleep at level 1
after sampling and before the update (weights to host memory, KV cache freed): the training EnvRunners', the
local runner's when it started one, and the evaluation runners' unless evaluation runs in parallel to training
(those engines are generating then). After the update the learners release the GPU memory PyTorch's allocator
cached during it (``torch.cuda.empty_cache``), so the engines can re-allocate theirs, and every engine wakes
before the weight sync, the evaluation engine too (RLlib syncs it only before evaluating); ``update_weights``
would wake an engine the call missed. Every engine is awake when the iteration ends; when the update is
skipped, nothing sleeps; when it raises, the engines still wake (``rollout_engines_asleep``), so a caller that
catches the error can train on. Only the update's memory is gained: the learner's resident state (weights,
optimizer moments, reference) stays while the engines sample.

Calls go to the healthy runners only and the function sent never raises (an exception would kill the actor,
see ``gagpo_rllib.rllib.group_sampling``): a runner lost meanwhile, or an engine that refuses, is logged and counted
(``gagpo/engine_sleep_failures``, ``gagpo/engine_wake_failures``) and the iteration goes on; a restarted
runner builds an awake engine.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "SLEEP_LEVEL",
    "rollout_engines_asleep",
    "sleep_rollout_engines",
    "validate_engine_sleep",
    "wake_rollout_engines",
]

logger = logging.getLogger(__name__)

# Level 1 keeps the weights in host memory, so an engine the weight sync does not reach can still wake up.
SLEEP_LEVEL = 1
# How long one round of sleep / wake-up calls may take (level 1 copies the weights to host memory and back).
CALL_TIMEOUT_S = 600.0


@dataclass
class _Reply:
    worker_index: int
    changed: int = 0  # engines put to sleep / woken by this call (0: none started, or already in that state)
    error: str | None = None


def validate_engine_sleep(config: Any) -> None:
    """``sleep_engines_during_update`` is a bool; True needs backend "vllm" with ``enable_sleep_mode``."""
    value = config.sleep_engines_during_update
    if not isinstance(value, bool):
        raise ValueError(f"GAGPOConfig.sleep_engines_during_update must be a bool, got {value!r}")
    if not value:
        return
    if config.backend != "vllm":
        raise ValueError(
            "GAGPOConfig.sleep_engines_during_update=True needs backend 'vllm' (the hf backend shares the "
            f"policy's weights and has no engine to free), got backend {config.backend!r}"
        )
    overrides = config.evaluation_config if isinstance(config.evaluation_config, dict) else {}
    for where, kwargs in (
        ("backend_kwargs", config.backend_kwargs),
        ("evaluation_config['backend_kwargs']", overrides.get("backend_kwargs", config.backend_kwargs)),
    ):
        got = kwargs.get("enable_sleep_mode") if isinstance(kwargs, dict) else None
        if got is not True:
            raise ValueError(
                f"GAGPOConfig.sleep_engines_during_update=True needs {where}['enable_sleep_mode']=True (vLLM "
                f"sleeps only an engine built with it), got {got!r}"
            )


def _engine_fn(asleep: bool):
    """The function sent to a runner: put its started engine to sleep (or wake it); never raise."""

    def call(runner: Any) -> _Reply:
        reply = _Reply(worker_index=int(getattr(runner, "worker_index", 0)))
        try:
            backend = getattr(getattr(runner, "module", None), "started_backend", None)
            if backend is None or not hasattr(backend, "sleep"):
                return reply  # no engine started here (the driver's idle runner), or not a vLLM one
            was_asleep = backend.sleep_level is not None
            if asleep:
                backend.sleep(SLEEP_LEVEL)
            else:
                backend.wake_up()
            reply.changed = int(was_asleep != asleep)
        except Exception:  # noqa: BLE001 - reported to the driver instead of killing the actor
            reply.error = traceback.format_exc()
        return reply

    return call


def _runner_groups(algo: Any) -> list:
    groups = [algo.env_runner_group]
    evaluation = getattr(algo, "eval_env_runner_group", None)
    # A parallel evaluation is generating during the update: its engine stays awake.
    parallel = bool(algo.config.evaluation_parallel_to_training)
    if evaluation is not None and evaluation is not algo.env_runner_group and not parallel:
        groups.append(evaluation)
    return groups


def _call_engines(algo: Any, asleep: bool) -> tuple[int, int]:
    """Send the sleep (or wake-up) call to every healthy runner of each group: (engines changed, failures)."""
    changed = failures = 0
    what = "sleep" if asleep else "wake up"
    for group in _runner_groups(algo):
        expected = len(group.healthy_env_runner_ids()) + int(group.local_env_runner is not None)
        replies = group.foreach_env_runner(
            _engine_fn(asleep), local_env_runner=True, timeout_seconds=CALL_TIMEOUT_S
        )
        failures += expected - len(replies)
        for reply in replies:
            changed += reply.changed
            if reply.error is not None:
                failures += 1
                logger.error(
                    "GAGPO: the engine of EnvRunner %d did not %s:\n%s", reply.worker_index, what, reply.error
                )
    if failures > 0:
        logger.warning("GAGPO: %d EnvRunner(s) did not answer or failed the engine %s call", failures, what)
    return changed, failures


def sleep_rollout_engines(algo: Any) -> None:
    """Before the learner update: free the engines' GPU memory, if ``sleep_engines_during_update`` is set."""
    if not algo.config.sleep_engines_during_update:
        return
    slept, failures = _call_engines(algo, asleep=True)
    algo.metrics.log_value(("gagpo", "engines_slept"), float(slept), window=1)
    algo.metrics.log_value(("gagpo", "engine_sleep_failures"), float(failures), window=1)


def _release_cached_memory(learner: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wake_rollout_engines(algo: Any) -> None:
    """After the update, before the weight sync: free the learners' cached GPU memory, wake every engine."""
    if not algo.config.sleep_engines_during_update:
        return
    algo.learner_group.foreach_learner(_release_cached_memory, timeout_seconds=CALL_TIMEOUT_S)
    woken, failures = _call_engines(algo, asleep=False)
    algo.metrics.log_value(("gagpo", "engines_woken"), float(woken), window=1)
    algo.metrics.log_value(("gagpo", "engine_wake_failures"), float(failures), window=1)


@contextlib.contextmanager
def rollout_engines_asleep(algo: Any) -> Iterator[None]:
    """The engines sleep for the block (the learner update) and wake after it, also when it raises."""
    sleep_rollout_engines(algo)
    try:
        yield
    finally:
        wake_rollout_engines(algo)
