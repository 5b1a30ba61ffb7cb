"""The weight channels: what every receiver gets is the sender's tensors in the rollout dtype, bit for bit, bucket
by bucket; a receiver that reads nothing still takes part; reading out of order is refused. The broadcast on CPU
(gloo, the code NCCL runs; over NCCL where two GPUs exist), the shared buckets (ipc) on CPU (shared-memory files)
and, where a GPU exists, on CUDA (IPC handles to device memory)."""

from __future__ import annotations

import glob
import io
import multiprocessing as mp
import os

import pytest
import torch

from gagpo_rllib.policy.weight_buckets import plan_buckets
from gagpo_rllib.policy.weight_transport import (
    BroadcastWeights,
    SharedWeights,
    channel_open,
    close_channel,
    device_key,
    join_channel,
    open_channel,
    send_buckets,
    share_buckets,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(64, 48, generator=g)),
        ("layers.0.weight", torch.randn(48, 48, generator=g)),
        ("layers.0.bias", torch.randn(48, generator=g)),
        ("layers.1.weight", torch.randn(48, 96, generator=g)),
        ("steps", torch.tensor([3, 5], dtype=torch.int64)),
        ("norm.weight", torch.randn(48, generator=g)),
    ]


def _receiver(info, rank, buckets, how, out, sync=None) -> None:
    join_channel(info, rank)
    if how == "fails":  # its plan disagrees with the sender's from bucket 1 on: taking bucket 1 raises
        buckets = [buckets[0], buckets[1][:-1], *buckets[2:]]
    if info.backend == "ipc":
        weights = SharedWeights(info.name, buckets, sync=sync)
    else:
        weights = BroadcastWeights(info.name, buckets)
    got = {}
    if how == "items":
        got = {k: v.clone() for k, v in weights.items()}
    elif how == "getitem":
        got = {k: weights[k].clone() for k in weights}
    elif how == "device":
        got = {"device": str(next(iter(weights.values())).device)}
    elif how == "backwards":
        weights[list(weights)[-1]]
        try:
            weights[list(weights)[0]]
        except RuntimeError as err:
            got = {"error": str(err)}
    try:
        weights.drain()
    except RuntimeError as err:
        if how != "fails":
            raise
        got = {"error": str(err)}
    # As bytes: a tensor put on a queue is shared through this process, which is about to exit.
    buffer = io.BytesIO()
    torch.save({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in got.items()}, buffer)
    out.put((rank, buffer.getvalue(), weights.nbytes))
    close_channel(info.name)


def _load(data: bytes) -> dict:
    return torch.load(io.BytesIO(data))


def test_every_receiver_gets_the_senders_tensors_cast_bit_for_bit() -> None:
    named = _named()
    hows = ["items", "getitem", "nothing", "backwards"]
    results, sent = _run_channel("gloo", named, hows)
    _check(named, hows, results, sent)
    assert "sender's order" in results[4][0]["error"]
    assert results[3][0] == {}


def test_channel_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="backend"):
        open_channel("bad", world_size=2, backend="mpi", address="127.0.0.1")
    with pytest.raises(ValueError, match="world_size"):
        open_channel("bad", world_size=1, backend="gloo", address="127.0.0.1")
    with pytest.raises(RuntimeError, match="not joined"):
        send_buckets("never-opened", [], {})
    info = open_channel("half", world_size=2, backend="gloo", address="127.0.0.1", timeout_s=5)
    try:
        with pytest.raises(ValueError, match="rank 2"):
            join_channel(info, 2)
    finally:
        close_channel("half")
    assert not channel_open("half")


def _check(named, hows, results, sent) -> None:
    for rank, how in enumerate(hows, start=1):
        got, nbytes = results[rank]
        assert nbytes == sent, how  # every receiver took part in every bucket
        if how in ("items", "getitem"):
            assert list(got) == [n for n, _ in named], how
            for name, t in named:
                want = t.cpu().to(torch.bfloat16) if t.is_floating_point() else t.cpu()
                assert got[name].dtype == want.dtype and torch.equal(got[name], want), (how, name)


def _run_channel(backend: str, named, hows, *, sync: int | None = None, window: int = 2) -> tuple[dict, int]:
    """Send (gloo) or share (ipc) ``named`` over a channel with one spawned receiver per entry of ``hows``;
    {rank: (what it read, bytes it took)} and the bytes sent."""
    buckets = plan_buckets(named, torch.bfloat16, bucket_bytes=8 << 10)
    assert len(buckets) >= 3
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    info = open_channel(backend, world_size=len(hows) + 1, backend=backend, address="127.0.0.1", timeout_s=60)
    procs = [
        ctx.Process(target=_receiver, args=(info, rank, buckets, how, out, sync))
        for rank, how in enumerate(hows, start=1)
    ]
    for p in procs:
        p.start()
    try:
        join_channel(info, 0)
        assert channel_open(backend)
        if backend == "ipc":
            sent = share_buckets(backend, buckets, dict(named), sync=sync, window=window)
        else:
            sent = send_buckets(backend, buckets, dict(named))
        results = {rank: (_load(got), nbytes) for rank, got, nbytes in (out.get(timeout=120) for _ in procs)}
    finally:
        close_channel(backend)
        for p in procs:
            p.join(timeout=60)
    assert sent == sum(b[-1].offset + b[-1].nbytes for b in buckets)
    return results, sent


def _shm_files() -> list[str]:
    return glob.glob(f"/dev/shm/gagpo-weights-{os.getpid()}-*") + glob.glob(
        f"/tmp/gagpo-weights-{os.getpid()}-*"
    )


def test_shared_buckets_reach_every_receiver_bit_for_bit_and_leave_nothing_in_shared_memory() -> None:
    named = _named()
    hows = ["items", "getitem", "nothing"]
    results, sent = _run_channel("ipc", named, hows, sync=7, window=1)
    _check(named, hows, results, sent)
    assert results[3][0] == {}
    assert _shm_files() == []  # each bucket's file went once every receiver had copied it


def test_a_receiver_that_fails_to_take_a_bucket_does_not_hold_the_sender_up() -> None:
    named = _named()
    assert len(plan_buckets(named, torch.bfloat16, bucket_bytes=8 << 10)[1]) >= 2
    # The channel's timeout is 60 s: a sender still waiting for the failed receiver's copies raises instead.
    results, sent = _run_channel("ipc", named, ["items", "fails"], sync=3, window=1)
    _check(named, ["items"], results, sent)
    got, nbytes = results[2]
    assert "bucket 1 holds" in got["error"]
    assert 0 < nbytes < sent  # bucket 0 only
    assert _shm_files() == []


def test_a_receiver_that_never_answers_times_the_sender_out_and_its_buckets_are_freed() -> None:
    named = _named()
    buckets = plan_buckets(named, torch.bfloat16, bucket_bytes=8 << 10)
    info = open_channel("silent", world_size=2, backend="ipc", address="127.0.0.1", timeout_s=2)
    try:
        join_channel(info, 0)
        with pytest.raises(Exception, match="(?i)timeout|timed out"):
            share_buckets("silent", buckets, dict(named), sync=1, window=2)
    finally:
        close_channel("silent")
    assert _shm_files() == []


def test_an_ipc_channel_shares_and_a_broadcast_channel_sends() -> None:
    info = open_channel("kind", world_size=2, backend="ipc", address="127.0.0.1", timeout_s=5)
    try:
        join_channel(info, 0)
        with pytest.raises(RuntimeError, match="ipc channel shares"):
            send_buckets("kind", [], {})
    finally:
        close_channel("kind")
    assert device_key("cpu").startswith("host:")


@cuda
def test_cuda_ipc_hands_the_receivers_the_senders_device_buckets_bit_for_bit() -> None:
    """The colocated layout's path: device buffers exported as CUDA IPC handles, mapped by the GPU's UUID."""
    named = [(name, t.cuda()) for name, t in _named()]
    hows = ["items", "getitem", "device"]
    results, sent = _run_channel("ipc", named, hows, sync=3, window=2)
    _check(named, hows, results, sent)
    assert results[3][0]["device"].startswith("cuda")
    assert device_key("cuda").startswith("cuda:")


def _nccl_receiver(info, rank, buckets, out) -> None:
    torch.cuda.set_device(rank % torch.cuda.device_count())  # NCCL: one rank per GPU
    _receiver(info, rank, buckets, "items", out)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="an NCCL broadcast needs 2 GPUs"
)
def test_nccl_broadcast_hands_each_gpu_the_senders_device_buckets_bit_for_bit() -> None:
    """The separate layout's path: learner 0 on GPU 0 broadcasts device buffers to a receiver on GPU 1."""
    torch.cuda.set_device(0)
    named = [(name, t.cuda()) for name, t in _named()]
    buckets = plan_buckets(named, torch.bfloat16, bucket_bytes=8 << 10)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    info = open_channel("nccl", world_size=2, backend="nccl", address="127.0.0.1", timeout_s=120)
    proc = ctx.Process(target=_nccl_receiver, args=(info, 1, buckets, out))
    proc.start()
    try:
        join_channel(info, 0)
        sent = send_buckets("nccl", buckets, dict(named))
        rank, got, nbytes = out.get(timeout=180)
    finally:
        close_channel("nccl")
        proc.join(timeout=60)
    _check(named, ["items"], {rank: (_load(got), nbytes)}, sent)
