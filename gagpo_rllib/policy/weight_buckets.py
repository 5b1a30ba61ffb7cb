"""Weights as a few flat byte buckets: how the host path moves a model from a learner to the rollout engines.

A state of hundreds of tensors travels as buckets of at most ``bucket_bytes`` each (one contiguous ``uint8``
buffer per bucket, every tensor at a 64-byte aligned offset, cast to the rollout dtype while it is copied in).
Why: a flat ``uint8`` array goes through Ray's object store out of band (one memcpy into shared memory, no
pickling of tensor bytes, which bfloat16 tensors otherwise get), a reader maps it without a copy, the cast and the
copy run on several threads at once, and a bucket can travel while the next one is being filled.

Nothing here knows about Ray: ``pack`` fills buckets, ``unpack`` gives (name, tensor) views back.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DEFAULT_BUCKET_BYTES", "Slot", "bucket_size", "pack", "plan_buckets", "unpack"]

DEFAULT_BUCKET_BYTES = 256 << 20
_ALIGN = 64
# A tensor is cast and copied in pieces of this many bytes (of the destination), so one large tensor (an
# embedding) also spreads over the threads.
_PIECE_BYTES = 8 << 20


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in its bucket."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _target_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """Floating-point tensors take the rollout dtype; integer and bool buffers keep theirs."""
    return dtype if (dtype is not None and t.is_floating_point()) else t.dtype


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> list[list[Slot]]:
    """Slots for ``named`` in order, a new bucket whenever the next tensor would pass ``bucket_bytes`` (a tensor
    larger than that gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[Slot]] = []
    current: list[Slot] = []
    used = 0
    for name, t in named:
        target = _target_dtype(t, dtype)
        offset = -(-used // _ALIGN) * _ALIGN
        slot = Slot(name, target, tuple(t.shape), offset)
        if current and offset + slot.nbytes > bucket_bytes:
            buckets.append(current)
            current, offset = [], 0
            slot = Slot(name, target, tuple(t.shape), 0)
        current.append(slot)
        used = offset + slot.nbytes
    if current:
        buckets.append(current)
    return buckets


def bucket_size(slots: list[Slot]) -> int:
    return slots[-1].offset + slots[-1].nbytes if slots else 0


def _view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    return buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)


def _copy_tasks(slot: Slot, dst: torch.Tensor, src: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(destination, source) pieces of one tensor copy, split along the flat index."""
    if src.device.type != "cpu":
        # Cast where the weights live, then one device-to-host copy of the rollout-dtype bytes.
        src = src.to(slot.dtype)
    flat_dst, flat_src = dst.reshape(-1), src.detach().contiguous().reshape(-1)
    step = max(1, _PIECE_BYTES // slot.dtype.itemsize)
    return [(flat_dst[i : i + step], flat_src[i : i + step]) for i in range(0, flat_dst.numel(), step)]


def pack(
    slots: list[Slot],
    tensors: dict[str, torch.Tensor] | Iterable[torch.Tensor],
    pool: ThreadPoolExecutor | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One bucket: a ``uint8`` CPU tensor holding ``tensors`` (by slot name, or in slot order) cast and laid out
    as ``slots`` say. The copies run on ``pool``'s threads (None: this thread). ``out``: a staging buffer of at
    least the bucket's size to fill (reused between syncs, it spares the page faults of fresh memory, which cost
    more than the copy itself); its first ``bucket_size(slots)`` bytes are returned."""
    values = [tensors[s.name] for s in slots] if isinstance(tensors, dict) else list(tensors)
    if len(values) != len(slots):
        raise ValueError(f"pack: {len(slots)} slots but {len(values)} tensors")
    size = bucket_size(slots)
    if out is None:
        buffer = torch.empty(size, dtype=torch.uint8)
    elif out.dtype != torch.uint8 or out.dim() != 1 or out.numel() < size:
        raise ValueError(f"pack: out must be a flat uint8 tensor of at least {size} bytes")
    else:
        buffer = out[:size]
    tasks: list[tuple[torch.Tensor, torch.Tensor]] = []
    for slot, t in zip(slots, values, strict=True):
        if tuple(t.shape) != slot.shape:
            raise ValueError(f"pack: {slot.name} has shape {tuple(t.shape)}, its slot {slot.shape}")
        tasks.extend(_copy_tasks(slot, _view(buffer, slot), t))
    with torch.no_grad():
        if pool is None or len(tasks) == 1:
            for dst, src in tasks:
                dst.copy_(src)
        else:
            list(pool.map(lambda task: task[0].copy_(task[1]), tasks))
    return buffer


def unpack(slots: list[Slot], buffer: np.ndarray | torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of one bucket, no copy; read-only when ``buffer`` is (an object-store mapping):
    the receiver copies them into its own weights."""
    if isinstance(buffer, np.ndarray):
        with warnings.catch_warnings():  # torch warns that a read-only array gives a tensor it must not write
            warnings.simplefilter("ignore", UserWarning)
            buffer = torch.from_numpy(buffer)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < bucket_size(slots):
        raise ValueError(
            f"unpack: expected a flat uint8 buffer of {bucket_size(slots)} bytes, got {buffer.dtype} "
            f"{tuple(buffer.shape)}"
        )
    for slot in slots:
        yield slot.name, _view(buffer, slot)
