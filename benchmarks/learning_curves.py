"""Learning curves of GAGPO, GiGPO, GRPO and RLOO on the built-in maze: same seeds, same iteration budget.

Every (estimator, seed) run trains the embedded default (``tuned_examples/gagpo_builtin.py``: tiny policy, CPU,
constrained decoding) with only the advantage estimator changed, for the same number of iterations, as one Ray task
on one CPU (runs go in parallel up to ``--num-cpus``). Writes a CSV of every iteration, a PNG of success vs
iteration (mean over seeds, min-max band) and a Markdown table, and prints for each estimator the iterations to
reach 50% and 80% success (rolling mean over ``--window`` iterations) per seed, and the area under the success
curve (mean success over the whole budget) with its spread over seeds.

    python benchmarks/learning_curves.py [--iterations 100] [--seeds 0 1 2] [--estimators gagpo gigpo grpo rloo]
                                         [--num-cpus 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import csv
import runpy
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ESTIMATORS = ("gagpo", "gigpo", "grpo", "rloo")
FIELDS = (
    "estimator",
    "seed",
    "iteration",
    "success_rate",
    "episode_len_mean",
    "invalid_action_share",
    "kl",
    "entropy",
    "time_generation_s",
    "time_learner_s",
    "wall_s",
)


def run_one(estimator: str, seed: int, iterations: int, partial_dir: str | None = None) -> list[dict]:
    """Train one (estimator, seed) for ``iterations`` iterations on the local EnvRunner; one row per iteration.

    With ``partial_dir`` the rows so far are also rewritten to ``<estimator>_seed<seed>.csv`` after every iteration,
    so an interrupted or long benchmark can be followed and still leaves its data.
    """
    import torch

    torch.set_num_threads(1)
    example = runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="learning_curves")
    algo = example["make_config"](estimator=estimator, seed=seed, num_env_runners=0).build_algo()
    rows, start = [], time.perf_counter()
    try:
        for it in range(iterations):
            result = algo.train()
            g, lp = result["gagpo"], result["learners"]["default_policy"]
            rows.append(
                {
                    "estimator": estimator,
                    "seed": seed,
                    "iteration": it,
                    "success_rate": float(g["success_rate"]),
                    "episode_len_mean": float(g["episode_len_mean"]),
                    "invalid_action_share": float(g["invalid_action_share"]),
                    "kl": float(lp.get("kl", np.nan)),
                    "entropy": float(lp.get("entropy", np.nan)),
                    "time_generation_s": float(g["time_generation_s"]),
                    "time_learner_s": float(g["time_learner_s"]),
                    "wall_s": time.perf_counter() - start,
                }
            )
            print(f"[{estimator} seed {seed}] iter {it:3d} success {g['success_rate']:.2f}", flush=True)
            if partial_dir is not None:
                write_csv(rows, Path(partial_dir) / f"{estimator}_seed{seed}.csv")
    finally:
        algo.stop()
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def first_reaching(success: np.ndarray, level: float, window: int) -> int | None:
    """First iteration (1-based count) whose rolling mean over ``window`` iterations reaches ``level``."""
    if len(success) < window:
        return None
    rolling = np.convolve(success, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(rolling >= level)
    return int(hits[0] + window) if len(hits) else None


def summarise(rows: list[dict], window: int) -> dict[str, dict]:
    """Per estimator: iterations to 50% / 80% per seed, and mean success over the budget (mean, std over seeds)."""
    curves: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    for est, seed in sorted({(r["estimator"], r["seed"]) for r in rows}):
        its = sorted(
            (r for r in rows if r["estimator"] == est and r["seed"] == seed), key=lambda r: r["iteration"]
        )
        curves[est][seed] = np.array([r["success_rate"] for r in its])
    out = {}
    for est, per_seed in curves.items():
        auc = np.array([c.mean() for c in per_seed.values()])
        out[est] = {
            "to50": {s: first_reaching(c, 0.5, window) for s, c in per_seed.items()},
            "to80": {s: first_reaching(c, 0.8, window) for s, c in per_seed.items()},
            "auc_mean": float(auc.mean()),
            "auc_std": float(auc.std(ddof=1)) if len(auc) > 1 else 0.0,
            "final": float(np.mean([c[-window:].mean() for c in per_seed.values()])),
            "iterations": min(len(c) for c in per_seed.values()),
        }
    return out


def markdown_table(summary: dict[str, dict], window: int) -> str:
    def fmt(values: dict) -> str:
        return ", ".join("-" if v is None else str(v) for _, v in sorted(values.items()))

    lines = [
        f"| estimator | iterations to 50% (per seed) | iterations to 80% (per seed) | mean success over the budget "
        f"| final success (last {window}) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for est in [e for e in ESTIMATORS if e in summary] + [e for e in summary if e not in ESTIMATORS]:
        s = summary[est]
        lines.append(
            f"| {est} | {fmt(s['to50'])} | {fmt(s['to80'])} | {s['auc_mean']:.3f} ± {s['auc_std']:.3f} "
            f"| {s['final']:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for est in [e for e in ESTIMATORS if any(r["estimator"] == e for r in rows)]:
        seeds = sorted({r["seed"] for r in rows if r["estimator"] == est})
        per_seed = []
        for seed in seeds:
            its = sorted(
                (r for r in rows if r["estimator"] == est and r["seed"] == seed), key=lambda r: r["iteration"]
            )
            per_seed.append([r["success_rate"] for r in its])
        n = min(map(len, per_seed))
        curves = np.array([c[:n] for c in per_seed])
        x = np.arange(1, n + 1)
        ax.plot(x, curves.mean(0), label=f"{est} ({len(seeds)} seeds)")
        ax.fill_between(x, curves.min(0), curves.max(0), alpha=0.15)
    ax.set_xlabel("iteration (8 task instances x 8 rollouts)")
    ax.set_ylabel("success rate of the iteration's rollouts")
    ax.set_ylim(0, 1.02)
    ax.set_title("Built-in maze, tiny policy on CPU: mean over seeds, band = min..max")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    parser.add_argument("--num-cpus", type=int, default=2, help="runs in parallel (one CPU each)")
    parser.add_argument("--window", type=int, default=5, help="rolling window for the 50%% / 80%% thresholds")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--from-csv", nargs="+", help="only summarise and plot these CSV files (e.g. results/partial/*.csv)"
    )
    args = parser.parse_args(argv)
    if args.from_csv:
        rows = [row for path in args.from_csv for row in read_csv(Path(path))]
        report(rows, Path(args.out), args.window, note=f"from {len(args.from_csv)} CSV file(s)")
        return

    import ray

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Build the tiny policy once, before the runs start in parallel.
    runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="learning_curves")[
        "maze_policy"
    ]()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    remote = ray.remote(num_cpus=1)(run_one)
    partial = out / "partial"
    partial.mkdir(exist_ok=True)
    jobs = {
        remote.remote(e, s, args.iterations, str(partial)): (e, s)
        for e in args.estimators
        for s in args.seeds
    }
    rows: list[dict] = []
    pending = list(jobs)
    start = time.perf_counter()
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        est, seed = jobs[done[0]]
        rows.extend(ray.get(done[0]))
        print(f"done: {est} seed {seed} ({time.perf_counter() - start:.0f} s since start)", flush=True)
    ray.shutdown()

    report(rows, out, args.window, note=f"{args.iterations} iterations, seeds {args.seeds}")


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["seed"], r["iteration"] = int(r["seed"]), int(r["iteration"])
        for key in FIELDS[3:]:
            r[key] = float(r[key])
    return rows


def report(rows: list[dict], out: Path, window: int, *, note: str) -> None:
    """Write the CSV, the PNG and the Markdown table; print the table and the paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: (ESTIMATORS.index(r["estimator"]), r["seed"], r["iteration"]))
    csv_path, png_path, md_path = (
        out / "learning_curves.csv",
        out / "learning_curves.png",
        out / "learning_curves.md",
    )
    write_csv(rows, csv_path)
    plot(rows, png_path)
    table = markdown_table(summarise(rows, window), window)
    md_path.write_text(
        f"Built-in maze, {note}; thresholds on a {window}-iteration rolling mean ('-' = not reached).\n\n{table}\n"
    )
    print(table)
    print(f"csv: {csv_path}\npng: {png_path}\ntable: {md_path}")


if __name__ == "__main__":
    main()
