"""Seconds per training iteration of the CPU learning benchmark, before and after a change, side by side.

The "before" code is a git revision of this repository (``--before``, default the last commit before the learner
forwarded each distinct row once, kept reference log-probs across updates, and generation shared the prefill of
repeated prompts); it is exported to a temporary folder and imported from there. For each seed the two versions
train the same configuration (``benchmarks/learning_curves.py``'s run of the task, one CPU thread each) at the
same time, as two processes, so both see the same machine load; both start from one tiny policy built once. The
script prints each iteration's success and seconds of both, then per seed the mean seconds per iteration, the
ratio before / after, and the mean success over the run (the area under the success curve) of both, which
should agree within seed noise: the changes leave the loss's value unchanged, and only float rounding (a row's
log-prob computed in a differently padded batch) separates the two runs.

    python benchmarks/bench_iteration.py [--task maze|hard] [--iterations 30] [--seeds 0 1] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "b70a918"


def export_revision(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` as plain files under ``dest`` (``git archive``; the work tree is untouched)."""
    archive = dest / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True)
    tree = dest / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def child(tree: Path, task: str, seed: int, iterations: int) -> None:
    """Train one run with the code under ``tree``; one JSON line per iteration on stdout."""
    sys.path[:0] = [str(tree), str(tree / "benchmarks")]
    import torch

    torch.set_num_threads(1)
    import learning_curves

    import gagpo_rllib

    if not Path(gagpo_rllib.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"gagpo_rllib imported from {gagpo_rllib.__file__}, not from {tree}")
    algo = learning_curves.make_run_config("gagpo", seed, task).build_algo()
    try:
        for it in range(iterations):
            start = time.perf_counter()
            result = algo.train()
            g = result["gagpo"]
            row = {
                "iteration": it,
                "seconds": time.perf_counter() - start,
                "success_rate": float(g["success_rate"]),
                "time_generation_s": float(g["time_generation_s"]),
                "time_learner_s": float(g["time_learner_s"]),
            }
            print("ROW " + json.dumps(row), flush=True)
    finally:
        algo.stop()


def build_policies(task: str, policy_dir: Path) -> dict[str, str]:
    """Build the task's tiny policy once (current code) and return the env that points both runs at it."""
    env = {
        "GAGPO_TINY_POLICY_DIR": str(policy_dir / "maze"),
        "GAGPO_TINY_HARD_POLICY_DIR": str(policy_dir / "hard"),
    }
    os.environ.update(env)
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    import learning_curves

    learning_curves.make_run_config("gagpo", 0, task)  # builds (or finds) the policy of the task
    return env


def run_pair(trees: dict[str, Path], task: str, seed: int, iterations: int, env: dict) -> dict[str, list]:
    """Both versions at once, one process each; their rows by version."""
    procs = {}
    for name, tree in trees.items():
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree)]
        cmd += ["--task", task, "--seeds", str(seed), "--iterations", str(iterations)]
        procs[name] = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **env, "PYTHONPATH": str(tree)},
        )
    rows: dict[str, list] = {}
    for name, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{name} run (seed {seed}) failed with exit code {proc.returncode}")
        rows[name] = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
    return rows


def report(seed: int, rows: dict[str, list]) -> float:
    before, after = rows["before"], rows["after"]
    print(f"\nseed {seed}: iteration | success before after | seconds before after")
    for b, a in zip(before, after, strict=True):
        print(
            f"  {b['iteration']:3d} | {b['success_rate']:.3f} {a['success_rate']:.3f} "
            f"| {b['seconds']:6.2f} {a['seconds']:6.2f}"
        )

    def mean(rs: list, key: str) -> float:
        return sum(r[key] for r in rs) / len(rs)

    ratio = mean(before, "seconds") / mean(after, "seconds")
    for name, rs in (("before", before), ("after", after)):
        print(
            f"  {name:6s}: {mean(rs, 'seconds'):.2f} s/iteration (generation {mean(rs, 'time_generation_s'):.2f}, "
            f"learner {mean(rs, 'time_learner_s'):.2f}); mean success {mean(rs, 'success_rate'):.3f}"
        )
    print(f"  ratio before / after: {ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="maze", choices=["maze", "hard"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--before", default=BEFORE, help="git revision of the 'before' code")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.task, args.seeds[0], args.iterations)
        return
    with tempfile.TemporaryDirectory(prefix="bench_iteration_") as tmp:
        tmp = Path(tmp)
        trees = {"before": export_revision(args.before, tmp), "after": ROOT}
        env = build_policies(args.task, tmp / "policies")
        print(f"{args.task}: {args.iterations} iterations, before = {args.before}, after = the work tree")
        ratios = [report(seed, run_pair(trees, args.task, seed, args.iterations, env)) for seed in args.seeds]
    print(
        f"\nratio before / after (seconds per iteration), per seed: {', '.join(f'{r:.2f}' for r in ratios)}"
    )


if __name__ == "__main__":
    main()
