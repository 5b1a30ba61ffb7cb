"""Learning curves of GAGPO, GiGPO, GRPO and RLOO on the built-in mazes: same seeds, same iteration budget.

Every (estimator, seed) run trains the embedded default (``tuned_examples/gagpo_builtin.py``: tiny policy, CPU,
constrained decoding) with only the advantage estimator changed, for the same number of iterations, as one Ray task
on one CPU (runs go in parallel up to ``--num-cpus``). ``--task hard`` plays the key maze (``MazeEnv`` with
``difficulty="hard"``) with a tiny policy whose tokenizer is trained on its texts; nothing else changes.

The benchmark runs in parts: each finished run is one CSV, ``<out>/<task>/runs/<estimator>_seed<seed>.csv``,
skipped when present (``--force`` reruns it), so seeds and estimators can be spread over several sittings. After
the runs, or with ``--from-csv`` alone (no training), every run CSV of the task is merged into
``<out>/<task>/learning_curves.{csv,png,md}`` and the results page ``<out>/<task>/README.md`` (``--dir``
names another folder): per estimator the mean success over the budget (area under the
success curve) with a 95% seeded bootstrap interval over seeds, the paired difference GAGPO - X over the shared
seeds with its interval, and the iterations to reach 50% / 80% success (rolling mean over ``--window``).

Ablations of GAGPO (same protocol, selectable as estimators): ``gagpo-lam0``, ``gagpo-lam0.5``, ``gagpo-lam1``
(GAE's lam; plain ``gagpo`` is lam 0.95) and ``gagpo-nostate``: one state key for every step
(``GAGPOConfig.state_key``), so V(s) becomes the mean return-to-go over all steps of the group, no state grouping.
``ppo`` is the PPO baseline with a learned critic (``gagpo_rllib.policy.critic``); its runs also record the critic's
``value_loss``.

    python benchmarks/learning_curves.py [--task maze|hard] [--iterations 100] [--seeds 0 1 2]
                                         [--estimators gagpo gigpo grpo rloo] [--num-cpus 2] [--force]
                                         [--out benchmarks/results]
    python benchmarks/learning_curves.py --task hard --from-csv      # merge the task's run CSVs, no training
    python benchmarks/learning_curves.py --task hard --missing       # the protocol's runs still to do
"""

from __future__ import annotations

import argparse
import csv
import os
import runpy
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from gagpo_rllib.method.stats import mean_interval, paired_differences
from gagpo_rllib.rllib.config import configure

ROOT = Path(__file__).resolve().parents[1]

# Extra env_config keys of each task on top of the embedded default's.
TASKS = {"maze": {}, "hard": {"difficulty": "hard"}}
# A ``GAGPOConfig.state_key`` function of this module: one key for every step, i.e. no state grouping.
NO_STATE_KEY = "learning_curves:no_state_grouping"
ESTIMATORS = ("gagpo", "gigpo", "grpo", "rloo", "ppo")
FIELDS = (
    "task",
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
    "num_state_groups",
    "value_loss",
    "episodes_sampled",
    "uniform_group_share",
    "vf_explained_var",
)
# GAGPO ablations: (advantage estimator, GAGPOConfig.gagpo overrides). Plain "gagpo" is the lam 0.95 point.
ABLATIONS = {
    "gagpo-lam0": ("gagpo", {"lam": 0.0}),
    "gagpo-lam0.5": ("gagpo", {"lam": 0.5}),
    "gagpo-lam1": ("gagpo", {"lam": 1.0}),
    "gagpo-nostate": ("gagpo", {"state_key": NO_STATE_KEY}),
}
# LoRA instead of full fine-tuning (not part of the protocol): rank 16 on every linear kind, alpha 32, lr 2e-3.
LORA_VARIANTS = {
    "gagpo-lora": ("gagpo", {"lora_rank": 16, "lr": 2e-3}),
}
# bf16 autocast over float32 master weights on the CPU (not part of the protocol): the same run in another dtype.
PRECISION_VARIANTS = {
    "gagpo-bf16": ("gagpo", {"dtype": "bfloat16"}),
}
# Rollouts overlapped with the update (not part of the protocol): episodes of the weights one update old, the
# decoupled objective (GAGPOConfig.training(max_staleness=1)).
STALENESS_VARIANTS = {
    "gagpo-stale1": ("gagpo", {"max_staleness": 1}),
}
# Dynamic sampling (GAGPOConfig.dynamic_sampling) on top of an estimator; these runs spend the same budget counted
# in sampled episodes (iterations x 8 x 8), so they run fewer iterations (see ``episode_curve``).
DYNAMIC = {
    "gagpo-ds": ("gagpo", {"dynamic_sampling": True}),
    "grpo-ds": ("grpo", {"dynamic_sampling": True}),
}
ABLATIONS = {**ABLATIONS, **DYNAMIC}
# The full protocol: every estimator on both tasks, the ablations on the hard task, 8 seeds each.
PROTOCOL_SEEDS = tuple(range(8))


def protocol_variants(task: str) -> tuple[str, ...]:
    """The runs the protocol asks for on ``task``: the estimators, and on the hard task the ablations too."""
    ablations = tuple(a for a in ABLATIONS if a not in DYNAMIC)
    return ESTIMATORS + (ablations if task == "hard" else ()) + tuple(DYNAMIC)


HARD_POLICY_DIR = Path(
    os.environ.get(
        "GAGPO_TINY_HARD_POLICY_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_key_maze_policy"
    )
)


def variants() -> tuple[str, ...]:
    """Every selectable run name: the estimators, then the GAGPO ablations."""
    return (*ESTIMATORS, *ABLATIONS, *LORA_VARIANTS, *PRECISION_VARIANTS, *STALENESS_VARIANTS)


def no_state_grouping(info: dict, episode: object = None) -> str:
    """The state key of the "no state grouping" ablation: the same for every step."""
    return "any state"


def hard_policy() -> Path:
    """The tiny policy of the key maze: as the maze's, with a tokenizer trained on the key maze's texts."""
    from envs.maze import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, MazeEnv
    from gagpo_rllib.policy.models import build_tiny_policy

    corpus = MazeEnv({"split": "train", **TASKS["hard"]}).corpus()
    corpus += [FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, "user assistant system"]
    return build_tiny_policy(HARD_POLICY_DIR, corpus=corpus, vocab_size=512, seed=0)


def make_run_config(variant: str, seed: int, task: str):
    """The embedded default with the variant's estimator and overrides, on the task's env and policy."""
    example = runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="learning_curves")
    named = {**ABLATIONS, **LORA_VARIANTS, **PRECISION_VARIANTS, **STALENESS_VARIANTS}
    estimator, overrides = named.get(variant, (variant, {}))
    overrides = dict(overrides)
    config = example["make_config"](estimator=estimator, seed=seed, num_env_runners=0)
    if TASKS[task]:
        config.environment(env_config={**config.env_config, **TASKS[task]})
        config.llm(model_path=str(hard_policy()))
    if "lr" in overrides:
        config.training(lr=overrides.pop("lr"))
    if overrides:
        configure(config, **overrides)
    return config


def run_one(
    estimator: str, seed: int, iterations: int, csv_path: str | None = None, task: str = "maze"
) -> list[dict]:
    """Train one (estimator or ablation, seed) for ``iterations`` iterations on the local EnvRunner.

    One row per iteration. With ``csv_path`` the rows so far are rewritten to ``<csv_path>.partial`` after every
    iteration (an interrupted run can be followed and leaves its data), renamed to ``csv_path`` once finished:
    only finished runs count as present.
    """
    import torch

    torch.set_num_threads(1)
    if str(Path(__file__).resolve().parent) not in sys.path:  # NO_STATE_KEY imports this module by name
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    config = make_run_config(estimator, seed, task)
    budget = iterations * config.groups_per_iteration * config.group_size  # sampled episodes
    algo = config.build_algo()
    rows, start, sampled, it = [], time.perf_counter(), 0, 0
    try:
        while sampled < budget:
            result = algo.train()
            g, lp = result["gagpo"], result["learners"]["default_policy"]
            rows.append(
                {
                    "task": task,
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
                    "num_state_groups": float(
                        result["learners"].get("gagpo", {}).get("num_state_groups", np.nan)
                    ),
                    "value_loss": float(lp.get("value_loss", np.nan)),
                    "episodes_sampled": float(sampled + g["num_episodes"]),
                    "uniform_group_share": float(g.get("uniform_group_share", np.nan)),
                    "vf_explained_var": float(lp.get("vf_explained_var", np.nan)),
                }
            )
            sampled += int(g["num_episodes"])
            print(
                f"[{task} {estimator} seed {seed}] iter {it:3d} success {g['success_rate']:.2f}", flush=True
            )
            if csv_path is not None:
                write_csv(rows, Path(f"{csv_path}.partial"))
            it += 1
    finally:
        algo.stop()
    if csv_path is not None:
        os.replace(f"{csv_path}.partial", csv_path)
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


def order(names) -> list[str]:
    """Estimators in the order of ``variants()``, unknown names after them."""
    known = variants()
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


def episode_curve(its: list[dict], unit: int = 64) -> np.ndarray:
    """Success per ``unit`` sampled episodes (one plain iteration's 8 x 8): unit u takes the iteration during which
    the (u+1)-th unit's episodes were sampled. A plain run's curve is its per-iteration curve; a dynamic-sampling
    run (more episodes per iteration) gets the same budget axis. Rows without ``episodes_sampled`` count one unit."""
    sampled = np.array([r.get("episodes_sampled", np.nan) for r in its], dtype=float)
    success = np.array([r["success_rate"] for r in its])
    if np.isnan(sampled).any():
        return success
    units = int(sampled[-1] // unit)
    idx = np.searchsorted(sampled, (np.arange(units) + 1) * unit - 1e-9)
    return success[np.minimum(idx, len(success) - 1)]


def curves_of(rows: list[dict]) -> dict[str, dict[int, np.ndarray]]:
    """curves[estimator][seed]: success per 64 sampled episodes (``episode_curve``; for a plain run, per
    iteration), in order; a gap or a repeat of an iteration raises."""
    per_run: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        per_run[(r["estimator"], r["seed"])].append(r)
    curves: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    for (est, seed), its in sorted(per_run.items()):
        its = sorted(its, key=lambda r: r["iteration"])
        if [r["iteration"] for r in its] != list(range(len(its))):
            raise ValueError(f"run {est} seed {seed}: iterations are not 0..{len(its) - 1} exactly once each")
        curves[est][seed] = episode_curve(its)
    return curves


def summarise(rows: list[dict], window: int) -> tuple[dict[str, dict], int]:
    """Per estimator, over the common budget (the shortest run's iterations): the area under the success curve
    per seed with its 95% bootstrap interval, GAGPO minus it per shared seed with its interval, the iterations
    to 50% / 80% per seed and the final success. Returns (summary, budget)."""
    curves = curves_of(rows)
    budget = min(len(c) for per_seed in curves.values() for c in per_seed.values())
    auc = {
        est: {s: float(c[:budget].mean()) for s, c in per_seed.items()} for est, per_seed in curves.items()
    }
    out = {}
    for est, per_seed in curves.items():
        entry = {
            "seeds": sorted(per_seed),
            "auc": auc[est],
            "auc_interval": mean_interval(list(auc[est].values())),
            "to50": {s: first_reaching(c[:budget], 0.5, window) for s, c in per_seed.items()},
            "to80": {s: first_reaching(c[:budget], 0.8, window) for s, c in per_seed.items()},
            "final": float(np.mean([c[:budget][-window:].mean() for c in per_seed.values()])),
            "gap": None,
        }
        if est != "gagpo" and "gagpo" in auc and set(auc["gagpo"]) & set(auc[est]):
            seeds, diff = paired_differences(auc["gagpo"], auc[est])
            entry["gap"] = mean_interval(diff)
            entry["gap_seeds"] = seeds
        out[est] = entry
    return out, budget


def markdown_table(summary: dict[str, dict], window: int) -> str:
    def fmt(values: dict) -> str:
        reached = sum(v is not None for v in values.values())
        listed = ", ".join("-" if v is None else str(v) for _, v in sorted(values.items()))
        return f"{listed} ({reached}/{len(values)})"

    lines = [
        "| estimator | seeds | mean success over the budget [95% CI] | GAGPO - X, paired [95% CI] "
        f"| iterations to 50% (per seed) | iterations to 80% (per seed) | final success (last {window}) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for est in order(summary):
        s = summary[est]
        gap = "-" if s["gap"] is None else f"{s['gap'].format()} ({s['gap'].n} seeds)"
        lines.append(
            f"| {est} | {len(s['seeds'])} | {s['auc_interval'].format()} | {gap} | {fmt(s['to50'])} "
            f"| {fmt(s['to80'])} | {s['final']:.2f} |"
        )
    return "\n".join(lines)


def dynamic_lines(rows: list[dict]) -> str:
    """For the dynamic-sampling variants: iterations run for the budget, the share of uniform groups among the
    groups sampled and the extra episodes per iteration (mean over seeds and iterations)."""
    lines = []
    for est in order(r["estimator"] for r in rows):
        if est not in DYNAMIC:
            continue
        mine = [r for r in rows if r["estimator"] == est]
        seeds = sorted({r["seed"] for r in mine})
        iters = [sum(r["seed"] == s for r in mine) for s in seeds]
        per_it = np.mean([r["episodes_sampled"] for r in mine if r["iteration"] == 0])
        extra = []
        for s in seeds:
            its = sorted((r for r in mine if r["seed"] == s), key=lambda r: r["iteration"])
            cum = [0.0] + [r["episodes_sampled"] for r in its]
            extra += [b - a - 64 for a, b in zip(cum, cum[1:], strict=False)]
        lines.append(
            f"- {est}: {np.mean(iters):.0f} iterations on average for the budget ({min(iters)}-{max(iters)}); "
            f"uniform groups {np.nanmean([r['uniform_group_share'] for r in mine]):.0%} of those sampled; "
            f"{np.mean(extra):.1f} extra episodes per iteration (first iteration: {per_it:.0f} sampled)"
        )
    return ("\n\n" + "\n".join(lines)) if lines else ""


def critic_lines(rows: list[dict], start: int = 20) -> str:
    """For estimators with a critic: the explained variance of its values, per seed the mean over the iterations
    from ``start`` on (runs written before the CSVs had the column are left out)."""
    lines = []
    for est in order(r["estimator"] for r in rows):
        mine = [r for r in rows if r["estimator"] == est and r["iteration"] >= start]
        per_seed = {}
        for seed in sorted({r["seed"] for r in mine}):
            values = [r["vf_explained_var"] for r in mine if r["seed"] == seed]
            if not all(np.isnan(values)):
                per_seed[seed] = float(np.nanmean(values))
        if per_seed:
            lines.append(
                f"- {est}: the critic's explained variance, mean over iterations {start}+ per seed: "
                f"{', '.join(f'{v:.2f}' for v in per_seed.values())} (mean {np.mean(list(per_seed.values())):.2f}, "
                f"{len(per_seed)} seeds)"
            )
    return ("\n\n" + "\n".join(lines)) if lines else ""


def timing(rows: list[dict]) -> str:
    """Mean wall time per iteration (and its generation / learner parts) per estimator, from the CSVs."""
    lines = []
    for est in order(r["estimator"] for r in rows):
        mine = [r for r in rows if r["estimator"] == est]
        last: dict[int, dict] = {}  # seed -> its last iteration's row (wall_s counts from the run's start)
        for r in mine:
            if r["iteration"] >= last.get(r["seed"], r)["iteration"]:
                last[r["seed"]] = r
        wall = sum(r["wall_s"] for r in last.values()) / sum(r["iteration"] + 1 for r in last.values())
        gen = np.mean([r["time_generation_s"] for r in mine])
        learn = np.mean([r["time_learner_s"] for r in mine])
        lines.append(f"{est}: {wall:.1f} s per iteration (generation {gen:.1f} s, learner {learn:.1f} s)")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str = "Built-in maze") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for est in order(r["estimator"] for r in rows):
        seeds = sorted({r["seed"] for r in rows if r["estimator"] == est})
        per_seed = [curves_of([r for r in rows if r["estimator"] == est])[est][seed] for seed in seeds]
        n = min(map(len, per_seed))
        curves = np.array([c[:n] for c in per_seed])
        x = np.arange(1, n + 1)
        ax.plot(x, curves.mean(0), label=f"{est} ({len(seeds)} seeds)")
        ax.fill_between(x, curves.min(0), curves.max(0), alpha=0.15)
    ax.set_xlabel("sampled episodes / 64 (= iterations of 8 task instances x 8 rollouts)")
    ax.set_ylabel("success rate of the iteration's rollouts")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{title}, tiny policy on CPU: mean over seeds, band = min..max")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TITLES = {"maze": "Built-in maze", "hard": "Key maze (hard)"}


def describe_task(task: str) -> str:
    """Shortest solutions, step limits and exact random-policy success of the task's training instances."""
    from envs.maze import MazeEnv

    env = MazeEnv({"split": "train", "num_tasks": 8, **TASKS[task]})  # the embedded default's 8 instances
    tasks = [env.task(i) for i in range(env.num_tasks)]
    shortest, limits = [t.shortest_path for t in tasks], [t.max_steps for t in tasks]
    success = [t.random_success for t in tasks]
    return (
        f"{len(tasks)} training instances: shortest solutions {min(shortest)}-{max(shortest)} steps, step limits "
        f"{min(limits)}-{max(limits)}, exact random-policy success {min(success):.3f}-{max(success):.3f} "
        f"(mean {np.mean(success):.3f})"
    )


def run_csv(runs_dir: Path, estimator: str, seed: int) -> Path:
    return runs_dir / f"{estimator}_seed{seed}.csv"


def missing_runs(runs_dir: Path, task: str, seeds=PROTOCOL_SEEDS) -> dict[str, list[int]]:
    """Per protocol variant of ``task``, the seeds without a finished run CSV (a ``.partial`` does not count)."""
    missing = {v: [s for s in seeds if not run_csv(runs_dir, v, s).exists()] for v in protocol_variants(task)}
    return {v: s for v, s in missing.items() if s}


def missing_report(runs_dir: Path, task: str, iterations: int, num_cpus: int) -> str:
    """What the protocol still lacks on ``task``: one command per seed (its missing variants), and the hours it
    takes at ``num_cpus`` runs in parallel, estimated from the finished runs' wall time (a variant without a
    finished run takes the mean over all of them)."""
    missing = missing_runs(runs_dir, task)
    total = len(protocol_variants(task)) * len(PROTOCOL_SEEDS)
    n_missing = sum(map(len, missing.values()))
    lines = [
        f"{task}: {total - n_missing} of {total} protocol runs finished ({len(PROTOCOL_SEEDS)} seeds each)"
    ]
    if not missing:
        return lines[0]
    wall: dict[str, list[float]] = defaultdict(list)
    for path in runs_dir.glob("*.csv"):
        rows = read_csv(path)
        if rows:
            wall[rows[0]["estimator"]].append(max(r["wall_s"] for r in rows))
    every = [w for ws in wall.values() for w in ws]
    seconds = 0.0
    for seed in PROTOCOL_SEEDS:
        variants_left = [v for v, seeds in missing.items() if seed in seeds]
        if not variants_left:
            continue
        for v in variants_left:
            seconds += np.mean(wall[v]) if wall.get(v) else (np.mean(every) if every else float("nan"))
        lines.append(
            f"python benchmarks/learning_curves.py --task {task} --iterations {iterations} --seeds {seed} "
            f"--estimators {' '.join(variants_left)}"
        )
    lines.append(f"about {seconds / 3600 / max(1, num_cpus):.1f} h at {num_cpus} runs in parallel")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="maze", choices=list(TASKS), help="maze (quick default) or hard")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=variants())
    parser.add_argument("--num-cpus", type=int, default=2, help="runs in parallel (one CPU each)")
    parser.add_argument("--window", type=int, default=5, help="rolling window for the 50%% / 80%% thresholds")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--dir", default=None, help="the task's results folder, with runs/ (default <out>/<task>)"
    )
    parser.add_argument("--force", action="store_true", help="rerun runs whose CSV is already present")
    parser.add_argument(
        "--from-csv",
        nargs="*",
        help="no training: merge these CSV files, or with no file every run CSV under <out>/<task>/runs/",
    )
    parser.add_argument(
        "--missing",
        action="store_true",
        help="no training: the protocol's runs of --task without a CSV yet, with the commands that run them",
    )
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations must be >= 1, got {args.iterations}")
    out = Path(args.dir) if args.dir else Path(args.out) / args.task
    runs_dir = out / "runs"
    if args.missing:
        print(missing_report(runs_dir, args.task, args.iterations, args.num_cpus))
        return
    if args.from_csv is not None:
        paths = [Path(p) for p in args.from_csv] or sorted(runs_dir.glob("*.csv"))
        if not paths:
            parser.error(f"--from-csv: no run CSV under {runs_dir}")
        rows = merge(paths, args.task)
        command = render_command(args.task, out, args.window, [Path(p) for p in args.from_csv])
        report(
            rows,
            out,
            args.window,
            task=args.task,
            note=f"merged from {len(paths)} CSV file(s)",
            command=command,
        )
        return

    runs_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    for est in args.estimators:
        for seed in args.seeds:
            path = run_csv(runs_dir, est, seed)
            if path.exists() and not args.force:
                done = len(episode_curve(sorted(read_csv(path), key=lambda r: r["iteration"])))
                if done < args.iterations or (est not in DYNAMIC and done != args.iterations):
                    parser.error(
                        f"{path} holds {done} iterations, not --iterations {args.iterations}: rerun it with "
                        "--force or keep the budget it was run with"
                    )
                print(f"present, skipped: {path}", flush=True)
            else:
                todo.append((est, seed))
    if todo:
        import ray

        # Build the tiny policy once, before the runs start in parallel.
        if TASKS[args.task]:
            hard_policy()
        else:
            runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="learning_curves")[
                "maze_policy"
            ]()
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
        remote = ray.remote(num_cpus=1)(run_one)
        jobs = {
            remote.remote(e, s, args.iterations, str(run_csv(runs_dir, e, s)), args.task): (e, s)
            for e, s in todo
        }
        pending = list(jobs)
        start = time.perf_counter()
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            est, seed = jobs[done[0]]
            ray.get(done[0])
            print(f"done: {est} seed {seed} ({time.perf_counter() - start:.0f} s since start)", flush=True)
        ray.shutdown()

    paths = sorted(runs_dir.glob("*.csv"))
    report(
        merge(paths, args.task),
        out,
        args.window,
        task=args.task,
        note=f"merged from {len(paths)} CSV file(s)",
        command=render_command(args.task, out, args.window, []),
    )


def render_command(task: str, out: Path, window: int, files: list[Path]) -> str:
    """The command that re-renders a results folder from its CSVs (paths relative to the repository when inside
    it), so that the page it writes names its own source."""

    def rel(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    parts = ["python benchmarks/learning_curves.py", f"--task {task}", "--from-csv", *(rel(f) for f in files)]
    if out.resolve() != (ROOT / "benchmarks" / "results" / task).resolve():
        parts.append(f"--dir {rel(out)}")
    if window != 5:
        parts.append(f"--window {window}")
    return " ".join(parts)


def results_page(task: str, summary_md: str, timing_lines: str, command: str, out: Path) -> str:
    """The results folder's README.md: the table written to learning_curves.md, the figure and the time per
    iteration, with the command that wrote it (the page is generated, never edited by hand)."""
    runs = (out / "runs").is_dir()
    source = "the run CSVs in `runs/` (one per estimator and seed)" if runs else "the CSV the command names"
    return (
        f"# Learning curves: {TITLES[task]}\n\n"
        f"Written by `benchmarks/learning_curves.py` from {source}; "
        f"not edited by hand. To write it again from the CSVs, without training:\n\n    {command}\n\n"
        f"{summary_md}\n"
        f"![success vs iteration: {TITLES[task]}](learning_curves.png)\n\n"
        "Mean wall time per iteration (generation and learner parts), from the CSVs:\n\n"
        + "".join(f"    {line}\n" for line in timing_lines.splitlines())
        + "\nFiles: `learning_curves.csv` (every run's rows, merged), `learning_curves.md` (the table), "
        f"`learning_curves.png` (the figure){', `runs/` (one CSV per run)' if runs else ''}. What the figures say: "
        f"[docs/learning.md]({os.path.relpath(ROOT / 'docs' / 'learning.md', out.resolve())}).\n"
    )


def read_csv(path: Path) -> list[dict]:
    """Rows of a run or merged CSV; files written before the ``task`` (``num_state_groups``) column existed are
    the maze's (NaN)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.setdefault("task", "maze")
        r["seed"], r["iteration"] = int(r["seed"]), int(r["iteration"])
        for key in FIELDS[4:]:
            r[key] = float(r[key]) if r.get(key) not in (None, "") else float("nan")
    return rows


def merge(paths: list[Path], task: str) -> list[dict]:
    """The rows of every CSV; a run found in two files, or a row of another task, raises naming the file."""
    rows, source = [], {}
    for path in paths:
        runs = set()
        for r in read_csv(path):
            if r["task"] != task:
                raise ValueError(f"{path}: holds task {r['task']!r} rows, not --task {task!r}")
            runs.add((r["estimator"], r["seed"]))
            rows.append(r)
        for run in runs:
            if run in source:
                raise ValueError(f"run {run[0]} seed {run[1]} is in both {source[run]} and {path}")
            source[run] = path
    return rows


def report(
    rows: list[dict], out: Path, window: int, *, task: str = "maze", note: str, command: str | None = None
) -> None:
    """Write the merged CSV, the PNG, the Markdown table and the folder's README.md; print the table, the timing
    and the paths."""
    out.mkdir(parents=True, exist_ok=True)
    rank = {e: i for i, e in enumerate(order(r["estimator"] for r in rows))}
    rows = sorted(rows, key=lambda r: (rank[r["estimator"]], r["seed"], r["iteration"]))
    csv_path, png_path, md_path = (
        out / "learning_curves.csv",
        out / "learning_curves.png",
        out / "learning_curves.md",
    )
    write_csv(rows, csv_path)
    plot(rows, png_path, TITLES[task])
    summary, budget = summarise(rows, window)
    table = markdown_table(summary, window)
    table += dynamic_lines(rows)
    table += critic_lines(rows)
    summary_md = (
        f"{TITLES[task]}, {note}, a budget of {budget} x 64 sampled episodes ({budget} iterations of 8 task "
        "instances x 8 rollouts; dynamic-sampling runs (-ds) sample more per iteration and run fewer iterations, "
        "their curves are read per 64 sampled episodes); intervals: 95% "
        f"percentile bootstrap over seeds (gagpo_rllib.method.stats); thresholds on a {window}-iteration rolling mean "
        f"('-' = not reached, (k/n) = seeds that reached it). Task: {describe_task(task)}.\n\n{table}\n"
    )
    md_path.write_text(summary_md)
    timing_lines = timing(rows)
    if command is None:
        command = render_command(task, out, window, [])
    page_path = out / "README.md"
    page_path.write_text(results_page(task, summary_md, timing_lines, command, out))
    print(describe_task(task))
    print(table)
    print(timing_lines)
    print(f"csv: {csv_path}\npng: {png_path}\ntable: {md_path}\npage: {page_path}")


if __name__ == "__main__":
    main()
