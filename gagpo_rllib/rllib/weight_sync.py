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
runner hands the bucket's tensors to its engine as they arrive, with no host copy on a GPU.

The ipc path (``weight_transport="ipc"``; ``"auto"`` picks it when learners and engines each have a share of a GPU,
the colocated layout of ``paper_setup``): each runner is paired with the lowest-ranked learner on its device
(GPU UUIDs; on CPU, the host), every learner with runners hosts a channel of its own, and shares each bucket with
them (a CUDA IPC handle to its device buffer; a shared-memory file on CPU) instead of sending it; each runner
copies the bucket on the device and its engine loads it. DDP learners hold the same weights and FSDP learners
gather each bucket whole, so any learner serves its GPU's engines. Runners with no learner on their device take
the object store.

Either channel is opened on the first sync and again when the set of healthy runners changes, a runner in it was
restored (``runners_left_channels``, from the Algorithm's restore) or a hosting learner is not in its channel
(restarted); a sync that fails on it is logged, counted (``SyncReport.fallback``) and done
through the object store, and after ``BROADCAST_MAX_FAILURES`` failures in a row the group's runners stay on the
object store. Syncs to chosen runners (restored ones) and the deferred syncs of ``max_staleness`` >= 1
(``prepare_sync``) always take the object store.
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
from dataclasses import dataclass, field
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
    SharedWeights,
    channel_open,
    close_channel,
    device_key,
    join_channel,
    open_channel,
    send_buckets,
    share_buckets,
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
    "CHANNEL_TRANSPORTS",
    "ROLLOUT_WEIGHTS_DIR",
    "close_weight_channels",
    "pair_by_device",
    "PackedWeights",
    "PublishedWeights",
    "prepare_sync",
    "SyncReport",
    "publish_weights",
    "publish_tensors",
    "route_learner_syncs",
    "runners_left_channels",
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
    (``transport``: "object_store", "broadcast" or "ipc"; ``fallback``: a channel sync failed and the object store
    served)."""

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
    transport = _channel_transport(group, learner_group) if worker_ids is None and not force else None
    if transport is not None:
        try:
            return _channel_sync(group, learner_group, transport)
        except Exception as err:  # noqa: BLE001 - any failure of a channel: the object store serves this sync
            fallback = True
            _channel_failed(group, learner_group, transport, err)
    report = prepare_sync(
        group, learner_group, worker_ids=worker_ids, force=force, timeout_seconds=timeout_seconds
    )()
    report.fallback = fallback
    return report


# ------------------------------------------------------------------------------------- broadcast and ipc
# A group whose channel sync failed this many times in a row takes the object store for the rest of the run.
BROADCAST_MAX_FAILURES = 3
# Seconds a member waits for the others (one collective, one shared bucket) before it fails.
BROADCAST_TIMEOUT_S = 300.0
_TAG = "gagpo_weight_broadcast"
_NAMES = itertools.count()
CHANNEL_TRANSPORTS = ("broadcast", "ipc")


@dataclass(frozen=True)
class _Link:
    """One channel: the learner (its rank among the learners) that hosts it and the runners in it (rank i + 1 is
    ``runner_ids[i]``)."""

    learner: int
    info: ChannelInfo
    runner_ids: tuple[int, ...]


@dataclass
class _Channels:
    """A runner group's channels: broadcast, one hosted by learner 0; ipc, one per learner that has runners on its
    device. ``runner_ids``: the healthy runners they were opened for; ``unlinked``: those no channel reaches (ipc:
    no learner on their device), which the object store serves; ``failures`` in a row; ``syncs`` so far (ipc
    names each sync's buckets by it)."""

    transport: str
    links: list[_Link] = field(default_factory=list)
    runner_ids: tuple[int, ...] = ()
    unlinked: tuple[int, ...] = ()
    failures: int = 0
    syncs: int = 0

    def names(self) -> dict[int, str]:
        """Learner rank -> the name of the channel it hosts."""
        return {link.learner: link.info.name for link in self.links}


_GROUP_CHANNELS: weakref.WeakKeyDictionary[Any, _Channels] = weakref.WeakKeyDictionary()


def transport_of(config: Any) -> str:
    """What ``config.weight_transport`` means for this run: "broadcast", "ipc" or "object_store" ("auto": broadcast
    when learners and engines each have whole GPUs, i.e. sit on different GPUs; ipc when both have a share of a
    GPU, i.e. the colocated layout; else the object store)."""
    choice = getattr(config, "weight_transport", "object_store")
    if choice != "auto":
        return choice
    learner_gpus = float(config.num_gpus_per_learner or 0)
    runner_gpus = float(config.num_gpus_per_env_runner or 0)
    if learner_gpus >= 1 and runner_gpus >= 1:
        return "broadcast"
    if 0 < learner_gpus < 1 and 0 < runner_gpus < 1:
        return "ipc"
    return "object_store"


def _channel_transport(group: Any, learner_group: Any) -> str | None:
    """The channel this sync of the whole ``group`` goes by ("broadcast" or "ipc"), or None: the object store (not
    chosen, no remote runners to reach, a local runner that samples and takes the object store's copy, or the
    group's channels given up)."""
    transport = transport_of(learner_group.config)
    if transport not in CHANNEL_TRANSPORTS or group.num_remote_env_runners() == 0:
        return None
    local = group.local_env_runner
    if local is not None and local.has_env():
        return None
    state = _GROUP_CHANNELS.get(group)
    return None if state is not None and state.failures >= BROADCAST_MAX_FAILURES else transport


def _on_learners(learner_group: Any, fn: Callable[[Any], Any]) -> list[Any]:
    """``fn(learner)`` on every learner at once (the local one, or every remote one); their results."""
    if learner_group.is_local:
        return [fn(local_learner(learner_group))]
    return on_every_learner(learner_group, fn)


def _rank() -> int:
    """This learner's rank among the learners (0 without a process group)."""
    from gagpo_rllib.policy.distributed import world

    return world()[1]


def _module_device(learner: Any) -> torch.device:
    return next(learner.module[DEFAULT_MODULE_ID].unwrapped().parameters()).device


def _learner_device(learner: Any) -> tuple[int, str]:
    """On a learner: its rank and the memory its weights live in (``device_key``)."""
    return _rank(), device_key(_module_device(learner))


def _runner_device(runner: Any) -> tuple[int, str]:
    """On a runner: its index and the memory its engine lives in (the GPU Ray gave it, else this host's)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return int(runner.worker_index), device_key(device)


def pair_by_device(
    learners: Mapping[int, str], runners: Mapping[int, str]
) -> tuple[dict[int, tuple[int, ...]], tuple[int, ...]]:
    """ipc: each runner goes to the lowest-ranked learner on its device (``device_key``s); returns learner rank ->
    its runners, and the runners with no learner on their device."""
    linked: dict[int, list[int]] = {}
    unlinked = []
    for runner, key in sorted(runners.items()):
        ranks = sorted(rank for rank, k in learners.items() if k == key)
        if ranks:
            linked.setdefault(ranks[0], []).append(runner)
        else:
            unlinked.append(runner)
    return {rank: tuple(ids) for rank, ids in sorted(linked.items())}, tuple(unlinked)


def _open_senders(learner: Any, *, channels: dict[int, tuple[str, int]], transport: str) -> tuple[int, Any]:
    """On every learner: the one whose rank is in ``channels`` hosts that channel (ipc; or NCCL where the weights are
    on a GPU, else gloo) and returns its rank and ``ChannelInfo``; the others (rank, None)."""
    import ray.util

    rank = _rank()
    if rank not in channels:
        return rank, None
    name, world_size = channels[rank]
    backend = "ipc" if transport == "ipc" else "nccl" if _module_device(learner).type == "cuda" else "gloo"
    info = open_channel(
        name, world_size, backend, address=ray.util.get_node_ip_address(), timeout_s=BROADCAST_TIMEOUT_S
    )
    return rank, info


def _join_senders(learner: Any, *, infos: dict[int, ChannelInfo]) -> bool | str:
    """On every learner: the host of a channel joins it as rank 0 (see ``_join``)."""
    info = infos.get(_rank())
    return True if info is None else _join(learner, info=info, rank=0)


def _plan(learner: Any, *, names: dict[int, str]) -> tuple[bool, tuple[int, list[list[Slot]]] | None]:
    """On every learner: whether it is in the channel it hosts (False: restarted, the channels are opened again
    before any runner waits); learner 0 also returns its weights' sequence number and the buckets this sync lays
    them out in. Weights that are not finite raise here (FSDP learners check theirs together in ``_send``)."""
    rank = _rank()
    joined = rank not in names or channel_open(names[rank])
    if rank != 0 or not joined:
        return joined, None
    if not learner.sharded:
        learner.check_weights_finite()
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    buckets = plan_buckets(module.inference_tensors(shards=True), module.dtype, BUCKET_BYTES)
    return True, (learner_weights_seq_no(learner), buckets)


def _send(
    learner: Any, *, names: dict[int, str], buckets: list[list[Slot]], transport: str, sync: int
) -> int:
    """On every learner: the host of a channel broadcasts or shares its inference weights bucket by bucket (FSDP:
    the learners check their shards finite together, then every learner gathers each bucket's tensors and the
    hosts send). Returns the bytes sent (0 where it hosts no channel)."""
    from gagpo_rllib.policy.fsdp import full_tensor

    name = names.get(_rank())
    if learner.sharded:
        module, _ = _shards_checked_finite(learner)
        tensors, whole = dict(module.inference_tensors(shards=True)), full_tensor
    elif name is None:
        return 0
    else:
        tensors, whole = dict(learner.module[DEFAULT_MODULE_ID].unwrapped().inference_tensors()), None
    keep = name is not None
    if transport == "ipc":
        return share_buckets(name, buckets, tensors, sync=sync, whole=whole, keep=keep)
    return send_buckets(name, buckets, tensors, whole=whole, keep=keep)


def _receive(
    runner: Any, *, name: str, buckets: list[list[Slot]], seq_no: int, transport: str, sync: int
) -> int | str:
    """On a runner: load the sync into its module (its engine reads the buckets as they arrive) under ``seq_no``;
    every bucket is taken even where loading stops early, so the sender completes. Returns the bytes received, or
    what went wrong as a string: an exception would make RLlib take the runner out of service, while the sync
    only falls back to the object store."""
    try:
        weights = (
            SharedWeights(name, buckets, sync=sync) if transport == "ipc" else BroadcastWeights(name, buckets)
        )
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


def _leave(member: Any, *, names: list[str]) -> bool:
    for name in names:
        close_channel(name)
    return True


def _on_runners(group: Any, fns: list[Callable[[Any], Any]], ids: tuple[int, ...]) -> None:
    """Start ``fns[i]`` on runner ``ids[i]`` without waiting (``_collect`` waits)."""
    started = group.foreach_env_runner_async(fns, tag=_TAG, remote_worker_ids=list(ids))
    if started != len(ids):
        raise RuntimeError(f"weight channel: {started} of {len(ids)} runners took the call")


def _collect(group: Any, ids: tuple[int, ...]) -> list[Any]:
    """The runners' replies to the calls ``_on_runners`` started, in the order of ``ids``; raises if one is missing
    or reports an error."""
    replies = dict(group.fetch_ready_async_reqs(tags=_TAG, timeout_seconds=BROADCAST_TIMEOUT_S))
    errors = {i: value for i, value in replies.items() if isinstance(value, str)}
    if errors:
        raise RuntimeError(f"weight channel: runners failed: {errors}")
    if sorted(replies) != sorted(ids):
        raise RuntimeError(f"weight channel: runners {sorted(ids)} were asked, {sorted(replies)} answered")
    return [replies[i] for i in ids]


def _linked_runners(state: _Channels) -> tuple[int, ...]:
    return tuple(i for link in state.links for i in link.runner_ids)


def _open(group: Any, learner_group: Any, ids: tuple[int, ...], state: _Channels) -> None:
    """Open the group's channels for runners ``ids``: who hosts which runners (broadcast: learner 0 all of them;
    ipc: each learner those on its device), the hosts open their stores, then all members join at once."""
    if state.transport == "ipc":
        learners = dict(_on_learners(learner_group, _learner_device))
        runners = dict(
            group.foreach_env_runner(_runner_device, local_env_runner=False, remote_worker_ids=list(ids))
        )
        if sorted(runners) != sorted(ids):
            raise RuntimeError(
                f"weight channel: runners {sorted(ids)} were asked, {sorted(runners)} answered"
            )
        plan, unlinked = pair_by_device(learners, runners)
    else:
        plan, unlinked = {0: ids}, ()
    channels = {rank: (f"{os.getpid()}-{next(_NAMES)}", len(rids) + 1) for rank, rids in plan.items()}
    infos = {
        rank: info
        for rank, info in _on_learners(
            learner_group, partial(_open_senders, channels=channels, transport=state.transport)
        )
        if info is not None
    }
    if sorted(infos) != sorted(plan):
        raise RuntimeError(
            f"weight channel: learners {sorted(plan)} were to host channels, {sorted(infos)} did"
        )
    links = [_Link(rank, infos[rank], rids) for rank, rids in plan.items()]
    members = tuple(i for link in links for i in link.runner_ids)
    joins = [
        partial(_join, info=link.info, rank=r) for link in links for r in range(1, len(link.runner_ids) + 1)
    ]
    if members:
        _on_runners(group, joins, members)
    try:
        joined = _on_learners(learner_group, partial(_join_senders, infos=infos))
    finally:
        if members:
            _collect(group, members)
    failed = [j for j in joined if j is not True]
    if failed:
        raise RuntimeError(f"weight channel: a hosting learner could not join: {failed}")
    state.links, state.runner_ids, state.unlinked = links, ids, unlinked


def runners_left_channels(group: Any, worker_ids: list[int]) -> None:
    """Runners ``worker_ids`` of ``group`` were restored (new processes, in no channel): the group's next channel
    sync opens new channels before any learner sends, instead of failing over after the channel's timeout."""
    state = _GROUP_CHANNELS.get(group)
    if state is not None and set(worker_ids) & set(_linked_runners(state)):
        state.runner_ids = ()


def _close(group: Any, learner_group: Any, state: _Channels) -> None:
    """Leave the group's channels everywhere they are open (best effort: members that are gone have left)."""
    if not state.links:
        state.runner_ids, state.unlinked = (), ()
        return
    names = [link.info.name for link in state.links]
    ids = _linked_runners(state)
    state.links, state.runner_ids, state.unlinked = [], (), ()
    with _suppressed("closing the weight channels on the learners"):
        _on_learners(learner_group, partial(_leave, names=names))
    healthy = [i for i in ids if i in set(group.healthy_env_runner_ids())]
    if healthy:
        with _suppressed("closing the weight channels on the runners"):
            group.foreach_env_runner(
                partial(_leave, names=names),
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
        logger.warning("weight channel: %s failed: %s", what, err)


def _plan_sync(learner_group: Any, state: _Channels) -> tuple[int, list[list[Slot]]] | None:
    """Learner 0's sequence number and buckets for this sync, or None when a host is not in its channel."""
    answers = _on_learners(learner_group, partial(_plan, names=state.names()))
    if not all(joined for joined, _ in answers):
        return None
    plan = next((plan for _, plan in answers if plan is not None), None)
    if plan is None:
        raise RuntimeError("weight channel: no learner of rank 0 answered")
    return plan


def _channel_sync(group: Any, learner_group: Any, transport: str) -> SyncReport:
    """One sync of every healthy remote runner of ``group`` over the group's channels (opened on first use and
    whenever the healthy runners change or a host left its channel): the runners start receiving, the hosts send,
    all finish together; runners no channel reaches take the object store's copy."""
    start = time.perf_counter()
    state = _GROUP_CHANNELS.get(group)
    if state is None or state.transport != transport:
        state = _GROUP_CHANNELS[group] = _Channels(transport)
    with _suppressed("collecting the replies of an earlier failed sync"):
        group.fetch_ready_async_reqs(tags=_TAG, timeout_seconds=0)
    ids = tuple(sorted(group.healthy_env_runner_ids()))
    if not ids:
        raise RuntimeError("weight channel: no healthy remote runner")
    plan = None
    if state.runner_ids == ids:
        plan = _plan_sync(learner_group, state)
    if plan is None:
        _close(group, learner_group, state)
        _open(group, learner_group, ids, state)
        plan = _plan_sync(learner_group, state)
        if plan is None:
            raise RuntimeError("weight channel: a learner is not in the channel it just opened")
    seq_no, buckets = plan
    state.syncs += 1
    linked = _linked_runners(state)
    receive = partial(_receive, buckets=buckets, seq_no=seq_no, transport=transport, sync=state.syncs)
    sent = 0
    if linked:
        _on_runners(
            group,
            [partial(receive, name=link.info.name) for link in state.links for _ in link.runner_ids],
            linked,
        )
        try:
            sent = max(
                _on_learners(
                    learner_group,
                    partial(
                        _send, names=state.names(), buckets=buckets, transport=transport, sync=state.syncs
                    ),
                )
            )
        finally:
            received = _collect(group, linked)
        if any(r != sent for r in received):
            raise RuntimeError(f"weight channel: {sent} bytes sent, runners received {received}")
    nbytes = sent or sum(slot.nbytes for slots in buckets for slot in slots)
    if state.unlinked:  # ipc: runners with no learner on their device
        prepare_sync(group, learner_group, worker_ids=list(state.unlinked))()
    local = group.local_env_runner
    if local is not None:
        local.set_weights_seq_no(seq_no)  # the reference the remote runners are checked against
    state.failures = 0
    tensors = sum(len(slots) for slots in buckets)
    used = transport if linked else "object_store"
    return SyncReport(nbytes, tensors, len(ids), time.perf_counter() - start, transport=used)


def close_weight_channels(group: Any, learner_group: Any) -> None:
    """Close ``group``'s broadcast or ipc channels, if it has any (the Algorithm's ``stop``)."""
    state = _GROUP_CHANNELS.pop(group, None)
    if state is not None:
        _close(group, learner_group, state)


def _channel_failed(group: Any, learner_group: Any, transport: str, err: BaseException) -> None:
    """Count a failed channel sync, close the channels (the next sync opens new ones) and say what happened."""
    state = _GROUP_CHANNELS.get(group)
    if state is None or state.transport != transport:
        state = _GROUP_CHANNELS[group] = _Channels(transport)
    state.failures += 1
    _close(group, learner_group, state)
    logger.warning(
        "weight %s failed (%d in a row%s): %s; this sync goes through the object store",
        transport,
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
