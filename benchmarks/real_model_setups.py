"""Which set-up trains the real model fastest on this machine: rollouts on the vLLM CPU engine or with Hugging Face
``generate``, full fine-tuning or LoRA adapters.

Each set-up trains the real-model recipe (``gagpo_rllib.tools.real_model``: SmolLM2-135M-Instruct, its cached
warm start of the seed, constrained decoding, its learner dtype) for a few iterations from the same warm start and
seed, one set-up after another, each in a fresh Python process (run nothing else beside it: the figures are wall
time on a shared 2-core machine). Every iteration's row records where its time went (sampling, the update, the
weight sync), the env steps played and the rows the learner trained, and the driver's peak resident memory; the
page divides them into seconds per played step and per trained row, and sets each set-up beside the recipe's.
The first iteration of each set-up is left out of the means (first-call costs: compiled kernels, allocator growth).

    python benchmarks/real_model_setups.py --env alfworld --iterations 4    # every set-up, then the page
    python benchmarks/real_model_setups.py --render                          # the page from the CSVs
"""

from __future__ import annotations

import argparse
import csv
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.real_model_learning import plain, reset_peak_rss, rss_gib, run_environment  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "real_model_setups"
COLUMNS = (
    "iteration",
    "seconds",
    "sampling_s",
    "update_s",
    "sync_s",
    "played_steps",
    "trained_rows",
    "episodes",
    "success",
    "driver_peak_gib",
)


@dataclass(frozen=True)
class Setup:
    """A rollout backend and a way to train the weights (``lora_rank`` 0: full fine-tuning)."""

    backend: str
    lora_rank: int = 0
    # LoRA's adapters start at zero and move the policy through a rank-r update: they take a larger step size.
    lr: float | None = None


SETUPS = {
    "vllm-full": Setup("vllm"),
    "hf-full": Setup("hf"),
    "vllm-lora16": Setup("vllm", lora_rank=16, lr=1e-4),
    "hf-lora16": Setup("hf", lora_rank=16, lr=1e-4),
}
RECIPE_SETUP = "vllm-full"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=("alfworld", "webshop"), default="alfworld")
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--work", default="/tmp/gagpo_real_model_learning", help="models and warm starts (shared)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--render", action="store_true", help="only write the page from the CSVs in --out")
    return p.parse_args(argv)


def csv_path(out: Path, env: str, setup: str) -> Path:
    return out / f"{env}_{setup}.csv"


def iteration_row(iteration: int, seconds: float, result: dict, peak_gib: float) -> dict:
    """One iteration's time split and sizes from ``Algorithm.train()``'s result."""
    g = result["gagpo"]
    grouping = result.get("learners", {}).get("gagpo", {})
    trained = not g.get("update_skipped", 0.0)
    sync_s = float(g.get("weight_sync_s", 0.0)) if trained else 0.0
    return {
        "iteration": iteration,
        "seconds": round(seconds, 2),
        "sampling_s": round(float(g["time_sampling_s"]), 2),
        # time_learner_s is the update and the sync after it.
        "update_s": round(float(g["time_learner_s"]) - sync_s, 2),
        "sync_s": round(sync_s, 3),
        "played_steps": round(float(g["num_episodes"]) * float(g["episode_len_mean"])),
        "trained_rows": int(grouping.get("num_steps_trained", 0)) if trained else 0,
        "episodes": int(g["num_episodes"]),
        "success": round(float(g["success_rate"]), 4),
        "driver_peak_gib": round(peak_gib, 2),
    }


def run(env: str, setup: str, args: argparse.Namespace) -> Path:
    """``args.iterations`` iterations of the recipe under ``setup``; returns its CSV."""
    from gagpo_rllib.tools.real_model import RECIPES, base_model, train_config, warm_start

    recipe, spec, work = RECIPES[env], SETUPS[setup], Path(args.work)
    warm = warm_start(recipe, base_model(work), work / f"{env}_warm_start_seed{args.seed}", seed=args.seed)
    config = train_config(recipe, warm, seed=args.seed, backend=spec.backend)
    if spec.lora_rank:
        config = config.llm(lora_rank=spec.lora_rank)
    if spec.lr is not None:
        config = config.training(lr=spec.lr)
    path = csv_path(Path(args.out), env, setup)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f).writerow(COLUMNS)
    algo = config.build_algo()
    try:
        for i in range(1, args.iterations + 1):
            reset_peak_rss()
            t = time.monotonic()
            result = algo.train()
            row = iteration_row(i, time.monotonic() - t, result, rss_gib("VmHWM"))
            with path.open("a", newline="") as f:
                csv.writer(f).writerow([row[c] for c in COLUMNS])
            print(f"[{path.stem}] {row}", flush=True)
    finally:
        algo.stop()
    return path


def read_setups(out: Path, env: str) -> dict[str, list[dict]]:
    """Every set-up's CSV of ``env`` in ``out``: {set-up: rows}, in ``SETUPS`` order."""
    runs = {}
    for setup in SETUPS:
        path = csv_path(out, env, setup)
        if path.is_file():
            with path.open() as f:
                runs[setup] = list(csv.DictReader(f))
    return runs


def costs(rows: list[dict]) -> dict:
    """Seconds per played step (sampling), per trained row (update) and per iteration, over the iterations after
    the first; NaN where none of them played or trained anything."""
    later = rows[1:]

    def total(column: str) -> float:
        return sum(float(r[column]) for r in later)

    def per(numerator: str, denominator: str) -> float:
        d = total(denominator)
        return total(numerator) / d if d else math.nan

    synced = [float(r["sync_s"]) for r in later if int(r["trained_rows"])]
    return {
        "iterations": len(later),
        "sampling_s_per_step": per("sampling_s", "played_steps"),
        "update_s_per_row": per("update_s", "trained_rows"),
        "sync_s": sum(synced) / len(synced) if synced else math.nan,
        "seconds_per_iteration": total("seconds") / len(later) if later else math.nan,
        "driver_peak_gib": max((float(r["driver_peak_gib"]) for r in rows), default=math.nan),
    }


def _ratio(c: dict, base: dict | None, key: str) -> str:
    return plain(c[key] / base[key], ".2f") if base else "-"


def render(out: Path) -> str:
    """The page from every set-up's CSV in ``out``."""
    lines = [
        "# Which set-up trains the real model fastest on CPU",
        "",
        "Written by `python benchmarks/real_model_setups.py --render` from the CSVs in this folder (one per env and "
        "set-up; a row per iteration). Each set-up trained the real-model recipe (`gagpo_rllib/tools/real_model.py`) "
        "from the same warm start and seed, one after another on 2 CPU cores; the first iteration of each is left "
        f"out of the means. Ratios are to the recipe's set-up, `{RECIPE_SETUP}` (above 1: slower).",
    ]
    for env in ("alfworld", "webshop"):
        runs = read_setups(out, env)
        if not runs:
            continue
        base = costs(runs[RECIPE_SETUP]) if RECIPE_SETUP in runs else None
        lines += [
            "",
            f"## {env}",
            "",
            "| set-up | iterations | sampling s / played step | ratio | update s / trained row | ratio |"
            " sync s | s / iteration | driver peak (GiB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for setup, rows in runs.items():
            c = costs(rows)
            lines.append(
                f"| {setup} | {c['iterations']} | {plain(c['sampling_s_per_step'], '.3f')} | "
                f"{_ratio(c, base, 'sampling_s_per_step')} | {plain(c['update_s_per_row'], '.3f')} | "
                f"{_ratio(c, base, 'update_s_per_row')} | {plain(c['sync_s'], '.2f')} | "
                f"{plain(c['seconds_per_iteration'], '.1f')} | {plain(c['driver_peak_gib'], '.1f')} |"
            )
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if not args.render:
        run_environment(args.work)
        if len(args.setups) > 1:
            # One process per set-up: each starts from a driver and an engine of its own.
            failed = [s for s in args.setups if _run_in_subprocess(s, args) != 0]
            print(render(out))
            if failed:
                print(f"set-ups that failed: {failed}", file=sys.stderr)
            return 1 if failed else 0
        from gagpo_rllib.tools.train import init_ray

        init_ray(num_cpus=2)
        run(args.env, args.setups[0], args)
    print(render(out))
    return 0


def _run_in_subprocess(setup: str, args: argparse.Namespace) -> int:
    argv = [sys.executable, str(Path(__file__).resolve()), "--env", args.env, "--setups", setup]
    argv += ["--seed", str(args.seed), "--iterations", str(args.iterations)]
    argv += ["--work", args.work, "--out", args.out]
    return subprocess.run(argv, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
