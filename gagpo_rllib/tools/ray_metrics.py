"""Publish each iteration's GAGPO metrics as Ray metrics, so they can be watched live while a run trains.

Tune writes results to files (result.json, progress.csv, TensorBoard events); the Ray dashboard shows none of
them. Ray's own metrics system does reach the dashboard side: every node exports application metrics in
Prometheus format (the targets are listed by the dashboard at ``/api/prometheus/sd``), which Prometheus scrapes
and the dashboard's Metrics tab (with Grafana) plots. ``publish_ray_metrics`` is an RLlib ``on_train_result``
callback that sets one gauge per GAGPO metric: success rate (overall and per task type), return, length,
invalid-action share, the time split and tokens/s, grouping diagnostics, advantage stats, KL, clip fraction,
entropy, grad norm. Ray prefixes the names with ``ray_`` (``ray_gagpo_success_rate``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["PUBLISHED_PREFIXES", "gauge_name", "metric_values", "publish_ray_metrics"]

# Result-dict subtrees that are published (flattened with "/"), and the name prefix each gets.
PUBLISHED_PREFIXES = {
    "gagpo/": "gagpo_",
    "learners/gagpo/": "gagpo_grouping_",
    "learners/default_policy/": "gagpo_learner_",
}
_GAUGES: dict[str, Any] = {}


def gauge_name(prefix: str, key: str) -> str:
    """A Prometheus-safe metric name: ``gagpo_`` + the key with every other character as ``_``."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_")


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def metric_values(result: Mapping[str, Any]) -> dict[str, float]:
    """Gauge name -> value for every finite number under the published subtrees, plus the iteration."""
    values: dict[str, float] = {}
    for name, value in _flatten(result).items():
        for subtree, prefix in PUBLISHED_PREFIXES.items():
            if not name.startswith(subtree):
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                values[gauge_name(prefix, name[len(subtree) :])] = number
    if "training_iteration" in result:
        values["gagpo_training_iteration"] = float(result["training_iteration"])
    return values


def publish_ray_metrics(*, algorithm: Any = None, result: Mapping[str, Any], **kwargs: Any) -> None:
    """RLlib ``on_train_result`` callback: set one Ray gauge per metric, tagged with the experiment's trial."""
    from ray.util.metrics import Gauge

    trial = str(getattr(algorithm, "trial_id", "") or "local") if algorithm is not None else "local"
    for name, value in metric_values(result).items():
        gauge = _GAUGES.get(name)
        if gauge is None:
            gauge = Gauge(name, description=f"GAGPO training metric {name}", tag_keys=("trial",))
            _GAUGES[name] = gauge
        gauge.set(value, tags={"trial": trial})
