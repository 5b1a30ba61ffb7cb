"""Does GAGPO improve on the ALFWorld CPU default's warm start? Success before and after, per seed.

The CPU default of ``tuned_examples/gagpo_alfworld.py`` warm-starts the tiny policy on the walkthroughs of most
bundled train games (cached; the same warm start for every seed), then trains GAGPO on the games the warm start
did not see. For each GAGPO seed this script measures, at the evaluation temperature (0.4) and with the same
constrained decoding:

- success on the GAGPO training games, for the warm start and after the run (every game, ``--episodes`` each);
- success on valid_unseen, for the warm start and after the run (all of it);
- the training rollouts' success (at the training temperature), mean of the first and of the last 5 iterations;

then the mean over seeds and the rise on the training games, with every seed's numbers, as a table and
``alfworld_cpu_learning.json``. The acceptance figure: the rise on the GAGPO training games (mean of 3 seeds).

    python benchmarks/alfworld_cpu_learning.py --seeds 0 1 2
    python benchmarks/alfworld_cpu_learning.py --seeds 1 --out results/seed1      # seeds in parts, then:
    python benchmarks/alfworld_cpu_learning.py --merge results/*/alfworld_cpu_learning.json --out DIR

Every run, and ``--merge`` with ``--out``, writes the results page ``README.md`` into its output folder (the
committed one: ``benchmarks/results/alfworld_cpu/``).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tuned_examples" / "gagpo_alfworld.py"


def load_example() -> dict:
    """The tuned example's functions (its module-level config without the warm start; ``cpu_config`` sets it up)."""
    previous = os.environ.get("GAGPO_ALFWORLD_WARM_START")
    os.environ["GAGPO_ALFWORLD_WARM_START"] = "0"
    try:
        return runpy.run_path(str(EXAMPLE), run_name="alfworld_cpu_learning")
    finally:
        if previous is None:
            os.environ.pop("GAGPO_ALFWORLD_WARM_START", None)
        else:
            os.environ["GAGPO_ALFWORLD_WARM_START"] = previous


def success_table(
    config,
    split: str,
    *,
    seed: int,
    episodes: int,
    num_tasks: int | None = None,
    checkpoint: str | None = None,
) -> dict:
    """Success per task type (percent) on ``split`` of the config's env, at temperature 0.4."""
    from gagpo_rllib.rllib.evaluation import EvalSettings, evaluate

    settings = EvalSettings(
        split=split, temperature=0.4, num_tasks=num_tasks, episodes_per_task=episodes, seed=seed
    )
    report = evaluate(config, settings, checkpoint=checkpoint, progress=False)
    return {k: (None if np.isnan(v) else round(v, 2)) for k, v in report.table.items()}


def run_seed(example: dict, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """Warm start (cached), evaluations before, GAGPO for ``args.iterations``, evaluations after."""
    settings = example["WARM_START_SETTINGS"]
    if args.warm_start_epochs is not None:
        settings = type(settings)(**{**settings.__dict__, "epochs": args.warm_start_epochs})
    config = example["cpu_config"](
        seed=seed,
        warm=True,
        warm_settings=settings,
        train_games_per_type=args.train_games_per_type,
        group_size=args.group_size,
        temperature=args.temperature,
    )
    # This script evaluates before and after itself: no periodic validation inside the run.
    config.evaluation(evaluation_interval=None)
    config.callbacks_on_algorithm_init = None
    started = time.monotonic()
    before_train = success_table(config, "train", seed=seed, episodes=args.episodes)
    valid = dict(split=example["VALID_SPLIT"], seed=seed, episodes=1, num_tasks=args.valid_tasks)
    before_valid = success_table(config, **valid)
    print(
        f"seed {seed}: warm start  train games {before_train['All']:.1f}  valid_unseen {before_valid['All']:.1f}"
    )
    algo = config.build_algo()
    curve = []
    try:
        for it in range(1, args.iterations + 1):
            result = algo.train()
            curve.append(float(result["gagpo"]["success_rate"]))
            print(
                f"seed {seed}: iter {it}/{args.iterations}  rollout success {curve[-1]:6.1%}  "
                f"{time.monotonic() - started:7.1f} s",
                flush=True,
            )
        checkpoint = str(algo.save_to_path(str(out / f"seed{seed}_checkpoint")))
    finally:
        algo.stop()
    after_train = success_table(config, "train", seed=seed, episodes=args.episodes, checkpoint=checkpoint)
    after_valid = success_table(config, **valid, checkpoint=checkpoint)
    return {
        "seed": seed,
        "train_before": before_train,
        "train_after": after_train,
        "valid_before": before_valid,
        "valid_after": after_valid,
        "rollout_first5": 100 * float(np.mean(curve[:5])),
        "rollout_last5": 100 * float(np.mean(curve[-5:])),
        "rollout_curve": curve,
        "seconds": time.monotonic() - started,
        "checkpoint": checkpoint,
    }


def report(rows: list[dict]) -> str:
    header = (
        "| seed | train games: warm start | after | rise | rollouts: first 5 | last 5 "
        "| valid_unseen: warm start | after | seconds |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        rise = r["train_after"]["All"] - r["train_before"]["All"]
        lines.append(
            f"| {r['seed']} | {r['train_before']['All']:.1f} | {r['train_after']['All']:.1f} | {rise:+.1f} | "
            f"{r['rollout_first5']:.1f} | {r['rollout_last5']:.1f} | {r['valid_before']['All']:.1f} | "
            f"{r['valid_after']['All']:.1f} | {r['seconds']:.0f} |"
        )

    def mean(key: str, sub: str | None = "All") -> float:
        return float(np.mean([r[key][sub] if sub else r[key] for r in rows]))

    rise = mean("train_after") - mean("train_before")
    lines.append(
        f"| mean | {mean('train_before'):.1f} | {mean('train_after'):.1f} | {rise:+.1f} | "
        f"{mean('rollout_first5', None):.1f} | {mean('rollout_last5', None):.1f} | {mean('valid_before'):.1f} | "
        f"{mean('valid_after'):.1f} | {mean('seconds', None):.0f} |"
    )
    return "\n".join(lines)


def page(rows: list[dict], command: str) -> str:
    """The results folder's README.md: what was measured, the table and the command that wrote it (a generated
    page, never edited by hand)."""
    return (
        "# ALFWorld CPU default: success before and after GAGPO, per seed\n\n"
        f"Written by `benchmarks/alfworld_cpu_learning.py`; not edited by hand. To write it again:\n\n    {command}\n\n"
        "The CPU default of `tuned_examples/gagpo_alfworld.py` warm-starts the tiny policy on the walkthroughs of "
        "most bundled train games, then trains GAGPO on held-out train games. Success in percent at temperature "
        "0.4 on the GAGPO training games (train games) and on all of valid_unseen, for the warm start and after "
        "each seed's run; rollouts: the training rollouts' success (at the training temperature), mean of the "
        "first and of the last 5 iterations; seconds: the seed's wall time.\n\n"
        f"{report(rows)}\n"
    )


def write_page(rows: list[dict], out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "README.md"
    path.write_text(page(rows, command))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GAGPO seeds (default 0 1 2)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="GAGPO iterations per seed (default the CPU default's)"
    )
    parser.add_argument("--episodes", type=int, default=8, help="evaluation episodes per training game")
    parser.add_argument(
        "--warm-start-epochs", type=int, default=None, help="override the CPU default's warm-start epochs"
    )
    parser.add_argument(
        "--train-games-per-type",
        type=int,
        default=None,
        help="GAGPO games per task type (default the CPU default's)",
    )
    parser.add_argument(
        "--group-size", type=int, default=None, help="rollouts per game (default the CPU default's)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="training rollouts' temperature (default the CPU default's)",
    )
    parser.add_argument("--valid-tasks", type=int, default=None, help="valid_unseen games (default all)")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="no training: print the table of the seeds in these alfworld_cpu_learning.json files "
        "(with --out: also write its README.md there)",
    )
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs for the local Ray instance")
    parser.add_argument("--out", default=None, help="output folder (default results/alfworld_cpu_learning)")
    args = parser.parse_args(argv)
    if args.merge:
        rows = [r for path in args.merge for r in json.loads(path.read_text())["seeds"]]
        seeds = [r["seed"] for r in rows]
        if len(set(seeds)) != len(seeds):
            raise SystemExit(f"--merge: seed(s) repeated across the files: {sorted(seeds)}")
        rows = sorted(rows, key=lambda r: r["seed"])
        print(report(rows))
        if args.out is not None:
            files = " ".join(str(p) for p in args.merge)
            command = f"python benchmarks/alfworld_cpu_learning.py --merge {files} --out {args.out}"
            print(f"wrote {write_page(rows, Path(args.out), command)}")
        return 0

    from gagpo_rllib.tools.train import init_ray

    if args.out is None:
        args.out = "results/alfworld_cpu_learning"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    example = load_example()
    if args.train_games_per_type is None:
        args.train_games_per_type = example["GAGPO_TRAIN_GAMES_PER_TYPE"]
    if args.group_size is None:
        args.group_size = example["CPU_GROUP_SIZE"]
    if args.iterations is None:
        args.iterations = example["WARM_ITERATIONS"]
    if args.temperature is None:
        args.temperature = example["CPU_TEMPERATURE"]
    init_ray(num_cpus=args.num_cpus)
    rows = [run_seed(example, seed, args, out) for seed in args.seeds]
    table = report(rows)
    print(table)
    print(
        "success in percent at temperature 0.4; rollouts at the training temperature "
        f"({args.temperature}) on the GAGPO training games"
    )
    path = out / "alfworld_cpu_learning.json"
    path.write_text(json.dumps({"args": vars(args), "seeds": rows, "table": table}, indent=1))
    print(f"wrote {path}")
    command = f"python benchmarks/alfworld_cpu_learning.py --merge {args.out}/alfworld_cpu_learning.json --out {args.out}"
    print(f"wrote {write_page(rows, out, command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
