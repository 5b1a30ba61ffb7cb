"""Weight channels from a learner to engines: each bucket is broadcast once over a collective group, or shared with
engines on the learner's own device.

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

With an engine on the sender's own device there is nothing to send: ``backend="ipc"`` shares each bucket instead
(``share_buckets``). The sender packs it into memory the receivers can map (on a GPU: the device buffer, exported as
a CUDA IPC handle; on CPU: a file in shared memory), publishes the handle in the channel's store, and each receiver
maps the bucket, copies it (a device-to-device copy, so the sender may free it), says so in the store and hands the
copy's tensors to its engine. The sender keeps at most ``window`` buckets mapped at once. Receivers find the device
by its UUID, so a GPU numbered differently in each process (``CUDA_VISIBLE_DEVICES``) is still the same one.

Nothing here knows about Ray or RLlib (``gagpo_rllib.rllib.weight_sync`` drives it).
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gagpo_rllib.policy.weight_buckets import Slot, bucket_size, pack, unpack

__all__ = [
    "BROADCAST_BACKENDS",
    "CHANNEL_BACKENDS",
    "BroadcastWeights",
    "ChannelInfo",
    "SharedWeights",
    "channel_open",
    "close_channel",
    "device_key",
    "join_channel",
    "open_channel",
    "send_buckets",
    "share_buckets",
]

BROADCAST_BACKENDS = ("gloo", "nccl")
# "ipc": no process group, the store carries handles to memory the receivers map (``share_buckets``).
CHANNEL_BACKENDS = (*BROADCAST_BACKENDS, "ipc")


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
    joined: bool = False


# This process's channels by name: a learner may serve several runner groups (training, evaluation).
_CHANNELS: dict[str, _Channel] = {}


def open_channel(
    name: str, world_size: int, backend: str, *, address: str, timeout_s: float = 300.0
) -> ChannelInfo:
    """On rank 0 (the sender): host the channel's store on a free port of ``address`` (this node's, as the members
    reach it); returns what the members join with. A channel of the same name in this process is closed first."""
    if backend not in CHANNEL_BACKENDS:
        raise ValueError(
            f"weight channel {name!r}: backend must be one of {CHANNEL_BACKENDS}, got {backend!r}"
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
    member has joined (``ipc``: a member only connects to the store)."""
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
    elif info.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        channel.group = dist.ProcessGroupNCCL(prefixed, rank, info.world_size, options)
    channel.joined = True  # ipc: the store is all a member needs


def channel_open(name: str) -> bool:
    """Whether this process is a joined member of channel ``name``."""
    channel = _CHANNELS.get(name)
    return channel is not None and channel.joined


def close_channel(name: str) -> None:
    """Leave channel ``name`` (nothing when this process is not in it)."""
    channel = _CHANNELS.pop(name, None)
    if channel is not None and channel.group is not None and hasattr(channel.group, "shutdown"):
        # A backend without an explicit shutdown raises: its destructor closes it.
        with contextlib.suppress(RuntimeError):
            channel.group.shutdown()


def _member(name: str, rank: int | None = None, *, ipc: bool = False) -> _Channel:
    channel = _CHANNELS.get(name)
    if channel is None or not channel.joined:
        raise RuntimeError(f"weight channel {name!r}: this process has not joined it")
    if rank is not None and channel.rank != rank:
        raise RuntimeError(f"weight channel {name!r}: this process is rank {channel.rank}, not {rank}")
    if (channel.info.backend == "ipc") != ipc:
        verb = "shares" if channel.info.backend == "ipc" else "broadcasts"
        raise RuntimeError(f"weight channel {name!r}: a {channel.info.backend} channel {verb} its buckets")
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


class _StreamedWeights(Mapping):
    """A receiver's view of one sync: a read-only mapping name -> tensor that takes the buckets in order as their
    tensors are read (what an engine's load reads, in the sender's order), keeping one bucket at hand. ``drain``
    takes whatever was not read, so the receiver always takes part in every bucket."""

    def __init__(self, channel: _Channel, buckets: list[list[Slot]]) -> None:
        if channel.rank == 0:
            raise RuntimeError(f"weight channel {channel.info.name!r}: rank 0 sends, it does not receive")
        self.channel = channel
        self.buckets = buckets
        self._where = {slot.name: i for i, slots in enumerate(buckets) for slot in slots}
        self._received = -1
        self._current: dict[str, torch.Tensor] = {}
        self.nbytes = 0

    def _take(self, index: int, slots: list[Slot]) -> torch.Tensor:
        """Bucket ``index`` as a ``uint8`` tensor this receiver owns (the engine may hold on to its tensors)."""
        raise NotImplementedError

    def _receive_through(self, index: int) -> None:
        if index < self._received:
            raise RuntimeError(
                f"weight channel {self.channel.info.name!r}: bucket {index} was asked for after bucket "
                f"{self._received}; a sync is read in the sender's order"
            )
        while self._received < index:
            slots = self.buckets[self._received + 1]
            buffer = self._take(self._received + 1, slots)
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
        """Take the buckets not read yet; returns the bytes received in all."""
        if self.buckets:
            self._receive_through(len(self.buckets) - 1)
        self._current = {}
        return self.nbytes


class BroadcastWeights(_StreamedWeights):
    """A receiver's view of one broadcast (``send_buckets``): each bucket is received into a fresh buffer."""

    def __init__(self, name: str, buckets: list[list[Slot]]) -> None:
        super().__init__(_member(name), buckets)

    def _take(self, index: int, slots: list[Slot]) -> torch.Tensor:
        buffer = torch.empty(bucket_size(slots), dtype=torch.uint8, device=_device(self.channel))
        self.channel.group.broadcast(buffer, 0).wait()
        return buffer


# ---------------------------------------------------------------------------------------------- shared buckets
def device_key(device: torch.device | str) -> str:
    """Which memory ``device`` is, the same string in every process that sees it: a GPU's UUID, or this host's
    shared memory (a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_properties(index).uuid}"
    if device.type == "cpu":
        return f"host:{socket.gethostname()}"
    raise ValueError(f"weight sharing: no shared memory for device {device}")


def _cuda_index(key: str) -> int:
    """This process's index of the GPU ``key`` names."""
    for i in range(torch.cuda.device_count()):
        if device_key(torch.device("cuda", i)) == key:
            return i
    raise RuntimeError(f"weight sharing: GPU {key} is not visible in this process")


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _shared_buffer(nbytes: int, device: torch.device, path: str) -> torch.Tensor:
    """A ``uint8`` buffer other processes can map: on a GPU a device buffer, on CPU a file in shared memory."""
    if device.type == "cuda":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def _export(buffer: torch.Tensor, path: str) -> tuple:
    """The handle other processes map ``buffer`` with (``_map_shared``): a GPU buffer's CUDA IPC handle
    (``torch.multiprocessing``'s, with the GPU's UUID in place of this process's index; taken after the buffer is
    written, so its event covers the writes), or the shared-memory file's path."""
    if buffer.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        _, args = reduce_tensor(buffer)
        return ("cuda", device_key(buffer.device), args)
    return ("file", path, buffer.numel())


def _map_shared(handle: tuple) -> torch.Tensor:
    """The buffer a ``_shared_buffer`` handle names, mapped into this process (no copy)."""
    if handle[0] == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        _, key, args = handle
        args = list(args)
        args[6] = _cuda_index(key)  # the storage's device, in this process's numbering
        return rebuild_cuda_tensor(*args)
    _, path, nbytes = handle
    return torch.from_file(path, shared=False, size=nbytes, dtype=torch.uint8)


def _free_shared(handle: tuple) -> None:
    if handle[0] == "file":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle[1])


def _bucket_key(sync: int, index: int) -> str:
    return f"{sync}/bucket/{index}"


def _done_key(sync: int, index: int, rank: int) -> str:
    return f"{sync}/done/{index}/{rank}"


def share_buckets(
    name: str,
    buckets: list[list[Slot]],
    tensors: Mapping[str, torch.Tensor],
    *,
    sync: int,
    whole: Callable[[torch.Tensor], torch.Tensor] | None = None,
    keep: bool = True,
    window: int = 2,
) -> int:
    """Rank 0 of an ``ipc`` channel: share ``tensors`` laid out as ``buckets`` with the receivers, each bucket cast
    and packed into shared memory on the weights' device (a GPU buffer, or a shared-memory file on CPU) and its
    handle published under sync number ``sync`` (the receivers' ``SharedWeights`` take the same number). A bucket
    is freed once every receiver has copied it; at most ``window`` are mapped at once. ``whole`` and ``keep`` as in
    ``send_buckets``. Returns the bytes shared."""
    channel = _member(name, 0, ipc=True) if keep else None
    receivers = channel.info.world_size - 1 if channel is not None else 0
    timeout = timedelta(seconds=channel.info.timeout_s) if channel is not None else None
    in_flight: collections.deque[tuple[int, torch.Tensor, tuple]] = collections.deque()

    def release() -> None:
        index, _, handle = in_flight.popleft()
        try:
            channel.store.wait([_done_key(sync, index, r) for r in range(1, receivers + 1)], timeout)
        finally:
            _free_shared(handle)
        for key in [_bucket_key(sync, index), *(_done_key(sync, index, r) for r in range(1, receivers + 1))]:
            channel.store.delete_key(key)

    device = None
    shared = 0
    try:
        for i, slots in enumerate(buckets):
            values = {slot.name: tensors[slot.name] for slot in slots}
            if whole is not None:
                values = {k: whole(t) for k, t in values.items()}
            if channel is None:
                continue
            if device is None:
                device = next(iter(values.values())).device
            while len(in_flight) >= max(1, window):
                release()
            path = os.path.join(_shm_dir(), f"gagpo-weights-{os.getpid()}-{name}-{sync}-{i}")
            buffer = _shared_buffer(bucket_size(slots), device, path)
            # Listed before it is published, so a failure from here on frees it too (a GPU buffer frees itself).
            in_flight.append((i, buffer, ("file", path, 0) if device.type != "cuda" else ("cuda",)))
            pack(slots, values, None, out=buffer)
            handle = _export(buffer, path)
            in_flight[-1] = (i, buffer, handle)
            channel.store.set(_bucket_key(sync, i), pickle.dumps(handle))
            shared += buffer.numel()
        while in_flight:
            release()
    finally:
        # A receiver that did not answer: nothing is left behind in shared memory.
        for _, _, handle in in_flight:
            _free_shared(handle)
    return shared


class SharedWeights(_StreamedWeights):
    """A receiver's view of one ``share_buckets`` sync number ``sync``: each bucket is mapped when its handle is in
    the store, copied (on the sender's device), and the sender is told it may free it."""

    def __init__(self, name: str, buckets: list[list[Slot]], *, sync: int) -> None:
        super().__init__(_member(name, ipc=True), buckets)
        self.sync = sync

    def _take(self, index: int, slots: list[Slot]) -> torch.Tensor:
        store = self.channel.store
        handle = pickle.loads(store.get(_bucket_key(self.sync, index)))
        mapped = _map_shared(handle)
        if mapped.numel() != bucket_size(slots):
            raise RuntimeError(
                f"weight channel {self.channel.info.name!r}: bucket {index} holds {mapped.numel()} bytes, "
                f"its slots {bucket_size(slots)}"
            )
        buffer = mapped.clone()
        if buffer.is_cuda:
            torch.cuda.current_stream(buffer.device).synchronize()
        del mapped
        store.set(_done_key(self.sync, index, self.channel.rank), b"1")
        return buffer

    def drain(self) -> int:
        """As ``_StreamedWeights.drain``; where taking a bucket fails, the sender is first told to free the rest."""
        try:
            return super().drain()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Mark every bucket not taken yet as copied, so the sender frees them now instead of waiting out the
        channel's timeout for this receiver (its failure reaches the driver, which falls back, by other means)."""
        for index in range(self._received + 1, len(self.buckets)):
            with contextlib.suppress(Exception):  # a store that is gone: the sender times out as before
                self.channel.store.set(_done_key(self.sync, index, self.channel.rank), b"1")
