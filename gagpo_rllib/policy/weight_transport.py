"""Weights broadcast over a collective group: learner 0 sends each bucket once, every engine receives it in place.

The host path (``weight_buckets`` through Ray's object store) copies the weights to host memory on the learner and
back to the device on every runner. With the learner and the engines on different GPUs the bytes can go device
to device instead: learner 0 (rank 0) and the runners' engines (ranks 1..n) form a process group of their own
(NCCL on GPUs, gloo on CPUs, where the same code runs and is tested), learner 0 casts a bucket of tensors to the
rollout dtype where they live and broadcasts it, and each receiver hands the bucket's tensors to its engine
before the next bucket arrives. The buckets, their layout and the cast are ``weight_buckets``' (``plan_buckets``,
``pack``, ``unpack``), so what an engine receives is bit for bit what the host path delivers.

The group is stateless with respect to ``torch.distributed``'s default group: a ``TCPStore`` hosted by rank 0 and
a ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` built on it, so it lives beside the learners' own DDP/FSDP group.
Channels are kept per process by name (``open_channel``, ``join_channel``, ``close_channel``): rank 0 opens the
store first (its address goes to the others), then every member joins at once (the constructor is a
rendezvous). A broadcast is a collective: every member must take part in every bucket, in order.

Nothing here knows about Ray or RLlib (``gagpo_rllib.rllib.weight_sync`` drives it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gagpo_rllib.policy.weight_buckets import Slot, bucket_size, pack, unpack

__all__ = [
    "BROADCAST_BACKENDS",
    "BroadcastWeights",
    "ChannelInfo",
    "channel_open",
    "close_channel",
    "join_channel",
    "open_channel",
    "send_buckets",
]

BROADCAST_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class ChannelInfo:
    """How the members reach rank 0's store: what ``open_channel`` returns and ``join_channel`` takes."""

    name: str
    address: str
    port: int
    world_size: int
    backend: str
    timeout_s: float


@dataclass
class _Channel:
    info: ChannelInfo
    rank: int
    store: dist.Store
    group: dist.ProcessGroup | None = None


# This process's channels by name: a learner may serve several runner groups (training, evaluation).
_CHANNELS: dict[str, _Channel] = {}


def open_channel(
    name: str, world_size: int, backend: str, *, address: str, timeout_s: float = 300.0
) -> ChannelInfo:
    """On rank 0 (the sender): host the channel's store on a free port of ``address`` (this node's, as the members
    reach it); returns what the members join with. A channel of the same name in this process is closed first."""
    if backend not in BROADCAST_BACKENDS:
        raise ValueError(
            f"weight channel {name!r}: backend must be one of {BROADCAST_BACKENDS}, got {backend!r}"
        )
    if world_size < 2:
        raise ValueError(
            f"weight channel {name!r}: world_size must be >= 2 (a sender and a receiver), got {world_size}"
        )
    close_channel(name)
    store = dist.TCPStore(address, 0, world_size, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    info = ChannelInfo(name, address, int(store.port), world_size, backend, float(timeout_s))
    _CHANNELS[name] = _Channel(info, 0, store)
    return info


def join_channel(info: ChannelInfo, rank: int) -> None:
    """Build this process's member of the channel (rank 0: the process that opened it). Blocks until every
    member has joined."""
    if not 0 <= rank < info.world_size:
        raise ValueError(f"weight channel {info.name!r}: rank {rank} outside [0, {info.world_size})")
    timeout = timedelta(seconds=info.timeout_s)
    if rank == 0:
        channel = _CHANNELS.get(info.name)
        if channel is None or channel.info != info:
            raise RuntimeError(f"weight channel {info.name!r}: rank 0 must open it in this process first")
    else:
        close_channel(info.name)
        store = dist.TCPStore(info.address, info.port, info.world_size, False, timeout)
        channel = _Channel(info, rank, store)
        _CHANNELS[info.name] = channel
    prefixed = dist.PrefixStore(f"gagpo_weights/{info.name}", channel.store)
    if info.backend == "gloo":
        channel.group = dist.ProcessGroupGloo(prefixed, rank, info.world_size, timeout)
    else:
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        channel.group = dist.ProcessGroupNCCL(prefixed, rank, info.world_size, options)


def channel_open(name: str) -> bool:
    """Whether this process is a joined member of channel ``name``."""
    channel = _CHANNELS.get(name)
    return channel is not None and channel.group is not None


def close_channel(name: str) -> None:
    """Leave channel ``name`` (nothing when this process is not in it)."""
    channel = _CHANNELS.pop(name, None)
    if channel is not None and channel.group is not None and hasattr(channel.group, "shutdown"):
        # A backend without an explicit shutdown raises: its destructor closes it.
        with contextlib.suppress(RuntimeError):
            channel.group.shutdown()


def _member(name: str, rank: int | None = None) -> _Channel:
    channel = _CHANNELS.get(name)
    if channel is None or channel.group is None:
        raise RuntimeError(f"weight channel {name!r}: this process has not joined it")
    if rank is not None and channel.rank != rank:
        raise RuntimeError(f"weight channel {name!r}: this process is rank {channel.rank}, not {rank}")
    return channel


def _device(channel: _Channel) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if channel.info.backend == "nccl"
        else torch.device("cpu")
    )


def send_buckets(
    name: str,
    buckets: list[list[Slot]],
    tensors: Mapping[str, torch.Tensor],
    *,
    whole: Callable[[torch.Tensor], torch.Tensor] | None = None,
    keep: bool = True,
) -> int:
    """Rank 0: broadcast ``tensors`` laid out as ``buckets`` (``plan_buckets``), each bucket cast and packed where
    the weights live (NCCL: a device buffer, no host copy) and sent before the next is packed. ``whole`` makes a
    bucket's tensors whole first (FSDP: a gather every learner runs in the same order); ``keep`` False only takes
    part in those gathers (a learner outside the channel). Returns the bytes sent."""
    channel = _member(name, 0) if keep else None
    device = _device(channel) if channel is not None else None
    sent = 0
    for slots in buckets:
        values = {slot.name: tensors[slot.name] for slot in slots}
        if whole is not None:
            values = {k: whole(t) for k, t in values.items()}
        if channel is None:
            continue
        buffer = torch.empty(bucket_size(slots), dtype=torch.uint8, device=device)
        if device.type != "cpu":
            values = {k: t.to(device) for k, t in values.items()}
        pack(slots, values, None, out=buffer)
        channel.group.broadcast(buffer, 0).wait()
        sent += buffer.numel()
    if device is not None and device.type == "cuda":
        torch.cuda.current_stream().synchronize()
    return sent


class BroadcastWeights(Mapping):
    """A receiver's view of one broadcast: a read-only mapping name -> tensor that receives the buckets in order
    as their tensors are read (what an engine's load reads in the sender's order), keeping one bucket at hand.
    ``drain`` receives whatever was not read, so the receiver always takes part in every bucket."""

    def __init__(self, name: str, buckets: list[list[Slot]]) -> None:
        self.channel = _member(name)
        if self.channel.rank == 0:
            raise RuntimeError(f"weight channel {name!r}: rank 0 sends, it does not receive")
        self.buckets = buckets
        self._where = {slot.name: i for i, slots in enumerate(buckets) for slot in slots}
        self._received = -1
        self._current: dict[str, torch.Tensor] = {}
        self.nbytes = 0

    def _receive_through(self, index: int) -> None:
        if index < self._received:
            raise RuntimeError(
                f"weight channel {self.channel.info.name!r}: bucket {index} was asked for after bucket "
                f"{self._received}; a broadcast is read in the sender's order"
            )
        while self._received < index:
            slots = self.buckets[self._received + 1]
            # A fresh buffer per bucket: the engine may hold on to the tensors it was handed.
            buffer = torch.empty(bucket_size(slots), dtype=torch.uint8, device=_device(self.channel))
            self.channel.group.broadcast(buffer, 0).wait()
            self._received += 1
            self.nbytes += buffer.numel()
            self._current = dict(unpack(slots, buffer))

    def __getitem__(self, key: str) -> torch.Tensor:
        index = self._where[key]
        self._receive_through(index)
        return self._current[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[override]
        """Bucket by bucket, in the order the sender sends them."""
        for i, slots in enumerate(self.buckets):
            self._receive_through(i)
            for slot in slots:
                yield slot.name, self._current[slot.name]

    def drain(self) -> int:
        """Receive the buckets not read yet; returns the bytes received in all."""
        if self.buckets:
            self._receive_through(len(self.buckets) - 1)
        self._current = {}
        return self.nbytes
