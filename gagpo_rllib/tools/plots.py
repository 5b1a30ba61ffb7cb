"""Learning-curve figures from Tune run folders (their progress.csv), several runs on one figure."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["DEFAULT_PANELS", "load_progress", "find_column", "plot_runs"]

# Panel title -> metric-name suffixes tried in order (first column whose name ends with one of them).
DEFAULT_PANELS: dict[str, tuple[str, ...]] = {
    "success rate": ("success_rate",),
    "task score": ("task_score_mean", "score_mean"),
    "episode length": ("episode_len_mean",),
    "KL to reference": ("/kl", "kl_mean", "mean_kl"),
    "singleton state share": ("singleton_share",),
    "state-group size": ("state_group_size_mean",),
}


def load_progress(run_dir: str | os.PathLike) -> dict[str, list[float]]:
    """Numeric columns of a run's progress.csv (found anywhere under ``run_dir``)."""
    run_dir = Path(run_dir)
    files = [run_dir] if run_dir.is_file() else sorted(run_dir.rglob("progress.csv"))
    if not files:
        raise FileNotFoundError(f"no progress.csv under {run_dir}")
    columns: dict[str, list[float]] = {}
    with open(files[0], newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{files[0]} has no rows")
    for name in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[name]))
            except (TypeError, ValueError):
                values.append(math.nan)
        if not all(math.isnan(v) for v in values):
            columns[name] = values
    return columns


def find_column(columns: dict[str, list[float]], suffixes: Sequence[str]) -> str | None:
    """The first column whose name ends with one of ``suffixes``, env-runner and learner metrics first."""
    for suffix in suffixes:
        for name in sorted(columns, key=lambda n: (not n.startswith(("env_runners", "learners")), n)):
            if name.endswith(suffix):
                return name
    return None


def plot_runs(
    runs: dict[str, str | os.PathLike],
    out_path: str | os.PathLike,
    panels: dict[str, tuple[str, ...]] | None = None,
) -> Path:
    """Draw every panel that at least one run has, each run a line vs training iteration; write a PNG."""
    panels = panels or DEFAULT_PANELS
    data = {label: load_progress(path) for label, path in runs.items()}
    present = [
        (title, suffixes)
        for title, suffixes in panels.items()
        if any(find_column(cols, suffixes) for cols in data.values())
    ]
    if not present:
        raise ValueError(f"none of the metrics {list(panels)} appears in the runs {list(runs)}")
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax, (title, suffixes) in zip(axes.flat, present, strict=False):
        for label, cols in data.items():
            column = find_column(cols, suffixes)
            if column is None:
                continue
            x = cols.get("training_iteration", list(range(1, len(cols[column]) + 1)))
            ax.plot(x, cols[column], label=label)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
