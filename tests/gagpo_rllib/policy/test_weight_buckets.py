"""Weight buckets: the layout is ordered, aligned and bounded, and what comes out is, bit for bit, the input cast
to the rollout dtype (integer buffers untouched), whatever the number of threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from gagpo_rllib.policy import weight_buckets
from gagpo_rllib.policy.weight_buckets import bucket_size, pack, plan_buckets, unpack


def _state(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(300, 17, generator=gen)),
        ("layer.0.q.weight", torch.randn(17, 17, generator=gen) * 1e3),
        ("layer.0.norm.weight", torch.randn(17, generator=gen)),
        ("rotary.inv_freq", torch.arange(9, dtype=torch.int64)),
        ("layer.1.q.weight", torch.randn(5, 3, 7, generator=gen)[:, 1]),  # not contiguous
        ("scalar", torch.tensor(0.3)),
    ]


def test_plan_keeps_order_aligns_offsets_and_bounds_buckets() -> None:
    named = _state()
    buckets = plan_buckets(named, torch.bfloat16, bucket_bytes=4096)
    slots = [s for b in buckets for s in b]
    assert [s.name for s in slots] == [n for n, _ in named]
    assert len(buckets) > 1
    for bucket in buckets:
        assert all(s.offset % 64 == 0 for s in bucket)
        ends = [s.offset + s.nbytes for s in bucket]
        assert all(end <= nxt.offset for end, nxt in zip(ends, bucket[1:], strict=False))  # no overlap
        assert bucket_size(bucket) <= 4096 or len(bucket) == 1  # only a tensor larger than a bucket is alone
    assert (
        buckets[0][0].nbytes == 300 * 17 * 2 and len(buckets[0]) == 1
    )  # 10,200 bytes > 4,096: its own bucket
    dtypes = {s.name: s.dtype for s in slots}
    assert dtypes["rotary.inv_freq"] == torch.int64 and dtypes["embed.weight"] == torch.bfloat16
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(named, torch.bfloat16, bucket_bytes=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, None])
@pytest.mark.parametrize("threads", [None, 3])
def test_unpacked_tensors_equal_the_cast_inputs_bit_for_bit(
    dtype: torch.dtype | None, threads: int | None, monkeypatch
) -> None:
    monkeypatch.setattr(weight_buckets, "_PIECE_BYTES", 256)  # split tensors into many pieces across threads
    named = _state(1)
    buckets = plan_buckets(named, dtype, bucket_bytes=2048)
    inputs = dict(named)
    out = {}
    pool = ThreadPoolExecutor(threads) if threads else None
    try:
        staging = torch.full(
            (4096,), 255, dtype=torch.uint8
        )  # reused and dirty: each tensor byte is overwritten
        for slots in buckets:
            buffer = pack(slots, inputs, pool, out=staging if bucket_size(slots) <= 4096 else None)
            # As a reader sees it: a read-only array mapped from shared memory.
            array = buffer.numpy()
            array.setflags(write=False)
            out.update((name, t.clone()) for name, t in unpack(slots, array))
    finally:
        if pool is not None:
            pool.shutdown()
    assert list(out) == [n for n, _ in named]
    for name, t in named:
        expected = t.to(dtype) if (dtype is not None and t.is_floating_point()) else t
        got = out[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert torch.equal(
            got.view(-1).view(torch.uint8), expected.contiguous().view(-1).view(torch.uint8)
        ), name


def test_pack_and_unpack_name_what_does_not_fit() -> None:
    named = _state()
    slots = plan_buckets(named, torch.float32, bucket_bytes=1 << 20)[0]
    wrong = dict(named) | {"layer.0.norm.weight": torch.zeros(18)}
    with pytest.raises(ValueError, match=r"layer\.0\.norm\.weight"):
        pack(slots, wrong, None)
    with pytest.raises(ValueError, match="slots"):
        pack(slots, [t for _, t in named][:-1], None)
    with pytest.raises(ValueError, match="at least"):
        pack(slots, dict(named), None, out=torch.empty(bucket_size(slots) - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        list(unpack(slots, np.zeros(bucket_size(slots), dtype=np.float32)))
    with pytest.raises(ValueError, match="bytes"):
        list(unpack(slots, np.zeros(bucket_size(slots) - 1, dtype=np.uint8)))
