"""Learning-curve plots from progress.csv files in Tune's layout."""

from __future__ import annotations

import csv

import pytest

from gagpo_rllib.tools.cli import main
from gagpo_rllib.tools.plots import find_column, load_progress, plot_runs


def write_progress(folder, success):
    folder.mkdir(parents=True)
    with open(folder / "progress.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["training_iteration", "env_runners/success_rate", "learners/default_policy/kl", "note"]
        )
        for i, s in enumerate(success, start=1):
            writer.writerow([i, s, 0.01 * i, "text"])
    return folder


def test_load_progress_keeps_numeric_columns(tmp_path):
    run = write_progress(tmp_path / "exp" / "trial_0", [0.1, 0.5])
    cols = load_progress(tmp_path / "exp")
    assert cols["env_runners/success_rate"] == [0.1, 0.5]
    assert "note" not in cols
    assert find_column(cols, ("success_rate",)) == "env_runners/success_rate"
    assert find_column(cols, ("/kl",)) == "learners/default_policy/kl"
    assert find_column(cols, ("missing",)) is None
    assert load_progress(run / "progress.csv")["training_iteration"] == [1.0, 2.0]


def test_plot_several_runs_on_one_png(tmp_path):
    a = write_progress(tmp_path / "a", [0.1, 0.4, 0.9])
    b = write_progress(tmp_path / "b", [0.2, 0.3, 0.5])
    out = plot_runs({"gagpo": a, "grpo": b}, tmp_path / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5_000


def test_plot_command_and_errors(tmp_path, capsys):
    run = write_progress(tmp_path / "run", [0.0, 1.0])
    assert main(["plot", f"mine={run}", "--out", str(tmp_path / "p.png")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "p.png").exists()
    with pytest.raises(FileNotFoundError, match="no progress.csv"):
        plot_runs({"x": tmp_path / "empty"}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="none of the metrics"):
        plot_runs({"x": run}, tmp_path / "y.png", panels={"reward": ("nonexistent",)})
