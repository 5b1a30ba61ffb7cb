"""bf16 against float32 on this CPU, side by side in one run: what ``cpu_compute_dtype`` picks, and why.

Times a SmolLM2-135M-sized matmul ([512, 576] x [576, 1536]) and a linear layer's forward and backward under bf16
autocast against float32, on one thread, alternating the two dtypes so both see the same load. Where the CPU has no
bf16 arithmetic (neither AMX nor AVX-512 BF16), torch emulates bf16 and it runs many times slower than float32.

    python benchmarks/bench_cpu_dtype.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gagpo_rllib.policy.models import cpu_compute_dtype  # noqa: E402


def seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, default=512)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(args.rows, 576)
    w = torch.randn(576, 1536)
    linear = torch.nn.Linear(576, 1536)

    def matmul(dtype: torch.dtype) -> Callable[[], object]:
        a, b = x.to(dtype), w.to(dtype)
        return lambda: a @ b

    def linear_step(bf16: bool) -> Callable[[], object]:
        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = linear(x)
            out.float().sum().backward()

        return step

    cases = {
        "matmul": (matmul(torch.float32), matmul(torch.bfloat16)),
        "linear forward+backward": (linear_step(False), linear_step(True)),
    }
    print(
        f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; cpu_compute_dtype() = {cpu_compute_dtype()}"
    )
    print(f"{'case':<26}{'float32 ms':>12}{'bf16 ms':>10}{'bf16 / fp32':>13}")
    for name, (fp32, bf16) in cases.items():
        a, b = [], []
        for _ in range(2):  # alternate, so a change of load hits both
            a.append(seconds(fp32, args.repeats))
            b.append(seconds(bf16, args.repeats))
        t32, t16 = min(a), min(b)
        print(f"{name:<26}{1e3 * t32:>12.1f}{1e3 * t16:>10.1f}{t16 / t32:>13.2f}")


if __name__ == "__main__":
    main()
