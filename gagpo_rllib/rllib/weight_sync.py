"""Weight sync to the EnvRunners: learner 0 puts the inference-only weights into Ray's object store once, as a
few flat byte buckets, and every remote EnvRunner maps those buckets and loads from them.

RLlib's own sync (``EnvRunnerGroup.sync_weights`` from a ``LearnerGroup``) pulls the state from learner 0 into the
driver (a first copy over the network) and ``ray.put``s it again there (a second copy) before the runners fetch
it. Here learner 0 (or the local learner) puts the weights itself; the driver only handles references. The local
EnvRunner of a run with remote runners does not sample (``GAGPOEnvRunner.make_module``): it gets the sequence
number only, so the driver and the Algorithm's process never hold a copy of the weights.

The host path (``gagpo_rllib.policy.weight_buckets``): the inference-only tensors (no critic) are cast to the
rollout dtype while they are copied into buckets of ``bucket_bytes``, on several threads (on a GPU the cast runs
there, before the copy to the host); each bucket is one ``uint8`` array, which Ray stores out of band (a memcpy,
no pickling of tensor bytes) while the next bucket is filled; a runner maps each bucket without a copy
(``PackedWeights``, fetched lazily in the order the engine reads) and its engine copies the tensors in. The
weights' finiteness is checked where they live before anything is published. ``benchmarks/bench_weight_sync.py``
measures this path beside the former one (a dict of tensors pickled into the object store).

The broadcast path (``weight_transport="broadcast"``; ``"auto"`` picks it when the learners and the engines each
have whole GPUs of their own): learner 0 and the remote runners form a process group (``policy.weight_transport``:
NCCL between GPUs, gloo on CPUs), learner 0 casts each bucket where the weights live and broadcasts it, and every
runner hands the bucket's tensors to its engine as they arrive, with no host copy on a GPU. The group is opened on
the first sync and again when the set of healthy runners changes or learner 0 is not in it (restarted); a sync
that fails on it is logged, counted (``SyncReport.fallback``) and done through the object store, and after
``BROADCAST_MAX_FAILURES`` failures in a row the group's runners stay on the object store. Syncs to chosen runners (restored ones) and the deferred syncs
of ``max_staleness`` >= 1 (``prepare_sync``) always take the object store. Not built: CUDA IPC handles for an
engine on the learner's own GPU (the colocated layout), which takes the object store.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from gagpo_rllib.policy.weight_buckets import (
    DEFAULT_BUCKET_BYTES,
    Slot,
    bucket_size,
    pack,
    plan_buckets,
    unpack,
)
from gagpo_rllib.policy.weight_transport import (
    BroadcastWeights,
    ChannelInfo,
    channel_open,
    close_channel,
    join_channel,
    open_channel,
    send_buckets,
)
from gagpo_rllib.rllib.rllib_internals import (
    learner_weights_seq_no,
    local_learner,
    on_every_learner,
    on_first_learner,
    route_learner_group_syncs,
)

__all__ = [
    "BROADCAST_MAX_FAILURES",
    "ROLLOUT_WEIGHTS_DIR",
    "close_broadcast",
    "PackedWeights",
    "PublishedWeights",
    "prepare_sync",
    "SyncReport",
    "publish_weights",
    "publish_tensors",
    "route_learner_syncs",
    "state_nbytes",
    "sync_env_runners",
    "sync_local_runner",
    "transport_of",
    "write_rollout_weights",
]

logger = logging.getLogger(__name__)

# The size of one bucket: large enough that the per-bucket costs vanish, small enough that the staging buffers
# (two of them) and a receiver's mapped bucket stay small beside the model.
BUCKET_BYTES = DEFAULT_BUCKET_BYTES

# Threads that cast and copy the weights into the buckets: the sync runs while nothing else computes (rollout,
# update and sync alternate), so it may take the machine's cores.
SYNC_THREADS = max(
    1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
)


class PackedWeights(Mapping):
    """A module state as object-store buckets: a read-only mapping name -> tensor that fetches a bucket when one
    of its tensors is first read (zero-copy views of the shared memory) and keeps only the last one at hand."""

    def __init__(self, buckets: list[list[Slot]], refs: list[Any]) -> None:
        if len(buckets) != len(refs):
            raise ValueError(f"PackedWeights: {len(buckets)} buckets but {len(refs)} object references")
        self.buckets, self.refs = buckets, refs
        self._where = {slot.name: i for i, slots in enumerate(buckets) for slot in slots}
        self._cached: tuple[int, dict[str, torch.Tensor]] | None = None

    def __getstate__(self) -> dict:
        return {"buckets": self.buckets, "refs": self.refs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["buckets"], state["refs"])

    def _bucket(self, i: int) -> dict[str, torch.Tensor]:
        if self._cached is None or self._cached[0] != i:
            self._cached = (i, dict(unpack(self.buckets[i], ray.get(self.refs[i]))))
        return self._cached[1]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._bucket(self._where[name])[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[override]
        """Bucket by bucket, in the order the sender laid them out."""
        for i in range(len(self.buckets)):
            yield from self._bucket(i).items()


@dataclass
class PublishedWeights:
    """The inference-only module state in the object store (put by the learner that built it)."""

    weights: PackedWeights
    seq_no: int
    nbytes: int
    num_tensors: int


@dataclass
class SyncReport:
    """What one sync moved: the bytes of one copy of the weights, the runners that took it, the seconds, and how
    (``transport``: "object_store" or "broadcast"; ``fallback``: a broadcast failed and the object store served)."""

    nbytes: int
    num_tensors: int
    runners: int
    seconds: float
    transport: str = "object_store"
    fallback: bool = False


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


def publish_tensors(
    named: list[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None,
    *,
    bucket_bytes: int | None = None,
    threads: int = SYNC_THREADS,
    whole: Callable[[torch.Tensor], torch.Tensor] | None = None,
    keep: bool = True,
) -> PackedWeights | None:
    """Put ``named`` into the object store as buckets of ``bucket_bytes`` (None: ``BUCKET_BYTES``),
    floating-point tensors cast to ``dtype``: bucket ``i`` is put on a second thread while bucket ``i + 1`` is
    filled. ``whole`` makes a bucket's tensors whole before they are packed (FSDP: a gather, a collective that
    every learner runs in the same order); ``keep`` False only takes part in those gathers and puts nothing."""
    buckets = plan_buckets(named, dtype, bucket_bytes or BUCKET_BYTES)
    tensors = dict(named)
    pinned = any(t.is_cuda for _, t in named)
    staging = _staging(max(bucket_size(b) for b in buckets), pinned) if keep and buckets else []
    refs: list[Any] = []
    with ThreadPoolExecutor(threads) as pool, ThreadPoolExecutor(1) as putter:
        pending = None
        for i, slots in enumerate(buckets):
            values = {slot.name: tensors[slot.name] for slot in slots}
            if whole is not None:
                values = {name: whole(t) for name, t in values.items()}
            if not keep:
                continue
            # Two staging buffers: this one is filled while the other one's put runs (it is awaited below
            # before this one is handed to the put, and before the other is filled again).
            buffer = pack(slots, values, pool, out=staging[i % 2])
            if pending is not None:
                refs.append(pending.result())
            pending = putter.submit(ray.put, buffer.numpy())
        if pending is not None:
            refs.append(pending.result())
    return PackedWeights(buckets, refs) if keep else None


_STAGING: list[torch.Tensor] = []


def _staging(nbytes: int, pinned: bool) -> list[torch.Tensor]:
    """This process's two staging buffers of at least ``nbytes``, kept between syncs (page-locked when the
    weights come from a GPU, for the fast device-to-host copy)."""
    global _STAGING
    if not _STAGING or _STAGING[0].numel() < nbytes or _STAGING[0].is_pinned() != pinned:
        _STAGING = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
    return _STAGING


def _publish(learner: Any) -> PublishedWeights | None:
    """On the learner: its inference-only module state, checked finite and put into the object store once.
    Under FSDP every learner takes part (``_publish_shards``) and learner 0 alone returns the weights."""
    if learner.sharded:
        return _publish_shards(learner)
    learner.check_weights_finite()
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    packed = publish_tensors(module.inference_tensors(), module.dtype)
    return _published(packed, learner)


def _published(packed: PackedWeights, learner: Any) -> PublishedWeights:
    nbytes = sum(slot.nbytes for slots in packed.buckets for slot in slots)
    return PublishedWeights(packed, learner_weights_seq_no(learner), nbytes, len(packed))


def _publish_shards(learner: Any) -> PublishedWeights | None:
    """FSDP, on every learner at once: the tensors of one bucket are gathered whole (collectives, in the same
    order everywhere) and learner 0 casts them into the bucket and puts it, so learner 0's host holds two
    staging buffers, never the model. The shards are checked finite first, on their devices, and the learners
    agree on the result before any collective, so all raise or none does."""
    from gagpo_rllib.policy.fsdp import full_tensor

    module, first = _shards_checked_finite(learner)
    packed = publish_tensors(
        module.inference_tensors(shards=True), module.dtype, whole=full_tensor, keep=first
    )
    return _published(packed, learner) if packed is not None else None


def _shards_checked_finite(learner: Any) -> tuple[Any, bool]:
    """FSDP, on every learner at once: raise on all of them if any learner's shards are not finite (they agree
    before any collective, so all raise or none does); the module and whether this is learner 0."""
    from gagpo_rllib.policy.distributed import agree_max, world

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    bad = module.nonfinite_weights()
    if agree_max(float(len(bad)), next(module.parameters()).device) > 0:
        raise RuntimeError(
            f"GAGPO learner: weights {bad[:5]} of {DEFAULT_MODULE_ID} (this learner's shards) are not finite, or "
            "another learner's are; not handing them out"
        )
    return module, world()[1] == 0


def publish_weights(learner_group: Any) -> PublishedWeights:
    """Learner 0 (or the local learner) publishes its weights; only the references come back to the caller.
    Sharded (FSDP) learners all take part, learner 0's result is the one."""
    if learner_group.is_local:
        return _publish(local_learner(learner_group))
    if learner_group.config.shards_learners:
        return next(r for r in on_every_learner(learner_group, _publish) if r is not None)
    return on_first_learner(learner_group, _publish)


def sync_env_runners(
    group: Any,
    learner_group: Any,
    *,
    worker_ids: list[int] | None = None,
    force: bool = False,
    timeout_seconds: float | None = None,
) -> SyncReport:
    """Send the learners' current weights to every healthy remote runner of ``group`` (one object-store copy, or
    one broadcast: ``weight_transport``) and to its local runner when that one samples (no remote runners, or it
    has an env); the local runner of a run with remote runners takes the sequence number only.

    ``worker_ids``: only these remote runners (not the local one). ``force``: load the weights even where the
    runner's sequence number says it has them (a restored runner, given the local runner's number by RLlib).
    """
    fallback = False
    if worker_ids is None and not force and _broadcasts(group, learner_group):
        try:
            return _broadcast_sync(group, learner_group)
        except Exception as err:  # noqa: BLE001 - any failure of the channel: the object store serves this sync
            fallback = True
            _broadcast_failed(group, learner_group, err)
    report = prepare_sync(
        group, learner_group, worker_ids=worker_ids, force=force, timeout_seconds=timeout_seconds
    )()
    report.fallback = fallback
    return report


# ---------------------------------------------------------------------------------------------- broadcast
# A group whose broadcast failed this many times in a row takes the object store for the rest of the run.
BROADCAST_MAX_FAILURES = 3
# Seconds a member waits for the others in one collective before it fails.
BROADCAST_TIMEOUT_S = 300.0
_TAG = "gagpo_weight_broadcast"
_NAMES = itertools.count()


@dataclass
class _Broadcast:
    """A runner group's channel: who is in it (rank i + 1 is ``runner_ids[i]``), and its failures in a row."""

    info: ChannelInfo | None = None
    runner_ids: tuple[int, ...] = ()
    failures: int = 0


_BROADCASTS: weakref.WeakKeyDictionary[Any, _Broadcast] = weakref.WeakKeyDictionary()


def transport_of(config: Any) -> str:
    """What ``config.weight_transport`` means for this run: "broadcast" or "object_store" ("auto": broadcast when
    learners and engines each have whole GPUs, i.e. sit on different GPUs)."""
    choice = getattr(config, "weight_transport", "object_store")
    if choice != "auto":
        return choice
    learner_gpus = float(config.num_gpus_per_learner or 0)
    runner_gpus = float(config.num_gpus_per_env_runner or 0)
    return "broadcast" if learner_gpus >= 1 and runner_gpus >= 1 else "object_store"


def _broadcasts(group: Any, learner_group: Any) -> bool:
    """Whether this sync of the whole ``group`` goes by broadcast: chosen, remote runners to reach, no local runner
    that samples (it takes the object store's copy), and the group's channel not given up."""
    if transport_of(learner_group.config) != "broadcast" or group.num_remote_env_runners() == 0:
        return False
    local = group.local_env_runner
    if local is not None and local.has_env():
        return False
    state = _BROADCASTS.get(group)
    return state is None or state.failures < BROADCAST_MAX_FAILURES


def _on_learner_0(learner_group: Any, fn: Callable[[Any], Any], *, every: bool = False) -> Any:
    """``fn(learner)`` on learner 0 (``every``, FSDP: on all learners at once, the largest result: learner 0 sends
    the bytes, the others 0)."""
    if learner_group.is_local:
        return fn(local_learner(learner_group))
    if every and learner_group.config.shards_learners:
        return max(on_every_learner(learner_group, fn))
    return on_first_learner(learner_group, fn)


def _open_sender(learner: Any, *, name: str, world_size: int) -> ChannelInfo:
    """On learner 0: host the channel (NCCL where the weights are on a GPU, else gloo)."""
    import ray.util

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    return open_channel(
        name,
        world_size,
        "nccl" if next(module.parameters()).is_cuda else "gloo",
        address=ray.util.get_node_ip_address(),
        timeout_s=BROADCAST_TIMEOUT_S,
    )


def _plan(learner: Any, *, name: str) -> tuple[int, list[list[Slot]]] | None:
    """On learner 0: its weights' sequence number and the buckets this sync lays them out in, or None when this
    process is not in channel ``name`` (a restarted learner): the channel is opened again before any runner waits.
    Weights that are not finite raise here too (FSDP learners check theirs together in ``_send``)."""
    if not channel_open(name):
        return None
    if not learner.sharded:
        learner.check_weights_finite()
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    buckets = plan_buckets(module.inference_tensors(shards=True), module.dtype, BUCKET_BYTES)
    return learner_weights_seq_no(learner), buckets


def _send(learner: Any, *, name: str, buckets: list[list[Slot]]) -> int:
    """On the learners: learner 0 broadcasts its inference weights bucket by bucket (FSDP: the learners check their
    shards finite together, then every learner gathers each bucket's tensors and learner 0 sends)."""
    from gagpo_rllib.policy.fsdp import full_tensor

    if learner.sharded:
        module, first = _shards_checked_finite(learner)
        tensors = dict(module.inference_tensors(shards=True))
        return send_buckets(name, buckets, tensors, whole=full_tensor, keep=first)
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    return send_buckets(name, buckets, dict(module.inference_tensors()))


def _receive(runner: Any, *, name: str, buckets: list[list[Slot]], seq_no: int) -> int | str:
    """On a runner: load the broadcast into its module (its engine reads the buckets as they arrive) under
    ``seq_no``; every bucket is received even where loading stops early, so the collective completes. Returns the
    bytes received, or what went wrong as a string: an exception would make RLlib take the runner out of service,
    while the sync only falls back to the object store."""
    try:
        weights = BroadcastWeights(name, buckets)
        try:
            runner.set_state({COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: weights}, WEIGHTS_SEQ_NO: seq_no})
        finally:
            weights.drain()
    except Exception as err:  # noqa: BLE001 - reported to the driver, which falls back
        return f"{type(err).__name__}: {err}"
    return weights.nbytes


def _join(member: Any, *, info: ChannelInfo, rank: int) -> bool | str:
    """Join the channel as ``rank``; True, or what went wrong as a string (see ``_receive``)."""
    try:
        join_channel(info, rank)
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    return True


def _leave(member: Any, *, name: str) -> bool:
    close_channel(name)
    return True


def _on_runners(group: Any, fns: list[Callable[[Any], Any]], ids: tuple[int, ...]) -> None:
    """Start ``fns[i]`` on runner ``ids[i]`` without waiting (``_collect`` waits)."""
    started = group.foreach_env_runner_async(fns, tag=_TAG, remote_worker_ids=list(ids))
    if started != len(ids):
        raise RuntimeError(f"weight broadcast: {started} of {len(ids)} runners took the call")


def _collect(group: Any, ids: tuple[int, ...]) -> list[Any]:
    """The runners' replies to the calls ``_on_runners`` started; raises if one is missing or reports an error."""
    replies = group.fetch_ready_async_reqs(tags=_TAG, timeout_seconds=BROADCAST_TIMEOUT_S)
    errors = {i: value for i, value in replies if isinstance(value, str)}
    if errors:
        raise RuntimeError(f"weight broadcast: runners failed: {errors}")
    if sorted(i for i, _ in replies) != sorted(ids):
        raise RuntimeError(
            f"weight broadcast: runners {sorted(ids)} were asked, {sorted(i for i, _ in replies)} answered"
        )
    return [value for _, value in replies]


def _open(group: Any, learner_group: Any, ids: tuple[int, ...], state: _Broadcast) -> None:
    """Open the group's channel for runners ``ids``: learner 0 hosts it, then all join at once."""
    name = f"{os.getpid()}-{next(_NAMES)}"
    info = _on_learner_0(learner_group, partial(_open_sender, name=name, world_size=len(ids) + 1))
    _on_runners(group, [partial(_join, info=info, rank=rank) for rank in range(1, len(ids) + 1)], ids)
    try:
        joined = _on_learner_0(learner_group, partial(_join, info=info, rank=0))
    finally:
        _collect(group, ids)
    if joined is not True:
        raise RuntimeError(f"weight broadcast: learner 0 could not join: {joined}")
    state.info, state.runner_ids = info, ids


def _close(group: Any, learner_group: Any, state: _Broadcast) -> None:
    """Leave the group's channel everywhere it is open (best effort: members that are gone have left)."""
    if state.info is None:
        return
    name, ids = state.info.name, state.runner_ids
    state.info, state.runner_ids = None, ()
    with _suppressed("closing the weight channel on learner 0"):
        _on_learner_0(learner_group, partial(_leave, name=name))
    healthy = [i for i in ids if i in set(group.healthy_env_runner_ids())]
    if healthy:
        with _suppressed("closing the weight channel on the runners"):
            group.foreach_env_runner(
                partial(_leave, name=name),
                local_env_runner=False,
                remote_worker_ids=healthy,
                timeout_seconds=30,
            )


@contextlib.contextmanager
def _suppressed(what: str) -> Iterator[None]:
    """Log and swallow an exception (cleanup that must not hide the error being handled)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001
        logger.warning("weight broadcast: %s failed: %s", what, err)


def _broadcast_sync(group: Any, learner_group: Any) -> SyncReport:
    """One sync of every healthy remote runner of ``group`` over the group's channel (opened on first use and
    whenever the healthy runners change): the runners start receiving, learner 0 sends, all finish together."""
    start = time.perf_counter()
    state = _BROADCASTS.setdefault(group, _Broadcast())
    with _suppressed("collecting the replies of an earlier failed broadcast"):
        group.fetch_ready_async_reqs(tags=_TAG, timeout_seconds=0)
    ids = tuple(sorted(group.healthy_env_runner_ids()))
    if not ids:
        raise RuntimeError("weight broadcast: no healthy remote runner")
    plan = None
    if state.info is not None and state.runner_ids == ids:
        plan = _on_learner_0(learner_group, partial(_plan, name=state.info.name))
    if plan is None:
        _close(group, learner_group, state)
        _open(group, learner_group, ids, state)
        plan = _on_learner_0(learner_group, partial(_plan, name=state.info.name))
        if plan is None:
            raise RuntimeError("weight broadcast: learner 0 is not in the channel it just opened")
    seq_no, buckets = plan
    name = state.info.name
    _on_runners(group, [partial(_receive, name=name, buckets=buckets, seq_no=seq_no)] * len(ids), ids)
    try:
        sent = _on_learner_0(learner_group, partial(_send, name=name, buckets=buckets), every=True)
    finally:
        received = _collect(group, ids)
    if any(r != sent for r in received):
        raise RuntimeError(f"weight broadcast: {sent} bytes sent, runners received {received}")
    local = group.local_env_runner
    if local is not None:
        local.set_weights_seq_no(seq_no)  # the reference the remote runners are checked against
    state.failures = 0
    tensors = sum(len(slots) for slots in buckets)
    return SyncReport(sent, tensors, len(ids), time.perf_counter() - start, transport="broadcast")


def close_broadcast(group: Any, learner_group: Any) -> None:
    """Close ``group``'s broadcast channel, if it has one (the Algorithm's ``stop``)."""
    state = _BROADCASTS.pop(group, None)
    if state is not None:
        _close(group, learner_group, state)


def _broadcast_failed(group: Any, learner_group: Any, err: BaseException) -> None:
    """Count a failed broadcast, close the channel (the next sync opens a new one) and say what happened."""
    state = _BROADCASTS.setdefault(group, _Broadcast())
    state.failures += 1
    _close(group, learner_group, state)
    logger.warning(
        "weight broadcast failed (%d in a row%s): %s; this sync goes through the object store",
        state.failures,
        ", the object store serves from now on" if state.failures >= BROADCAST_MAX_FAILURES else "",
        err,
    )


def prepare_sync(
    group: Any,
    learner_group: Any,
    *,
    worker_ids: list[int] | None = None,
    force: bool = False,
    timeout_seconds: float | None = None,
) -> Callable[[], SyncReport]:
    """``sync_env_runners`` in two halves: the learners publish their weights now; the returned function hands
    them to the runners when called (later, e.g. once the runners finish the rollout they are playing, while the
    learners already update). With everything in this process (no remote runners, a local learner) there is
    nothing to publish: the local runner is given the weights now and the function only reports."""
    start = time.perf_counter()
    local = group.local_env_runner if worker_ids is None else None
    if group.num_remote_env_runners() == 0 and learner_group.is_local:
        # All in this process: the state goes to the local runner as it is (no object store, no Ray needed).
        module_state, seq_no = _inference_state(local_learner(learner_group))
        nbytes, count = state_nbytes(module_state)
        if local is not None:
            local.set_state({COMPONENT_RL_MODULE: module_state, WEIGHTS_SEQ_NO: seq_no})
        report = SyncReport(nbytes, count, int(local is not None), time.perf_counter() - start)
        return lambda: report
    published = publish_weights(learner_group)
    publish_s = time.perf_counter() - start
    # Sequence number 0 makes a runner load the weights whatever number it holds (SingleAgentEnvRunner.set_state).
    module_state = {DEFAULT_MODULE_ID: published.weights}
    state = {COMPONENT_RL_MODULE: module_state, WEIGHTS_SEQ_NO: 0 if force else published.seq_no}

    def deliver() -> SyncReport:
        start = time.perf_counter()
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
                local.set_weights_seq_no(
                    published.seq_no
                )  # the reference the remote runners are checked against
        seconds = publish_s + time.perf_counter() - start
        return SyncReport(published.nbytes, published.num_tensors, runners, seconds)

    return deliver


ROLLOUT_WEIGHTS_DIR = "rollout_weights"


def write_rollout_weights(
    learner_group: Any, checkpoint: str | os.PathLike, prefix: str = "model."
) -> Path | None:
    """Write what the runners load (the policy in the rollout dtype) into ``checkpoint/rollout_weights`` as
    Hugging Face safetensors, one shard per bucket with ``model.safetensors.index.json`` when there are several;
    names lose ``prefix`` (the module's own). It travels as a sync does (learner 0 puts it, this process maps it),
    so the checkpoint's process writes it wherever the learner runs. None (nothing written) when the runners
    receive LoRA adapters, not a model."""
    from safetensors.torch import save_file

    published = publish_weights(learner_group)
    packed = published.weights
    names = list(packed)
    if any(".lora_" in name for name in names):
        logger.info(
            "rollout weights not written: the runners receive LoRA adapters (the checkpoint holds them)"
        )
        return None
    folder = Path(checkpoint) / ROLLOUT_WEIGHTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    count = len(packed.buckets)
    weight_map: dict[str, str] = {}
    for i in range(count):
        file = "model.safetensors" if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        # One bucket at a time; safetensors refuses tensors that share memory, and a bucket's views do.
        shard = {name.removeprefix(prefix): t.clone() for name, t in packed._bucket(i).items()}
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    if count > 1:
        index = {"metadata": {"total_size": published.nbytes}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder


def route_learner_syncs(group: Any, learner_group: Any, skip: Callable[[], bool] | None = None) -> None:
    """Send RLlib's own inference-only syncs of ``group`` from ``learner_group`` through ``sync_env_runners``:
    after a restore, before each validation (the evaluation runners), and to chosen runners (restored ones,
    loaded whatever their sequence number), so no RLlib path asks learner 0 for a copy of the weights.
    ``skip()`` True: leave out a sync to every runner (the runners are busy with a background validation)."""

    def sync(g: Any, lg: Any, ids: list[int] | None) -> None:
        if ids is None and skip is not None and skip():
            return
        sync_env_runners(g, lg, worker_ids=ids, force=ids is not None)

    route_learner_group_syncs(group, learner_group, sync)


def sync_local_runner(group: Any, learner_group: Any) -> None:
    """Load the learners' current weights into ``group``'s local runner, which a run with remote runners keeps
    without them; called before it plays in their place (no healthy remote runner, a local env)."""
    if learner_group.is_local:
        module_state, _ = _inference_state(local_learner(learner_group))
    else:
        module_state = {DEFAULT_MODULE_ID: publish_weights(learner_group).weights}
    group.local_env_runner.set_state({COMPONENT_RL_MODULE: module_state, WEIGHTS_SEQ_NO: 0})
