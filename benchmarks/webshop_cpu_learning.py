"""Does the WebShop CPU default learn? Mean purchase score and success before and after GAGPO, per seed.

For each seed, the CPU default of ``tuned_examples/gagpo_webshop.py`` (tiny random-init policy, constrained decoding
with searches typed from the goal's words, the purchase score as reward) is evaluated at the evaluation temperature
(0.4) on ``--eval-tasks`` eval goals and on ``--train-tasks`` train goals, trained for ``--iterations`` iterations,
and evaluated again on the same goals with the same seeds; the training rollouts' mean score of the first and the
last 5 iterations is reported too. Per-seed JSON, then a table (``--merge`` joins seeds run in parts).

    python benchmarks/webshop_cpu_learning.py --seeds 0 1 2
    python benchmarks/webshop_cpu_learning.py --seeds 1 --out results/ws1            # seeds in parts, then:
    python benchmarks/webshop_cpu_learning.py --merge results/*/webshop_cpu_learning.json --out DIR

Every run, and ``--merge`` with ``--out``, writes the results page ``README.md`` into its output folder (the
committed one: ``benchmarks/results/webshop_cpu/``).
"""

from __future__ import annotations

import argparse
import json
import runpy
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tuned_examples" / "gagpo_webshop.py"


def score_table(config, split: str, *, seed: int, num_tasks: int, checkpoint: str | None = None) -> dict:
    """{"score", "success"} in percent on the first ``num_tasks`` goals of ``split``, at temperature 0.4."""
    from gagpo_rllib.rllib.evaluation import EvalSettings, evaluate

    settings = EvalSettings(split=split, temperature=0.4, num_tasks=num_tasks, seed=seed)
    report = evaluate(config, settings, checkpoint=checkpoint, progress=False)
    return {k: round(float(v), 2) for k, v in report.table.items()}


def run_seed(example: dict, seed: int, args: argparse.Namespace, out: Path) -> dict:
    config = example["cpu_config"](seed=seed, num_env_runners=0)
    config.evaluation(evaluation_interval=None)  # this script evaluates before and after itself
    config.callbacks_on_algorithm_init = None
    started = time.monotonic()
    before = {
        "eval": score_table(config, "eval", seed=seed, num_tasks=args.eval_tasks),
        "train": score_table(config, "train", seed=seed, num_tasks=args.train_tasks),
    }
    print(f"seed {seed}: before  {before}", flush=True)
    algo = config.build_algo()
    scores, wins = [], []
    try:
        for it in range(1, args.iterations + 1):
            g = algo.train()["gagpo"]
            scores.append(float(g.get("task_score_mean", 0.0)))
            wins.append(float(g["success_rate"]))
            print(
                f"seed {seed}: iter {it}/{args.iterations}  rollout score {100 * scores[-1]:5.1f}  success "
                f"{wins[-1]:6.1%}  {time.monotonic() - started:7.1f} s",
                flush=True,
            )
        checkpoint = str(algo.save_to_path(str(out / f"seed{seed}_checkpoint")))
    finally:
        algo.stop()
    after = {
        "eval": score_table(config, "eval", seed=seed, num_tasks=args.eval_tasks, checkpoint=checkpoint),
        "train": score_table(config, "train", seed=seed, num_tasks=args.train_tasks, checkpoint=checkpoint),
    }
    print(f"seed {seed}: after  {after}", flush=True)
    return {
        "seed": seed,
        "iterations": args.iterations,
        "before": before,
        "after": after,
        "rollout_score_first5": 100 * float(np.mean(scores[:5])),
        "rollout_score_last5": 100 * float(np.mean(scores[-5:])),
        "rollout_success_first5": 100 * float(np.mean(wins[:5])),
        "rollout_success_last5": 100 * float(np.mean(wins[-5:])),
        "rollout_scores": scores,
        "seconds": time.monotonic() - started,
    }


def report(rows: list[dict]) -> str:
    """Score and success (percent) before / after per seed and their mean."""
    header = (
        "| seed | iterations | eval score: before | after | rise | eval success: before | after "
        "| train-goal score: before | after | rollout score: first 5 | last 5 | seconds |"
    )
    lines = [header, "|" + "---|" * 12]

    def line(name, r):
        rise = r["after"]["eval"]["score"] - r["before"]["eval"]["score"]
        return (
            f"| {name} | {r['iterations']} | {r['before']['eval']['score']:.1f} | {r['after']['eval']['score']:.1f} "
            f"| {rise:+.1f} | {r['before']['eval']['success']:.1f} | {r['after']['eval']['success']:.1f} "
            f"| {r['before']['train']['score']:.1f} | {r['after']['train']['score']:.1f} "
            f"| {r['rollout_score_first5']:.1f} | {r['rollout_score_last5']:.1f} | {r['seconds']:.0f} |"
        )

    for r in rows:
        lines.append(line(r["seed"], r))
    if len(rows) > 1:
        mean = {
            "iterations": rows[0]["iterations"],
            "before": {
                s: {k: np.mean([r["before"][s][k] for r in rows]) for k in ("score", "success")}
                for s in ("eval", "train")
            },
            "after": {
                s: {k: np.mean([r["after"][s][k] for r in rows]) for k in ("score", "success")}
                for s in ("eval", "train")
            },
            **{
                k: np.mean([r[k] for r in rows])
                for k in ("rollout_score_first5", "rollout_score_last5", "seconds")
            },
        }
        lines.append(line("mean", mean))
    return "\n".join(lines)


def page(rows: list[dict], command: str) -> str:
    """The results folder's README.md: what was measured, the table and the command that wrote it (a generated
    page, never edited by hand)."""
    return (
        "# WebShop CPU default: purchase score and success before and after GAGPO, per seed\n\n"
        f"Written by `benchmarks/webshop_cpu_learning.py`; not edited by hand. To write it again:\n\n    {command}\n\n"
        "The CPU default of `tuned_examples/gagpo_webshop.py` without a model (tiny random-init policy, "
        "constrained decoding with search_grammar 'goal_prefix', reward_mode 'score'), on the bundled catalogue. "
        "Score and success in percent, at temperature 0.4 on the first eval goals and the first train goals, "
        "before and after GAGPO; rollout score: the training rollouts' mean purchase score of the first and the "
        "last 5 iterations; seconds: the seed's wall time.\n\n"
        f"{report(rows)}\n"
    )


def write_page(rows: list[dict], out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "README.md"
    path.write_text(page(rows, command))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="default: the CPU default's")
    parser.add_argument("--eval-tasks", type=int, default=24, help="eval goals evaluated before and after")
    parser.add_argument("--train-tasks", type=int, default=24, help="train goals evaluated before and after")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="no training: table of these JSONs (with --out: also write its README.md there)",
    )
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--out", default=None, help="output folder (default results/webshop_cpu_learning)")
    args = parser.parse_args(argv)
    if args.merge:
        rows = [r for path in args.merge for r in json.loads(path.read_text())["seeds"]]
        rows = sorted(rows, key=lambda r: r["seed"])
        print(report(rows))
        if args.out is not None:
            files = " ".join(str(p) for p in args.merge)
            command = f"python benchmarks/webshop_cpu_learning.py --merge {files} --out {args.out}"
            print(f"wrote {write_page(rows, Path(args.out), command)}")
        return 0
    if args.out is None:
        args.out = "results/webshop_cpu_learning"
    from gagpo_rllib.tools.train import init_ray

    example = runpy.run_path(str(EXAMPLE), run_name="webshop_cpu_learning")
    if args.iterations is None:
        args.iterations = example["CPU_ITERATIONS"]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    init_ray(num_cpus=args.num_cpus)
    rows = []
    for seed in args.seeds:
        rows.append(run_seed(example, seed, args, out))
        (out / "webshop_cpu_learning.json").write_text(json.dumps({"seeds": rows}, indent=1))
    print(report(rows))
    command = f"python benchmarks/webshop_cpu_learning.py --merge {args.out}/webshop_cpu_learning.json --out {args.out}"
    print(f"wrote {write_page(rows, out, command)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
