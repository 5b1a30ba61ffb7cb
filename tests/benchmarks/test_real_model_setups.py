"""The set-up comparison's arithmetic: what an iteration's row reads from a result, and the page's per-unit costs."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import benchmarks.real_model_setups as rms


def _result(*, skipped: bool, sync_s: float = 0.5) -> dict:
    return {
        "gagpo": {
            "time_sampling_s": 30.0,
            "time_learner_s": 100.5 if not skipped else 0.01,
            "weight_sync_s": sync_s,  # a skipped update reports the last sync's value again
            "update_skipped": float(skipped),
            "num_episodes": 8.0,
            "episode_len_mean": 12.5,
            "success_rate": 0.25,
        },
        "learners": {"gagpo": {"num_steps_trained": 100.0}},
    }


def test_iteration_row_splits_update_and_sync_and_counts_nothing_for_a_skipped_update() -> None:
    row = rms.iteration_row(2, 140.0, _result(skipped=False), 12.345)
    assert (row["sampling_s"], row["update_s"], row["sync_s"]) == (30.0, 100.0, 0.5)
    assert (row["played_steps"], row["trained_rows"], row["episodes"]) == (100, 100, 8)
    assert row["driver_peak_gib"] == 12.35
    skipped = rms.iteration_row(3, 31.0, _result(skipped=True), 10.0)
    assert (skipped["trained_rows"], skipped["sync_s"], skipped["update_s"]) == (0, 0.0, 0.01)


def _write(path, rows) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rms.COLUMNS)
        w.writeheader()
        w.writerows(rows)


def _iteration(i, seconds, sampling, update, sync, steps, rows, peak=10.0) -> dict:
    return dict(
        iteration=i, seconds=seconds, sampling_s=sampling, update_s=update, sync_s=sync, played_steps=steps,
        trained_rows=rows, episodes=8, success=0.5, driver_peak_gib=peak,
    )  # fmt: skip


def test_costs_leave_out_the_first_iteration_and_the_page_sets_each_setup_beside_the_recipe(tmp_path) -> None:
    recipe = [
        _iteration(1, 999, 500, 499, 1.0, 100, 100, peak=14.0),  # first-call costs: not in the means
        _iteration(2, 140, 30, 100, 1.0, 100, 100),
        _iteration(3, 40, 40, 0.0, 0.0, 200, 0),  # nothing trained: its sampling counts, its rows do not
    ]
    lora = [_iteration(1, 999, 500, 499, 1.0, 100, 100), _iteration(2, 100, 35, 50, 0.1, 100, 100)]
    _write(rms.csv_path(tmp_path, "alfworld", "vllm-full"), recipe)
    _write(rms.csv_path(tmp_path, "alfworld", "vllm-lora16"), lora)
    c = rms.costs(rms.read_setups(tmp_path, "alfworld")["vllm-full"])
    assert c["iterations"] == 2 and math.isclose(c["sampling_s_per_step"], 70 / 300)
    assert math.isclose(c["update_s_per_row"], 1.0) and c["sync_s"] == 1.0
    assert (c["seconds_per_iteration"], c["driver_peak_gib"]) == (90.0, 14.0)
    page = rms.render(tmp_path)
    assert "| vllm-full | 2 | 0.233 | 1.00 | 1.000 | 1.00 | 1.00 | 90.0 | 14.0 |" in page
    assert "| vllm-lora16 | 1 | 0.350 | 1.50 | 0.500 | 0.50 | 0.10 | 100.0 | 10.0 |" in page
    assert (tmp_path / "README.md").read_text() == page and "## webshop" not in page


def test_several_setups_go_to_fresh_processes(monkeypatch, tmp_path) -> None:
    calls = []
    for name in ("VLLM_CPU_KVCACHE_SPACE", "ALFWORLD_DATA"):
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setattr(
        rms.subprocess, "run", lambda argv, check: calls.append(argv) or SimpleNamespace(returncode=0)
    )
    argv = ["--setups", "hf-full", "vllm-lora16", "--iterations", "3", "--seed", "2", "--out", str(tmp_path)]
    assert rms.main(argv) == 0
    children = [rms.parse_args(c[2:]) for c in calls]
    assert [c.setups for c in children] == [["hf-full"], ["vllm-lora16"]]
    assert all(c.iterations == 3 and c.seed == 2 and c.env == "alfworld" for c in children)
