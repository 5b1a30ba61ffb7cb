"""Does a CPU default learn? Its evaluation before and after GAGPO, per seed, on ALFWorld or WebShop.

For each seed, the CPU default of ``tuned_examples/gagpo_<env>.py`` is evaluated at the evaluation temperature (0.4)
with the same constrained decoding, trained for ``--iterations`` iterations and evaluated again on the same tasks
with the same seeds; the training rollouts' metric of the first and the last 5 iterations is reported too. What is
measured depends on the env (``ENVS``):

- alfworld: the tiny policy warm-started on the walkthroughs of most bundled train games (cached; the same warm
  start for every seed), then GAGPO on the games the warm start did not see. Success on those GAGPO training games
  (``--episodes`` each) and on valid_unseen; rollouts: success. The acceptance figure: the rise on the training
  games (mean of 3 seeds).
- webshop: the tiny random-init policy, searches typed from the goal's words, the purchase score as reward. Score
  and success on ``--eval-tasks`` eval goals and ``--train-tasks`` train goals; rollouts: the purchase score.

Per-seed JSON, then a table; ``--merge`` joins seeds run in parts. Every run, and ``--merge`` with ``--out``, writes
the results page ``README.md`` into its output folder (the committed ones: ``benchmarks/results/<env>_cpu/``).

    python benchmarks/cpu_learning.py --env alfworld --seeds 0 1 2
    python benchmarks/cpu_learning.py --env webshop --seeds 1 --out results/ws1       # seeds in parts, then:
    python benchmarks/cpu_learning.py --env webshop --merge results/*/webshop_cpu_learning.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def evaluation_table(config, split: str, *, seed: int, checkpoint: str | None = None, **settings) -> dict:
    """The env's evaluation table (percent) on ``split`` at temperature 0.4 (None where a cell is empty)."""
    from gagpo_rllib.rllib.evaluation import EvalSettings, evaluate

    report = evaluate(
        config,
        EvalSettings(split=split, temperature=0.4, seed=seed, **settings),
        checkpoint=checkpoint,
        progress=False,
    )
    return {k: (None if np.isnan(v) else round(float(v), 2)) for k, v in report.table.items()}


def train(config, seed: int, iterations: int, out: Path, metrics: tuple[str, ...]) -> tuple[dict, str, float]:
    """GAGPO for ``iterations``; (per-iteration rollout metrics, the checkpoint, seconds)."""
    started = time.monotonic()
    curves: dict[str, list[float]] = {m: [] for m in metrics}
    algo = config.build_algo()
    try:
        for it in range(1, iterations + 1):
            g = algo.train()["gagpo"]
            for m in metrics:
                curves[m].append(float(g.get(m, 0.0)))
            shown = "  ".join(f"{m} {curves[m][-1]:.3f}" for m in metrics)
            print(
                f"seed {seed}: iter {it}/{iterations}  {shown}  {time.monotonic() - started:7.1f} s",
                flush=True,
            )
        checkpoint = str(algo.save_to_path(str(out / f"seed{seed}_checkpoint")))
    finally:
        algo.stop()
    return curves, checkpoint, time.monotonic() - started


def first_last(curve: list[float]) -> tuple[float, float]:
    """Means (percent) of the first and of the last 5 iterations."""
    return 100 * float(np.mean(curve[:5])), 100 * float(np.mean(curve[-5:]))


# ------------------------------------------------------------------------------------------------------ ALFWorld
def alfworld_seed(example: dict, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """Warm start (cached), evaluations before, GAGPO, evaluations after."""
    settings = example["WARM_START_SETTINGS"]
    if args.warm_start_epochs is not None:
        settings = type(settings)(**{**settings.__dict__, "epochs": args.warm_start_epochs})
    config = example["cpu_config"](
        seed=seed,
        warm=True,
        warm_settings=settings,
        train_games_per_type=args.train_games_per_type or 1,
        group_size=args.group_size or example["CPU_GROUP_SIZE"],
        temperature=args.temperature or example["CPU_TEMPERATURE"],
    )
    config.evaluation(evaluation_interval=None)  # evaluated before and after here, not inside the run
    config.callbacks_on_algorithm_init = None
    started = time.monotonic()
    games = dict(split="train", seed=seed, episodes_per_task=args.episodes)
    valid = dict(split=example["VALID_SPLIT"], seed=seed, num_tasks=args.valid_tasks)
    train_before, valid_before = evaluation_table(config, **games), evaluation_table(config, **valid)
    print(
        f"seed {seed}: warm start  train games {train_before['All']:.1f}  valid_unseen {valid_before['All']:.1f}"
    )
    curves, checkpoint, _ = train(config, seed, args.iterations, out, ("success_rate",))
    first, last = first_last(curves["success_rate"])
    return {
        "seed": seed,
        "train_before": train_before,
        "train_after": evaluation_table(config, **games, checkpoint=checkpoint),
        "valid_before": valid_before,
        "valid_after": evaluation_table(config, **valid, checkpoint=checkpoint),
        "rollout_first5": first,
        "rollout_last5": last,
        "rollout_curve": curves["success_rate"],
        "seconds": time.monotonic() - started,
        "checkpoint": checkpoint,
    }


def alfworld_table(rows: list[dict]) -> str:
    lines = [
        "| seed | train games: warm start | after | rise | rollouts: first 5 | last 5 "
        "| valid_unseen: warm start | after | seconds |",
        "|" + "---|" * 9,
    ]

    def cell(key: str, sub: str | None = "All", of: list[dict] = rows) -> float:
        return float(np.mean([r[key][sub] if sub else r[key] for r in of]))

    for name, of in [*((r["seed"], [r]) for r in rows), ("mean", rows)]:
        rise = cell("train_after", of=of) - cell("train_before", of=of)
        lines.append(
            f"| {name} | {cell('train_before', of=of):.1f} | {cell('train_after', of=of):.1f} | {rise:+.1f} | "
            f"{cell('rollout_first5', None, of):.1f} | {cell('rollout_last5', None, of):.1f} | "
            f"{cell('valid_before', of=of):.1f} | {cell('valid_after', of=of):.1f} | {cell('seconds', None, of):.0f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- WebShop
def webshop_seed(example: dict, seed: int, args: argparse.Namespace, out: Path) -> dict:
    config = example["cpu_config"](seed=seed, num_env_runners=0)
    config.evaluation(evaluation_interval=None)
    config.callbacks_on_algorithm_init = None
    started = time.monotonic()
    goals = {"eval": args.eval_tasks, "train": args.train_tasks}
    before = {s: evaluation_table(config, s, seed=seed, num_tasks=n) for s, n in goals.items()}
    print(f"seed {seed}: before  {before}", flush=True)
    curves, checkpoint, _ = train(config, seed, args.iterations, out, ("task_score_mean", "success_rate"))
    after = {
        s: evaluation_table(config, s, seed=seed, num_tasks=n, checkpoint=checkpoint)
        for s, n in goals.items()
    }
    print(f"seed {seed}: after  {after}", flush=True)
    score_first, score_last = first_last(curves["task_score_mean"])
    wins_first, wins_last = first_last(curves["success_rate"])
    return {
        "seed": seed,
        "iterations": args.iterations,
        "before": before,
        "after": after,
        "rollout_score_first5": score_first,
        "rollout_score_last5": score_last,
        "rollout_success_first5": wins_first,
        "rollout_success_last5": wins_last,
        "rollout_scores": curves["task_score_mean"],
        "seconds": time.monotonic() - started,
    }


def webshop_table(rows: list[dict]) -> str:
    lines = [
        "| seed | iterations | eval score: before | after | rise | eval success: before | after "
        "| train-goal score: before | after | rollout score: first 5 | last 5 | seconds |",
        "|" + "---|" * 12,
    ]

    def cell(of: list[dict], *path: str) -> float:
        return float(np.mean([(r[path[0]][path[1]][path[2]] if len(path) == 3 else r[path[0]]) for r in of]))

    for name, of in [*((r["seed"], [r]) for r in rows), *((("mean", rows),) if len(rows) > 1 else ())]:
        before, after = cell(of, "before", "eval", "score"), cell(of, "after", "eval", "score")
        lines.append(
            f"| {name} | {of[0]['iterations']} | {before:.1f} | {after:.1f} | {after - before:+.1f} | "
            f"{cell(of, 'before', 'eval', 'success'):.1f} | {cell(of, 'after', 'eval', 'success'):.1f} | "
            f"{cell(of, 'before', 'train', 'score'):.1f} | {cell(of, 'after', 'train', 'score'):.1f} | "
            f"{cell(of, 'rollout_score_first5'):.1f} | {cell(of, 'rollout_score_last5'):.1f} | "
            f"{cell(of, 'seconds'):.0f} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class EnvBenchmark:
    """One env's part: how a seed runs, its table, and the page's title and explanation."""

    run_seed: Callable[[dict, int, argparse.Namespace, Path], dict]
    table: Callable[[list[dict]], str]
    title: str
    about: str


ENVS = {
    "alfworld": EnvBenchmark(
        alfworld_seed,
        alfworld_table,
        "ALFWorld CPU default: success before and after GAGPO, per seed",
        "The CPU default of `tuned_examples/gagpo_alfworld.py` warm-starts the tiny policy on the walkthroughs of "
        "most bundled train games, then trains GAGPO on held-out train games. Success in percent at temperature "
        "0.4 on the GAGPO training games (train games) and on all of valid_unseen, for the warm start and after "
        "each seed's run; rollouts: the training rollouts' success (at the training temperature), mean of the "
        "first and of the last 5 iterations; seconds: the seed's wall time.",
    ),
    "webshop": EnvBenchmark(
        webshop_seed,
        webshop_table,
        "WebShop CPU default: purchase score and success before and after GAGPO, per seed",
        "The CPU default of `tuned_examples/gagpo_webshop.py` without a model (tiny random-init policy, "
        "constrained decoding with search_grammar 'goal_prefix', reward_mode 'score'), on the bundled catalogue. "
        "Score and success in percent, at temperature 0.4 on the first eval goals and the first train goals, "
        "before and after GAGPO; rollout score: the training rollouts' mean purchase score of the first and the "
        "last 5 iterations; seconds: the seed's wall time.",
    ),
}


def write_page(env: str, rows: list[dict], out: Path, command: str) -> Path:
    """The results folder's README.md: what was measured, the table and the command that wrote it (a generated
    page, never edited by hand)."""
    bench = ENVS[env]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "README.md"
    path.write_text(
        f"# {bench.title}\n\nWritten by `benchmarks/cpu_learning.py`; not edited by hand. To write it again:\n\n"
        f"    {command}\n\n{bench.about}\n\n{bench.table(rows)}\n"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ENVS), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GAGPO seeds (default 0 1 2)")
    parser.add_argument("--iterations", type=int, default=None, help="default: the CPU default's")
    parser.add_argument(
        "--episodes", type=int, default=8, help="alfworld: evaluation episodes per training game"
    )
    parser.add_argument(
        "--warm-start-epochs", type=int, default=None, help="alfworld: the warm start's epochs"
    )
    parser.add_argument(
        "--train-games-per-type", type=int, default=None, help="alfworld: GAGPO games per type"
    )
    parser.add_argument("--group-size", type=int, default=None, help="alfworld: rollouts per game")
    parser.add_argument("--temperature", type=float, default=None, help="alfworld: the rollouts' temperature")
    parser.add_argument(
        "--valid-tasks", type=int, default=None, help="alfworld: valid_unseen games (default all)"
    )
    parser.add_argument(
        "--eval-tasks", type=int, default=24, help="webshop: eval goals evaluated before and after"
    )
    parser.add_argument("--train-tasks", type=int, default=24, help="webshop: train goals evaluated")
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="no training: the table of these JSONs"
    )
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs for the local Ray instance")
    parser.add_argument("--out", default=None, help="output folder (default results/<env>_cpu_learning)")
    args = parser.parse_args(argv)
    name = f"{args.env}_cpu_learning"
    if args.merge:
        rows = [r for path in args.merge for r in json.loads(path.read_text())["seeds"]]
        seeds = [r["seed"] for r in rows]
        if len(set(seeds)) != len(seeds):
            raise SystemExit(f"--merge: seed(s) repeated across the files: {sorted(seeds)}")
        rows = sorted(rows, key=lambda r: r["seed"])
        print(ENVS[args.env].table(rows))
        if args.out is not None:
            files = " ".join(str(p) for p in args.merge)
            command = f"python benchmarks/cpu_learning.py --env {args.env} --merge {files} --out {args.out}"
            print(f"wrote {write_page(args.env, rows, Path(args.out), command)}")
        return 0

    from gagpo_rllib.tools.train import init_ray

    args.out = args.out or f"results/{name}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    example = runpy.run_path(str(ROOT / "tuned_examples" / f"gagpo_{args.env}.py"), run_name=name)
    args.iterations = args.iterations or example["CPU_ITERATIONS"]
    init_ray(num_cpus=args.num_cpus)
    rows = []
    for seed in args.seeds:
        rows.append(ENVS[args.env].run_seed(example, seed, args, out))
        (out / f"{name}.json").write_text(
            json.dumps({"args": vars(args), "seeds": rows}, indent=1, default=str)
        )
    print(ENVS[args.env].table(rows))
    command = (
        f"python benchmarks/cpu_learning.py --env {args.env} --merge {args.out}/{name}.json --out {args.out}"
    )
    print(f"wrote {write_page(args.env, rows, out, command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
