"""The weight sync's host paths, side by side in one run: GiB/s end to end from a learner's float32 weights to
a runner's rollout-dtype copy, in two Ray processes on this machine, and the expected seconds per sync at 1.5B
and 7B per transport from stated link speeds.

The state is the state dict of a Qwen2.5-0.5B-shaped model (random values; ``bench_learner``'s shapes, ``--model``),
the tied output head included, as the sync sends it. A sender actor holds it
in float32 as a learner does; a receiver actor holds a preallocated copy in the rollout dtype as an engine does
(its ``load`` copies into it, which a real engine's ``reload_weights`` also does). One sync = the sender publishes
(cast, put) and the receiver loads (get, copy in); both are timed, and the receiver's bytes are checked equal to
the sender's cast, bit for bit, for every path.

- ``before``: the former path: a dict of tensors cast on the learner's one thread, ``ray.put`` (torch tensors are
  pickled in band), ``ray.get`` on the runner.
- ``zero-copy tensors``: the same with Ray's ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`` in both processes.
- ``buckets, 1 thread`` / ``buckets, N threads``: ``gagpo_rllib.rllib.weight_sync.publish_tensors`` (flat
  ``uint8`` buckets, out-of-band, put overlapped with the next bucket's fill) read through ``PackedWeights``; the
  path the runs use, with the machine's threads.
- ``broadcast (gloo)``: ``weight_transport="broadcast"`` on CPU: the sender packs each bucket (``weight_buckets``)
  and broadcasts it over a gloo process group (``gagpo_rllib.policy.weight_transport``); the receiver copies each
  bucket's tensors in as it arrives. On GPUs the same code runs over NCCL, device to device; here it measures
  whether the channel could also serve as a host path.
- ``shared buckets (ipc)``: ``weight_transport="ipc"`` on CPU: the sender packs each bucket into a file in shared
  memory and publishes its name; the receiver maps it, copies it and its tensors in (on GPUs: CUDA IPC handles to
  device buffers, the engine on the learner's GPU).

``python benchmarks/bench_weight_sync.py`` (``--repeats``, ``--model 0.5b|cpu|1.5b``, ``--dtype``). Needs ~8 GiB of
memory at 0.5B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_learner import SHAPES, VOCAB  # noqa: E402

from gagpo_rllib.policy.weight_buckets import plan_buckets  # noqa: E402
from gagpo_rllib.policy.weight_transport import (  # noqa: E402
    BroadcastWeights,
    SharedWeights,
    join_channel,
    open_channel,
    send_buckets,
    share_buckets,
)
from gagpo_rllib.rllib.weight_sync import (  # noqa: E402
    BUCKET_BYTES,
    SYNC_THREADS,
    PackedWeights,
    publish_tensors,
)

GIB = 1 << 30
# Parameter counts of the paper's models (Qwen2.5 model cards), for the modelled table.
PAPER_PARAMS = {"1.5B": 1.54e9, "7B": 7.62e9}
# Stated link speeds (GB/s, decimal) for the modelled table; what each transport is bound by.
LINKS = {
    "NCCL broadcast over NVLink (H100/H200 SXM, ~150 GB/s achieved bus bandwidth)": 150e9,
    "CUDA IPC, engine on the learner's GPU (one device copy, ~1,000 GB/s of HBM)": 1000e9,
    "host: pinned D2H + H2D over PCIe Gen5 (~25 GB/s each way), buckets overlapped": 25e9,
}


def qwen_state(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the state dict of a Qwen2 model with ``bench_learner``'s shapes, as Hugging Face builds it
    (on the meta device: no memory), the tied output head included as the sync sends it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model_ = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, **SHAPES[model]))
    return [(name, tuple(t.shape)) for name, t in model_.state_dict().items()]


def _fingerprint(tensors: list[torch.Tensor]) -> list[int]:
    """A per-tensor checksum of the raw bytes (any changed bit changes it with near certainty)."""
    out = []
    for t in tensors:
        words = t.contiguous().view(-1).view(torch.uint8).to(torch.int64)
        weights = torch.arange(1, words.numel() + 1, dtype=torch.int64) % 65_521
        out.append(int((words * weights).sum()))
    return out


@ray.remote
class Sender:
    """A learner's side: the float32 weights and the publish step of each path."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.state = [(name, torch.randn(shape, generator=gen) * 0.02) for name, shape in shapes]

    def nbytes(self, dtype: torch.dtype) -> int:
        return sum(t.numel() for _, t in self.state) * torch.empty((), dtype=dtype).element_size()

    def expected(self, dtype: torch.dtype) -> list[int]:
        return _fingerprint([t.to(dtype) for _, t in self.state])

    def publish_dict(self, dtype: torch.dtype) -> tuple[list, float]:
        torch.set_num_threads(1)  # the learner's one thread, as before
        start = time.perf_counter()
        ref = ray.put({name: t.to(dtype) for name, t in self.state})
        return [ref], time.perf_counter() - start

    def publish_buckets(self, dtype: torch.dtype, threads: int) -> tuple[PackedWeights, float]:
        torch.set_num_threads(1)
        start = time.perf_counter()
        packed = publish_tensors(self.state, dtype, threads=threads)
        return packed, time.perf_counter() - start

    def open_channel(self, dtype: torch.dtype, backend: str) -> tuple:
        info = open_channel("bench", 2, backend, address="127.0.0.1")
        return info, plan_buckets(self.state, dtype, BUCKET_BYTES)

    def join(self, info) -> None:
        join_channel(info, 0)

    def send(self, buckets, backend: str, sync: int) -> float:
        torch.set_num_threads(1)
        start = time.perf_counter()
        if backend == "ipc":
            share_buckets("bench", buckets, dict(self.state), sync=sync)
        else:
            send_buckets("bench", buckets, dict(self.state))
        return time.perf_counter() - start


@ray.remote
class Receiver:
    """A runner's side: the rollout-dtype weights an engine holds, loaded by copy."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> None:
        self.weights = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes}

    def load(self, weights) -> float:
        start = time.perf_counter()
        if isinstance(weights, list):  # [ref of a dict]: the former path
            weights = ray.get(weights[0])
        with torch.no_grad():
            for name, t in weights.items():
                self.weights[name].copy_(t)
        return time.perf_counter() - start

    def join(self, info) -> None:
        join_channel(info, 1)

    def receive(self, buckets, backend: str, sync: int) -> float:
        start = time.perf_counter()
        if backend == "ipc":
            weights = SharedWeights("bench", buckets, sync=sync)
        else:
            weights = BroadcastWeights("bench", buckets)
        with torch.no_grad():
            for name, t in weights.items():
                self.weights[name].copy_(t)
        return time.perf_counter() - start

    def fingerprint(self) -> list[int]:
        return _fingerprint(list(self.weights.values()))


def measure(
    label: str, env: dict, args, shapes: list, dtype: torch.dtype, threads: int | None, expected: list[int]
) -> dict:
    """Median publish and load seconds of ``args.repeats`` syncs (after one warm-up) through one path."""
    runtime_env = {"env_vars": env} if env else None
    sender = Sender.options(runtime_env=runtime_env).remote(shapes, args.seed)
    receiver = Receiver.options(runtime_env=runtime_env).remote(shapes, dtype)
    nbytes = ray.get(sender.nbytes.remote(dtype))
    publish, load = [], []
    for i in range(args.repeats + 1):
        if threads is None:
            handle, seconds = ray.get(sender.publish_dict.remote(dtype))
        else:
            handle, seconds = ray.get(sender.publish_buckets.remote(dtype, threads))
        loaded = ray.get(receiver.load.remote(handle))
        del handle
        if i:
            publish.append(seconds)
            load.append(loaded)
    return _row(label, sender, receiver, nbytes, publish, load, expected)


def _row(label, sender, receiver, nbytes, publish, load, expected) -> dict:
    exact = ray.get(receiver.fingerprint.remote()) == expected
    ray.kill(sender)
    ray.kill(receiver)
    p, q = statistics.median(publish), statistics.median(load)
    return dict(path=label, publish_s=p, load_s=q, total_s=p + q, gib_s=nbytes / GIB / (p + q), exact=exact)


def measure_channel(
    label: str, backend: str, args, shapes: list, dtype: torch.dtype, expected: list[int]
) -> dict:
    """A weight channel (gloo broadcast, or ipc's shared buckets): publish is the sender's packing and sending,
    load what the receiver's copy-in adds after the sender finished (both run at once; the sync's seconds are the
    receiver's)."""
    sender = Sender.remote(shapes, args.seed)
    receiver = Receiver.remote(shapes, dtype)
    nbytes = ray.get(sender.nbytes.remote(dtype))
    info, buckets = ray.get(sender.open_channel.remote(dtype, backend))
    ray.get([receiver.join.remote(info), sender.join.remote(info)])
    publish, load = [], []
    for i in range(args.repeats + 1):
        receiving = receiver.receive.remote(buckets, backend, i)
        sent = ray.get(sender.send.remote(buckets, backend, i))
        received = ray.get(receiving)
        if i:
            publish.append(sent)
            load.append(max(0.0, received - sent))
    return _row(label, sender, receiver, nbytes, publish, load, expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    threads = SYNC_THREADS
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        shapes = qwen_state(args.model)
        probe = Sender.remote(shapes, args.seed)
        nbytes = ray.get(probe.nbytes.remote(dtype))
        expected = ray.get(probe.expected.remote(dtype))
        ray.kill(probe)
        print(
            f"state: Qwen2.5-{args.model} shapes, {nbytes / GIB:.2f} GiB in {args.dtype} "
            f"({len(expected)} tensors), float32 on the sender; {args.repeats} syncs per path after a warm-up; "
            f"{os.cpu_count()} CPUs"
        )
        zero_copy = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
        rows = [
            measure("before (dict, pickled tensors)", {}, args, shapes, dtype, None, expected),
            measure("zero-copy tensors (dict)", zero_copy, args, shapes, dtype, None, expected),
            measure("buckets, 1 thread", {}, args, shapes, dtype, 1, expected),
            measure(
                f"buckets, {threads} threads (the runs' path)", {}, args, shapes, dtype, threads, expected
            ),
        ]
        rows[-1:-1] = [
            measure_channel("broadcast (gloo)", "gloo", args, shapes, dtype, expected),
            measure_channel("shared buckets (ipc, shared memory)", "ipc", args, shapes, dtype, expected),
        ]
    finally:
        ray.shutdown()
    base = rows[0]["total_s"]
    print(
        f"\n{'path':44s} {'publish s':>10s} {'load s':>8s} {'total s':>8s} {'GiB/s':>7s} {'x before':>9s} exact"
    )
    for r in rows:
        print(
            f"{r['path']:44s} {r['publish_s']:10.2f} {r['load_s']:8.2f} {r['total_s']:8.2f} {r['gib_s']:7.2f} "
            f"{base / r['total_s']:9.1f} {r['exact']}"
        )
    ours = rows[-1]
    print(f"\nthe runs' path / before: {base / ours['total_s']:.1f}x end to end")
    print(
        "\nexpected seconds per sync of the bfloat16 weights (modelled from the stated link speeds; host rows measured)"
    )
    print(f"{'transport':82s} " + " ".join(f"{k:>7s}" for k in PAPER_PARAMS))
    for label, rate in LINKS.items():
        print(f"{label:82s} " + " ".join(f"{n * 2 / rate:7.2f}" for n in PAPER_PARAMS.values()))
    for r in (rows[0], ours):
        rate = r["gib_s"] * GIB
        label = f"this machine's host rate, {r['path']}"
        print(f"{label:82s} " + " ".join(f"{n * 2 / rate:7.1f}" for n in PAPER_PARAMS.values()))


if __name__ == "__main__":
    main()
