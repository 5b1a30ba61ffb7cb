"""Run an AlgorithmConfig under Ray Tune: stop criteria, checkpoints, resume, a one-line progress report.

Tune gives every run the standard result files (result.json, progress.csv, TensorBoard events) and
checkpoints; this module adds the RLlib-CLI semantics on top and keeps the terminal output short.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import runpy
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

__all__ = [
    "NodeLocalStorageError",
    "TrainSpec",
    "bind_ray_to_loopback",
    "check_storage",
    "filesystem_type",
    "init_ray",
    "load_train_file",
    "train",
    "find_metric",
    "describe_env",
    "KeepBestCheckpoint",
    "ProgressPrinter",
    "StopRule",
    "with_ray_metrics",
]

logger = logging.getLogger(__name__)

SUCCESS_KEYS = ("success_rate", "episode_success_mean", "won_mean")
# Checkpoints a run keeps by default: the most recent ones (plus the best, see KeepBestCheckpoint).
KEEP_CHECKPOINTS = 2
BEST_CHECKPOINT = "best_checkpoint"


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


class KeepBestCheckpoint(tune.Callback):
    """Copies a trial's checkpoint to ``<trial folder>/best_checkpoint`` when its metric is the trial's best so far
    (ties: the later one), so that pruning to the last N checkpoints never loses the best.

    ``metric``: a flattened result name (``"evaluation/env_runners/gagpo/success_rate"``); None: the success metric
    ``find_metric`` reads. A checkpoint whose result lacks the metric is not considered (counted and logged).
    """

    def __init__(self, metric: str | None = None):
        self.metric = metric
        self.best: dict[str, float] = {}
        self.without_metric = 0

    def value(self, result: Mapping[str, Any]) -> float | None:
        if self.metric is None:
            return find_metric(result)
        value = _flatten(result).get(self.metric)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        value = self.value(trial.last_result or {})
        trial_id = str(trial.trial_id)
        if value is None or not math.isfinite(value):
            self.without_metric += 1
            logger.warning(
                "keep best checkpoint: trial %s's result has no %s (%d checkpoints without it)",
                trial_id,
                self.metric or f"success metric ({', '.join(SUCCESS_KEYS)})",
                self.without_metric,
            )
            return
        dest = Path(trial.local_path) / BEST_CHECKPOINT
        if trial_id not in self.best and (dest / "best.json").is_file():  # a resumed run: the best so far
            self.best[trial_id] = float(json.loads((dest / "best.json").read_text())["value"])
        if value < self.best.get(trial_id, -math.inf):
            return
        self.best[trial_id] = value
        staging = dest.with_name(BEST_CHECKPOINT + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        checkpoint.to_directory(str(staging))
        (staging / "best.json").write_text(
            json.dumps(
                {
                    "metric": self.metric or "success",
                    "value": value,
                    "training_iteration": int((trial.last_result or {}).get("training_iteration", 0)),
                }
            )
        )
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)


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
    from gagpo_rllib.tools.ray_metrics import publish_ray_metrics

    existing = config.callbacks_on_train_result
    callbacks = [*(existing if isinstance(existing, list) else [existing] if existing else [])]
    if publish_ray_metrics not in callbacks:
        callbacks.append(publish_ray_metrics)
    return config.copy(copy_frozen=False).callbacks(on_train_result=callbacks)


LOOPBACK = "127.0.0.1"


def init_ray(*, num_cpus: int | None = None, dashboard: bool = False, listen_all: bool = False) -> None:
    """Connect to the cluster at ``RAY_ADDRESS`` or start a Ray of this run's own bound to loopback; no-op when
    Ray runs.

    An existing cluster's resources are set by ``ray start``: ``num_cpus`` is then ignored with a note (Ray
    refuses ``ray.init(num_cpus=...)`` when connecting). A local Ray's processes listen on 127.0.0.1 only
    (``bind_ray_to_loopback``) unless ``listen_all``.
    """
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        if num_cpus is not None:
            print(
                f"note: --num-cpus {num_cpus} ignored: connecting to the running cluster at RAY_ADDRESS={address},"
                " whose resources were set by `ray start`",
                flush=True,
            )
        ray.init()
        return
    if not listen_all:
        bind_ray_to_loopback()
    # address "local": a Ray of this run's own, never another local cluster that ``ray.init()`` would find
    context = ray.init(
        address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host=LOOPBACK
    )
    if dashboard:
        print(f"Ray dashboard: http://{context.dashboard_url}", flush=True)


def bind_ray_to_loopback() -> None:
    """Make the next local ``ray.init`` use 127.0.0.1 as the node's address, so that its processes (GCS, raylet,
    object manager, workers, dashboard and runtime-env agents) listen on loopback only.

    Ray replaces a loopback node address by the host's own unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is off
    (ray/_private/services.py ``get_node_ip_address``), and then binds its servers to the node address. The
    variable is read when ray is imported: it is set for the processes Ray starts and patched in this one.
    """
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


# File systems whose paths every node sees the same (network and cluster file systems, FUSE mounts of buckets).
SHARED_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "cephfs",
    "glusterfs",
    "fuse.glusterfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.juicefs",
    "fuse.sshfs",
    "fuse.cephfs",
    "9p",
    "afs",
    "panfs",
    "wekafs",
)


class NodeLocalStorageError(ValueError):
    """Results and checkpoints would go to a folder only one node of a multi-node cluster can see."""


def is_uri(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URI Tune syncs to (``s3://``, ``gs://``, ...) rather than a local path."""
    return "://" in str(path)


def filesystem_type(path: str | os.PathLike, mounts: str | None = None) -> str:
    """The file system type of the mount holding ``path`` (its nearest existing parent), from /proc/mounts."""
    target = Path(path).resolve()
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "unknown"
    best, kind = "", "unknown"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == Path(point) or Path(point) in target.parents
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def check_storage(storage_path: str, *, shared: bool = False, mounts: str | None = None) -> None:
    """Refuse (``NodeLocalStorageError``) a node-local results folder on a cluster of more than one node.

    Trials run on any node and write their results and checkpoints to ``storage_path``, which is then read on
    the head node (``--resume``, the printed checkpoint): it must be a URI Tune supports or a folder every node
    sees, i.e. on a network or cluster file system (``SHARED_FILESYSTEMS``) or declared shared (``shared``).
    """
    if is_uri(storage_path) or shared or not ray.is_initialized():
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return
    kind = filesystem_type(storage_path, mounts)
    if kind in SHARED_FILESYSTEMS:
        return
    raise NodeLocalStorageError(
        f"--storage-path {storage_path}: on a {kind!r} file system, local to this node, but the Ray cluster has"
        f" {len(nodes)} nodes and a trial on another node cannot write its results and checkpoints there. Use a"
        " URI Tune supports (s3://bucket/path, gs://bucket/path, ...), a folder on a file system every node"
        " mounts at the same path (NFS, Lustre, ...), or --shared-storage if this folder is such a mount"
    )


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
    shared_storage: bool = False,
    listen_all: bool = False,
    plateau_patience: int | None = None,
    keep_checkpoints: int | None = KEEP_CHECKPOINTS,
    keep_best_by: str | None = None,
) -> tune.ResultGrid:
    """Train ``config`` under Tune until ``stop``; returns the ResultGrid and prints where results went.

    ``restore`` starts from an Algorithm checkpoint's weights and state; ``resume`` continues an interrupted
    experiment directory where it stopped. ``max_failures`` (Tune's ``FailureConfig``): a trial that raises is
    restarted from its last checkpoint up to that many times (0, the default: not restarted; -1: always), so set
    ``checkpoint_freq`` too or the restart begins from scratch. ``storage_path`` is a folder or a URI Tune
    supports (``s3://``, ``gs://``, ...); on a cluster of several nodes a node-local folder is refused
    (``check_storage``; ``shared_storage`` declares it a shared mount). ``listen_all``: a Ray started here listens
    on every interface instead of loopback only. ``plateau_patience`` N: also stop a trial whose success has not
    risen for N iterations (``StopRule``); the reason a trial stopped is printed. ``keep_checkpoints`` N: only
    the N most recent checkpoints stay (None: all), and the best by ``keep_best_by`` (default: the success
    metric) is kept as ``best_checkpoint`` in the trial folder (``KeepBestCheckpoint``).
    """
    if keep_checkpoints is not None and (not isinstance(keep_checkpoints, int) or keep_checkpoints < 1):
        raise ValueError(f"keep_checkpoints: None or an integer >= 1, got {keep_checkpoints!r}")
    init_ray(num_cpus=num_cpus, dashboard=dashboard, listen_all=listen_all)
    if dashboard:
        config = with_ray_metrics(config)
    stop = dict(stop or {})
    stop_rule = StopRule(stop, plateau_patience=plateau_patience)
    storage_path = storage_path or Path.cwd() / "results"
    storage_path = str(storage_path) if is_uri(storage_path) else str(Path(storage_path).resolve())
    check_storage(storage_path, shared=shared_storage)
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
        callbacks=[ProgressPrinter(stop, stop_rule), KeepBestCheckpoint(keep_best_by)],
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=checkpoint_freq,
            checkpoint_at_end=checkpoint_at_end,
            num_to_keep=keep_checkpoints,
        ),
        failure_config=tune.FailureConfig(max_failures=max_failures),
    )
    if resume is not None:
        resume = str(resume) if is_uri(resume) else str(Path(resume).resolve())
        tuner = tune.Tuner.restore(resume, trainable=config.algo_class, resume_errored=True)
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


def example_main(
    doc: str,
    *,
    paper_config: Callable[..., AlgorithmConfig],
    cpu_config: Callable[..., AlgorithmConfig],
    cpu_iterations: int,
    name: str,
    paper_iterations: int = 150,
) -> None:
    """``python tuned_examples/<file>.py``: the paper's set-up with ``--model`` (default ``$GAGPO_MODEL``), the
    CPU default without, trained for ``--iterations`` with checkpoints every ``--checkpoint-freq``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--model",
        default=os.environ.get("GAGPO_MODEL"),
        help="model folder (default $GAGPO_MODEL; none: CPU default)",
    )
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default $GAGPO_GPUS or 0)")
    parser.add_argument("--iterations", type=int, default=None, help="iteration budget")
    parser.add_argument("--storage", default="results", help="folder for results and checkpoints")
    parser.add_argument("--checkpoint-freq", type=int, default=10, help="checkpoint every N iterations")
    args = parser.parse_args()
    config = paper_config(args.model, num_gpus=args.gpus) if args.model else cpu_config()
    iterations = args.iterations or (paper_iterations if args.model else cpu_iterations)
    train(
        config,
        stop={"training_iteration": iterations},
        storage_path=args.storage,
        name=name,
        checkpoint_freq=args.checkpoint_freq,
    )
