"""A Ray Tune sweep of GAGPO on ALFWorld over lam, gamma, lr and the group size K; reports the best trial.

The base configuration is ``tuned_examples/gagpo_alfworld.py`` (the paper's set-up with ``GAGPO_MODEL``, the CPU
default without). Trials are sized to the machine: on 2 CPUs or fewer every trial runs without remote env
runners and one trial at a time (a trial that asks for more CPUs than exist waits forever); with more CPUs, as
many trials run at once as the CPUs (and GPUs) hold. The best trial is the one with the highest success rate
(``gagpo/success_rate``, mean of its last 5 iterations).

    python tuned_examples/tune_gagpo_alfworld.py                      # grid: 3 x 2 x 2 x 2 = 24 trials
    python tuned_examples/tune_gagpo_alfworld.py --search random --num-samples 8
    python tuned_examples/tune_gagpo_alfworld.py --smoke              # 2 tiny trials x 1 iteration on CPU
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path
from typing import Any

import ray
from ray import tune

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gagpo_rllib import GAGPOConfig  # noqa: E402
from gagpo_rllib.tools.train import ProgressPrinter, find_metric  # noqa: E402

METRIC = "gagpo/success_rate"
# Swept fields: config attribute -> values (grid) ; K is ``group_size``.
GRID: dict[str, list] = {
    "lam": [0.9, 0.95, 1.0],
    "gamma": [0.9, 0.95],
    "lr": [1e-6, 3e-6],
    "group_size": [4, 8],
}
SMOKE_GRID: dict[str, list] = {"lam": [0.9, 1.0], "gamma": [0.95], "lr": [5e-4], "group_size": [2]}
SHORT = {"lam": "lam", "gamma": "gamma", "lr": "lr", "group_size": "K"}


def with_search_space(config: GAGPOConfig, space: dict[str, list], *, search: str = "grid") -> GAGPOConfig:
    """``config`` with each swept field a Tune domain: grid_search over the values, or a random choice."""
    unknown = sorted(set(space) - set(SHORT))
    if unknown:
        raise ValueError(f"search space: unknown field(s) {unknown}; sweepable: {sorted(SHORT)}")
    if search not in ("grid", "random"):
        raise ValueError(f"search must be 'grid' or 'random', got {search!r}")
    config = config.copy(copy_frozen=False)
    for name, values in space.items():
        if not values:
            raise ValueError(f"search space: no values for {name!r}")
        setattr(
            config, name, tune.grid_search(list(values)) if search == "grid" else tune.choice(list(values))
        )
    return config


def fit_to_machine(config: GAGPOConfig, num_cpus: int, num_gpus: int = 0) -> tuple[GAGPOConfig, int]:
    """(config, max concurrent trials) such that every trial's resource request can be met at once."""
    config = config.copy(copy_frozen=False)
    if num_cpus <= 2:
        config.env_runners(num_env_runners=0)
        return config, 1
    runners = config.num_env_runners
    cpus_per_trial = 1 + runners * max(1, config.num_cpus_per_env_runner)
    if cpus_per_trial > num_cpus:
        config.env_runners(num_env_runners=max(0, num_cpus - 1))
        cpus_per_trial = num_cpus
    concurrent = max(1, num_cpus // cpus_per_trial)
    gpus_per_trial = runners * config.num_gpus_per_env_runner + config.num_gpus_per_learner
    if gpus_per_trial > 0:
        concurrent = min(concurrent, max(1, math.floor(num_gpus / gpus_per_trial + 1e-9)))
    return config, concurrent


def trial_rows(results: tune.ResultGrid, space: dict[str, list]) -> list[dict[str, Any]]:
    """One row per trial: its swept values and its final success rate."""
    rows = []
    for result in results:
        cfg = result.config or {}
        row = {SHORT[name]: cfg.get(name) for name in space}
        success = find_metric(result.metrics or {}, ("success_rate",))
        row["success_rate"] = success
        row["iterations"] = (result.metrics or {}).get("training_iteration")
        row["error"] = "" if result.error is None else type(result.error).__name__
        row["path"] = result.path
        rows.append(row)
    return rows


def run_sweep(
    base: GAGPOConfig,
    space: dict[str, list],
    *,
    stop: dict[str, Any],
    storage_path: str,
    name: str,
    search: str = "grid",
    num_samples: int = 1,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
) -> tuple[tune.ResultGrid, tune.Result | None]:
    """Run the sweep; return the ResultGrid and the best trial by success rate (None if every trial failed)."""
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False)
    resources = ray.cluster_resources()
    cpus = int(num_cpus or resources.get("CPU", os.cpu_count() or 1))
    gpus = int(num_gpus if num_gpus is not None else resources.get("GPU", 0))
    config, concurrent = fit_to_machine(base, cpus, gpus)
    config = with_search_space(config, space, search=search)
    print(f"sweep {name}: {cpus} CPUs, {gpus} GPUs -> {concurrent} trial(s) at a time", flush=True)
    tuner = tune.Tuner(
        config.algo_class,
        param_space=config,
        tune_config=tune.TuneConfig(num_samples=num_samples, max_concurrent_trials=concurrent),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(Path(storage_path).resolve()),
            stop=stop,
            verbose=0,
            callbacks=[ProgressPrinter(stop)],
            failure_config=tune.FailureConfig(fail_fast=False),
        ),
    )
    results = tuner.fit()
    try:
        best = results.get_best_result(metric=METRIC, mode="max", scope="last-5-avg")
    except RuntimeError:
        best = None
    return results, best


def write_summary(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 tiny trials x 1 iteration on CPU")
    parser.add_argument("--search", choices=["grid", "random"], default="grid", help="grid or random search")
    parser.add_argument("--num-samples", type=int, default=1, help="samples (grid: repeats of the grid)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations per trial")
    parser.add_argument("--storage", default="results", help="folder for results")
    parser.add_argument("--name", default=None, help="experiment name")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray instance")
    args = parser.parse_args(argv)

    import tuned_examples.gagpo_alfworld as alfworld

    if args.smoke:
        base = alfworld.cpu_config(num_env_runners=0).gagpo(groups_per_iteration=1, max_steps=4)
        space, iterations = SMOKE_GRID, args.iterations or 1
    else:
        base, space, iterations = (
            alfworld.config,
            GRID,
            args.iterations or alfworld.stop["training_iteration"],
        )
    name = args.name or ("tune_gagpo_alfworld_smoke" if args.smoke else "tune_gagpo_alfworld")
    results, best = run_sweep(
        base,
        space,
        stop={"training_iteration": iterations},
        storage_path=args.storage,
        name=name,
        search=args.search,
        num_samples=args.num_samples,
        num_cpus=args.num_cpus,
    )
    rows = trial_rows(results, space)
    for row in rows:
        values = "  ".join(f"{SHORT[n]}={row[SHORT[n]]}" for n in space)
        success = "failed" if row["success_rate"] is None else f"{row['success_rate']:.1%}"
        print(f"trial  {values}  success {success}")
    summary = write_summary(rows, Path(args.storage) / name / "sweep_summary.csv")
    print(f"summary: {summary}")
    if best is None:
        print("no trial reported a success rate")
        return 1
    values = "  ".join(f"{SHORT[n]}={best.config[n]}" for n in space)
    print(f"best trial: {values}  success {find_metric(best.metrics, ('success_rate',)):.1%}  ({best.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
