"""Weight sync to the EnvRunners: learner 0 puts the inference-only weights into Ray's object store once, every
remote EnvRunner fetches that one object.

RLlib's own sync (``EnvRunnerGroup.sync_weights`` from a ``LearnerGroup``) pulls the state from learner 0 into the
driver (a first copy over the network) and ``ray.put``s it again there (a second copy) before the runners fetch
it. Here learner 0 (or the local learner) builds the state with ``inference_only=True`` (no critic, no optimizer
state, weights cast to the rollout dtype: ``LLMRLModule.get_state``) and puts it itself; the driver only handles
the reference. The local EnvRunner of a run with remote runners does not sample (``GAGPOEnvRunner.make_module``):
it gets the sequence number only, so the driver and the Algorithm's process never hold a copy of the weights.

The GPU path that would go further, not built here: an NCCL group between learner 0 and the engines' workers
(vLLM's weight-transfer API, ``collective_rpc`` on a worker extension that receives broadcast tensors), so the
weights go GPU to GPU without host memory or the object store; it is CUDA-only and cannot be tested on CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from gagpo_rllib.rllib.rllib_internals import local_learner, on_first_learner, route_whole_group_syncs

__all__ = [
    "PublishedWeights",
    "SyncReport",
    "publish_weights",
    "route_learner_syncs",
    "state_nbytes",
    "sync_env_runners",
    "sync_local_runner",
]


@dataclass
class PublishedWeights:
    """The inference-only module state in the object store (put by the learner that built it)."""

    ref: Any
    seq_no: int
    nbytes: int
    num_tensors: int


@dataclass
class SyncReport:
    """What one sync moved: the bytes of one copy of the weights, the runners that took it, the seconds."""

    nbytes: int
    num_tensors: int
    runners: int
    seconds: float


def state_nbytes(state: Any) -> tuple[int, int]:
    """(bytes, tensors) of the tensors and arrays in a nested state dict."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size(), 1
    if isinstance(state, np.ndarray):
        return int(state.nbytes), 1
    if isinstance(state, dict):
        total = count = 0
        for value in state.values():
            b, n = state_nbytes(value)
            total, count = total + b, count + n
        return total, count
    return 0, 0


def _inference_state(learner: Any) -> tuple[dict, int]:
    """The learner's inference-only module state and its weights' sequence number."""
    state = learner.get_state(components=COMPONENT_RL_MODULE, inference_only=True)
    return state[COMPONENT_RL_MODULE], int(state[WEIGHTS_SEQ_NO])


def _publish(learner: Any) -> PublishedWeights:
    """On the learner: its inference-only module state, put into the object store once."""
    module_state, seq_no = _inference_state(learner)
    nbytes, count = state_nbytes(module_state)
    return PublishedWeights(ray.put(module_state), seq_no, nbytes, count)


def publish_weights(learner_group: Any) -> PublishedWeights:
    """Learner 0 (or the local learner) publishes its weights; only the reference comes back to the caller."""
    if learner_group.is_local:
        return _publish(local_learner(learner_group))
    return on_first_learner(learner_group, _publish)


def sync_env_runners(
    group: Any,
    learner_group: Any,
    *,
    worker_ids: list[int] | None = None,
    force: bool = False,
    timeout_seconds: float | None = None,
) -> SyncReport:
    """Send the learners' current weights to every healthy remote runner of ``group`` (one object-store copy) and
    to its local runner when that one samples (no remote runners, or it has an env); the local runner of a run
    with remote runners takes the sequence number only.

    ``worker_ids``: only these remote runners (not the local one). ``force``: load the weights even where the
    runner's sequence number says it has them (a restored runner, given the local runner's number by RLlib).
    """
    start = time.perf_counter()
    local = group.local_env_runner if worker_ids is None else None
    if group.num_remote_env_runners() == 0 and learner_group.is_local:
        # All in this process: the state goes to the local runner as it is (no object store, no Ray needed).
        module_state, seq_no = _inference_state(local_learner(learner_group))
        nbytes, count = state_nbytes(module_state)
        if local is not None:
            local.set_state({COMPONENT_RL_MODULE: module_state, WEIGHTS_SEQ_NO: seq_no})
        return SyncReport(nbytes, count, int(local is not None), time.perf_counter() - start)
    published = publish_weights(learner_group)
    # Sequence number 0 makes a runner load the weights whatever number it holds (SingleAgentEnvRunner.set_state).
    state = {COMPONENT_RL_MODULE: published.ref, WEIGHTS_SEQ_NO: 0 if force else published.seq_no}
    runners = 0
    if group.num_remote_env_runners() > 0:
        ids = group.healthy_env_runner_ids() if worker_ids is None else list(worker_ids)
        if ids:
            replies = group.foreach_env_runner(
                lambda runner: runner.set_state(state),
                local_env_runner=False,
                remote_worker_ids=ids,
                timeout_seconds=timeout_seconds,
            )
            runners += len(replies)
    if local is not None:
        if group.num_remote_env_runners() == 0 or local.has_env():
            local.set_state(state)
            runners += 1
        else:
            local.set_weights_seq_no(published.seq_no)  # the reference the remote runners are checked against
    return SyncReport(published.nbytes, published.num_tensors, runners, time.perf_counter() - start)


def route_learner_syncs(group: Any, learner_group: Any) -> None:
    """Send RLlib's own whole-group syncs of ``group`` from ``learner_group`` (the evaluation runners' before each
    validation) through ``sync_env_runners``; partial ones (restored runners, chosen policies) stay RLlib's."""
    route_whole_group_syncs(group, learner_group, lambda g, lg: sync_env_runners(g, lg))


def sync_local_runner(group: Any, learner_group: Any) -> None:
    """Load the learners' current weights into ``group``'s local runner, which a run with remote runners keeps
    without them; called before it plays in their place (no healthy remote runner, a local env)."""
    if learner_group.is_local:
        module_state, _ = _inference_state(local_learner(learner_group))
    else:
        module_state = ray.get(publish_weights(learner_group).ref)
    group.local_env_runner.set_state({COMPONENT_RL_MODULE: module_state, WEIGHTS_SEQ_NO: 0})
