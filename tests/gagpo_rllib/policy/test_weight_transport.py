"""The broadcast channel on CPU (gloo): what every receiver gets is the sender's tensors in the rollout dtype, bit
for bit, bucket by bucket; a receiver that reads nothing still takes part; reading out of order is refused."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from gagpo_rllib.policy.weight_buckets import plan_buckets
from gagpo_rllib.policy.weight_transport import (
    BroadcastWeights,
    channel_open,
    close_channel,
    join_channel,
    open_channel,
    send_buckets,
)


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


def _receiver(info, rank, buckets, how, out) -> None:
    join_channel(info, rank)
    weights = BroadcastWeights(info.name, buckets)
    got = {}
    if how == "items":
        got = {k: v.clone() for k, v in weights.items()}
    elif how == "getitem":
        got = {k: weights[k].clone() for k in weights}
    elif how == "backwards":
        weights[list(weights)[-1]]
        try:
            weights[list(weights)[0]]
        except RuntimeError as err:
            got = {"error": str(err)}
    weights.drain()
    out.put((rank, got, weights.nbytes))
    close_channel(info.name)


def test_every_receiver_gets_the_senders_tensors_cast_bit_for_bit() -> None:
    named = _named()
    buckets = plan_buckets(named, torch.bfloat16, bucket_bytes=8 << 10)
    assert len(buckets) >= 3
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    hows = ["items", "getitem", "nothing", "backwards"]
    info = open_channel("test", world_size=len(hows) + 1, backend="gloo", address="127.0.0.1", timeout_s=60)
    procs = [
        ctx.Process(target=_receiver, args=(info, rank, buckets, how, out))
        for rank, how in enumerate(hows, start=1)
    ]
    for p in procs:
        p.start()
    try:
        join_channel(info, 0)
        assert channel_open("test")
        sent = send_buckets("test", buckets, dict(named))
        results = {rank: (got, nbytes) for rank, got, nbytes in (out.get(timeout=120) for _ in procs)}
    finally:
        close_channel("test")
        for p in procs:
            p.join(timeout=60)
    assert sent == sum(b[-1].offset + b[-1].nbytes for b in buckets)
    for rank, how in enumerate(hows, start=1):
        got, nbytes = results[rank]
        assert nbytes == sent, how  # every receiver took part in every bucket
        if how in ("items", "getitem"):
            assert list(got) == [n for n, _ in named], how
            for name, t in named:
                want = t.to(torch.bfloat16) if t.is_floating_point() else t
                assert got[name].dtype == want.dtype and torch.equal(got[name], want), (how, name)
        elif how == "backwards":
            assert "sender's order" in got["error"]
        else:
            assert got == {}


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
