"""Run an AlgorithmConfig under Ray Tune: stop criteria, checkpoints, resume, a one-line progress report.

Tune gives every run the standard result files (result.json, progress.csv, TensorBoard events) and
checkpoints; this module adds the RLlib-CLI semantics on top and keeps the terminal output short.
"""

from __future__ import annotations

import logging
import math
import os
import runpy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

__all__ = [
    "TrainSpec",
    "load_train_file",
    "train",
    "find_metric",
    "describe_env",
    "ProgressPrinter",
    "StopRule",
    "with_ray_metrics",
]

logger = logging.getLogger(__name__)

SUCCESS_KEYS = ("success_rate", "episode_success_mean", "won_mean")


@dataclass
class TrainSpec:
    """What a tuned-example file defines: ``config`` (an AlgorithmConfig) and, optionally, ``stop`` and
    ``PLATEAU_PATIENCE`` (see ``StopRule``)."""

    config: AlgorithmConfig
    stop: dict[str, Any]
    path: Path
    plateau_patience: int | None = None


def load_train_file(path: str | os.PathLike) -> TrainSpec:
    """Execute a tuned-example file (not as ``__main__``) and take its ``config`` and ``stop``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training file not found: {path}")
    namespace = runpy.run_path(str(path), run_name="__rllib_train_file__")
    config = namespace.get("config")
    if not isinstance(config, AlgorithmConfig):
        raise ValueError(
            f"{path} must define `config` as an RLlib AlgorithmConfig, got {type(config).__name__}"
        )
    stop = namespace.get("stop", {}) or {}
    if not isinstance(stop, Mapping):
        raise ValueError(f"{path}: `stop` must be a dict of metric -> threshold, got {type(stop).__name__}")
    plateau = namespace.get("PLATEAU_PATIENCE")
    if plateau is not None and (not isinstance(plateau, int) or isinstance(plateau, bool) or plateau < 1):
        raise ValueError(f"{path}: PLATEAU_PATIENCE must be an int >= 1, got {plateau!r}")
    return TrainSpec(config=config, stop=dict(stop), path=path, plateau_patience=plateau)


def _flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def find_metric(result: Mapping[str, Any], suffixes: tuple[str, ...] = SUCCESS_KEYS) -> float | None:
    """The first numeric metric whose flattened name ends with one of ``suffixes`` (env-runner metrics first)."""
    flat = _flatten(result)
    for suffix in suffixes:
        for name in sorted(flat, key=lambda n: (not n.startswith("env_runners"), n)):
            value = flat[name]
            if name.endswith(suffix) and isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def describe_env(config: Mapping[str, Any] | None) -> str | None:
    """What the env of a trial's config plays on (data, noun extractor, split), from the env class's
    ``describe_config(env_config)`` when it has one (WebShop does); None otherwise."""
    env = (config or {}).get("env")
    describe = getattr(env, "describe_config", None)
    if not callable(describe):
        return None
    try:
        return str(describe(dict((config or {}).get("env_config") or {})))
    except Exception as err:  # noqa: BLE001 - a progress line must not end a run
        logger.warning("progress line: %s.describe_config failed: %s", getattr(env, "__name__", env), err)
        return None


class StopRule(tune.Stopper):
    """Tune's ``stop`` dict (a trial stops when a metric reaches its value) plus an optional plateau rule, and the
    reason why each trial stopped, in words (``ProgressPrinter`` prints it after the last line).

    Plateau: with ``plateau_patience`` N, a trial stops when the success rate's ``window``-iteration rolling mean
    has not risen more than ``min_delta`` above its best for N iterations: a run whose groups have stopped
    carrying signal (every task either always solved or never) then ends early and says so instead of spending
    the rest of its budget at the same value.
    """

    def __init__(
        self,
        stop: Mapping[str, Any] | None = None,
        *,
        plateau_patience: int | None = None,
        window: int = 5,
        min_delta: float = 0.02,
    ):
        if plateau_patience is not None and (not isinstance(plateau_patience, int) or plateau_patience < 1):
            raise ValueError(f"plateau_patience must be None or an int >= 1, got {plateau_patience!r}")
        self.stop = dict(stop or {})
        self.patience, self.window, self.min_delta = plateau_patience, window, min_delta
        self.reasons: dict[str, str] = {}
        self._history: dict[str, list[float]] = {}
        self._best: dict[str, tuple[float, int]] = {}

    def __call__(self, trial_id: str, result: dict) -> bool:
        flat = _flatten(result)
        it = int(result.get("training_iteration", 0))
        success = find_metric(result)
        if success is not None:
            history = self._history.setdefault(trial_id, [])
            history.append(success)
        for key, goal in self.stop.items():
            value = flat.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= goal:
                if key == "training_iteration":
                    best = max(self._history.get(trial_id, [float("nan")]))
                    goals = ", ".join(f"{k} {v}" for k, v in self.stop.items() if k != key)
                    self.reasons[trial_id] = (
                        f"stopped: the budget of {goal} iterations is spent"
                        + (f" before reaching {goals}" if goals else "")
                        + (f"; best success {best:.1%}" if success is not None else "")
                    )
                else:
                    self.reasons[trial_id] = f"stopped at iteration {it}: {key} = {value:.3g} reached {goal}"
                return True
        if self.patience is None or success is None:
            return False
        history = self._history[trial_id]
        if len(history) < self.window:
            return False
        rolling = float(np.mean(history[-self.window :]))
        best, best_it = self._best.get(trial_id, (-math.inf, 0))
        if rolling > best + self.min_delta:
            self._best[trial_id] = (rolling, it)
            return False
        if it - best_it >= self.patience:
            reason = (
                f"stopped at iteration {it}: success has plateaued; its {self.window}-iteration mean has not risen "
                f"more than {self.min_delta:.0%} above {best:.1%} (reached at iteration {best_it}) for "
                f"{self.patience} iterations (latest {history[-1]:.1%})"
            )
            uniform = find_metric(result, ("uniform_group_share",))
            if uniform is not None:
                reason += (
                    f"; {uniform:.0%} of the last iteration's groups got the same return in all their rollouts "
                    "(no learning signal; GAGPOConfig.dynamic_sampling replaces such groups)"
                )
            self.reasons[trial_id] = reason
            return True
        return False

    def stop_all(self) -> bool:
        return False


class ProgressPrinter(tune.Callback):
    """One line per iteration: iteration, success, mean task score (when the env reports one), return, time per
    iteration, ETA to the iteration limit, and what the env plays on (``describe_env``); after a trial's last
    line, why it stopped (``StopRule``)."""

    def __init__(self, stop: Mapping[str, Any] | None = None, stop_rule: StopRule | None = None):
        self.max_iterations = (stop or {}).get("training_iteration")
        self.stop_rule = stop_rule
        self._described: dict[str, str | None] = {}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        it = int(result.get("training_iteration", 0))
        per_iter = float(result.get("time_total_s", 0.0)) / max(it, 1)
        success = find_metric(result)
        score = find_metric(result, ("task_score_mean",))
        ret = find_metric(result, ("episode_return_mean",))
        parts = [f"[{trial.trial_id}] iter {it}" + (f"/{self.max_iterations}" if self.max_iterations else "")]
        if success is not None:
            parts.append(f"success {success:6.1%}")
        if score is not None:
            parts.append(f"score {100 * score:5.1f}")
        if ret is not None and math.isfinite(ret):
            parts.append(f"return {ret:7.2f}")
        parts.append(f"{per_iter:6.1f} s/iter")
        if self.max_iterations:
            parts.append(f"ETA {max(self.max_iterations - it, 0) * per_iter:6.0f} s")
        trial_id = str(getattr(trial, "trial_id", ""))
        if trial_id not in self._described:
            self._described[trial_id] = describe_env(getattr(trial, "config", None))
        if self._described[trial_id]:
            parts.append(f"| {self._described[trial_id]}")
        print("  ".join(parts), flush=True)
        reason = self.stop_rule.reasons.get(trial_id) if self.stop_rule is not None else None
        if reason:
            print(f"[{trial_id}] {reason}", flush=True)


def with_ray_metrics(config: AlgorithmConfig) -> AlgorithmConfig:
    """``config`` plus the callback that publishes the GAGPO metrics as Ray metrics (seen from the dashboard)."""
    from gagpo_rllib.ray_metrics import publish_ray_metrics

    existing = config.callbacks_on_train_result
    callbacks = [*(existing if isinstance(existing, list) else [existing] if existing else [])]
    if publish_ray_metrics not in callbacks:
        callbacks.append(publish_ray_metrics)
    return config.copy(copy_frozen=False).callbacks(on_train_result=callbacks)


def init_ray(*, num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Start a local Ray (dashboard on loopback only when asked) unless one is already running."""
    if ray.is_initialized():
        return
    context = ray.init(num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1")
    if dashboard:
        print(f"Ray dashboard: http://{context.dashboard_url}", flush=True)


def train(
    config: AlgorithmConfig,
    *,
    stop: Mapping[str, Any] | None = None,
    storage_path: str | os.PathLike | None = None,
    name: str | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = True,
    restore: str | None = None,
    resume: str | None = None,
    max_failures: int = 0,
    num_cpus: int | None = None,
    dashboard: bool = False,
    verbose: int = 0,
    plateau_patience: int | None = None,
) -> tune.ResultGrid:
    """Train ``config`` under Tune until ``stop``; returns the ResultGrid and prints where results went.

    ``restore`` starts from an Algorithm checkpoint's weights and state; ``resume`` continues an interrupted
    experiment directory where it stopped. ``max_failures`` (Tune's ``FailureConfig``): a trial that raises is
    restarted from its last checkpoint up to that many times (0, the default: not restarted; -1: always), so set
    ``checkpoint_freq`` too or the restart begins from scratch. ``plateau_patience`` N: also stop a trial whose
    success has not risen for N iterations (``StopRule``); the reason a trial stopped is printed.
    """
    init_ray(num_cpus=num_cpus, dashboard=dashboard)
    if dashboard:
        config = with_ray_metrics(config)
    stop = dict(stop or {})
    stop_rule = StopRule(stop, plateau_patience=plateau_patience)
    storage_path = str(Path(storage_path or Path.cwd() / "results").resolve())
    if restore is not None:
        checkpoint = str(Path(restore).resolve())
        if not Path(checkpoint).exists():
            raise FileNotFoundError(f"checkpoint to restore not found: {checkpoint}")
        # The checkpoint loads first, then the config's own start-up callbacks (e.g. a validation before
        # training) see the restored algorithm.
        own = config.callbacks_on_algorithm_init
        own = [] if own is None else list(own) if isinstance(own, (list, tuple)) else [own]
        config = config.copy(copy_frozen=False).callbacks(
            on_algorithm_init=[lambda algorithm, **kw: algorithm.restore_from_path(checkpoint), *own]
        )
    run_config = tune.RunConfig(
        name=name,
        storage_path=storage_path,
        stop=stop_rule,
        verbose=verbose,
        callbacks=[ProgressPrinter(stop, stop_rule)],
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=checkpoint_freq, checkpoint_at_end=checkpoint_at_end
        ),
        failure_config=tune.FailureConfig(max_failures=max_failures),
    )
    if resume is not None:
        tuner = tune.Tuner.restore(
            str(Path(resume).resolve()), trainable=config.algo_class, resume_errored=True
        )
    else:
        tuner = tune.Tuner(config.algo_class, param_space=config, run_config=run_config)
    results = tuner.fit()
    for result in results:
        if result.error:
            print(f"trial failed: {result.error}", flush=True)
            continue
        print(f"results: {result.path}", flush=True)
        if result.checkpoint is not None:
            print(f"checkpoint: {result.checkpoint.path}", flush=True)
    return results
