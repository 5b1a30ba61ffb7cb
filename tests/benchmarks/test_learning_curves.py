"""Merging and summarising of the learning-curve benchmark: synthetic run CSVs in the script's own format, no
training; every expected number below is worked out by hand from the curves."""

from __future__ import annotations

import csv
import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import benchmarks.learning_curves as lc
from gagpo_rllib.method.stats import Interval, mean_interval

ROOT = Path(__file__).resolve().parents[2]

# success per iteration of each (estimator, seed) run. Shortest run: grpo seed 3 (4 iterations) = the budget.
# Values are multiples of 1/4, so every mean over the 4-iteration budget is exact in floating point.
CURVES: dict[tuple[str, int], list[float]] = {
    ("gagpo", 0): [0.0, 0.25, 0.5, 1.0, 1.0, 1.0],
    ("gagpo", 1): [0.5, 0.5, 1.0, 0.75, 0.0],
    ("gagpo", 2): [0.0, 0.0, 0.25, 0.5, 1.0],
    ("grpo", 1): [0.0, 0.25, 0.25, 0.5, 1.0],
    ("grpo", 2): [0.0, 0.0, 0.0, 0.5, 0.5],
    ("grpo", 3): [1.0, 1.0, 1.0, 1.0],
    ("rloo", 7): [0.5, 0.5, 0.5, 0.5, 0.5],
    ("ppo", 0): [0.25, 0.25, 0.25, 0.5],
}
WINDOW = 2
# Area under the success curve over the first 4 iterations (sum / 4), per run.
AUC = {
    "gagpo": {0: 1.75 / 4, 1: 2.75 / 4, 2: 0.75 / 4},
    "grpo": {1: 1.0 / 4, 2: 0.5 / 4, 3: 1.0},
    "rloo": {7: 0.5},
    "ppo": {0: 1.25 / 4},
}


def run_rows(estimator: str, seed: int, success: list[float], task: str = "maze") -> list[dict]:
    """The rows ``run_one`` writes for one run, with made-up but plausible values in the other columns."""
    return [
        {
            "task": task,
            "estimator": estimator,
            "seed": seed,
            "iteration": it,
            "success_rate": s,
            "episode_len_mean": 10.0,
            "invalid_action_share": 0.0,
            "kl": 0.01,
            "entropy": 0.2,
            "time_generation_s": 1.5,
            "time_learner_s": 2.5,
            "wall_s": 4.0 * (it + 1),
            "num_state_groups": 12.0 if estimator.startswith("gagpo") else "nan",
            "value_loss": 0.3 if estimator == "ppo" else "nan",
        }
        for it, s in enumerate(success)
    ]


def write_run(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=lc.FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def write_runs(out: Path, task: str = "maze") -> Path:
    """Every run of CURVES as ``<out>/<task>/runs/<estimator>_seed<seed>.csv``; returns the runs folder."""
    runs = out / task / "runs"
    for (est, seed), success in CURVES.items():
        write_run(runs / f"{est}_seed{seed}.csv", run_rows(est, seed, success, task))
    return runs


def assert_same_interval(got: Interval | None, expected: Interval) -> None:
    """Field by field, NaN bounds (a single value) equal to NaN bounds."""
    assert got is not None
    np.testing.assert_equal(dataclasses.astuple(got), dataclasses.astuple(expected))


def all_rows() -> list[dict]:
    return [r for (est, seed), s in CURVES.items() for r in run_rows(est, seed, s)]


@pytest.mark.parametrize(
    ("success", "level", "window", "expected"),
    [
        # rolling means over 3: 1/3, 2/3, 1 -> the window ending at iteration 4 is the first >= 0.5
        ([0.0, 0.0, 1.0, 1.0, 1.0], 0.5, 3, 4),
        # only the last window (iterations 4-5) reaches 1.0: the count is the run's length
        ([0.0, 0.0, 0.0, 1.0, 1.0], 1.0, 2, 5),
        # exactly at the level counts as reached, already at the first full window
        ([0.5, 0.5, 0.0], 0.5, 2, 2),
        # window 1: the raw curve
        ([0.0, 0.25, 0.8, 0.0], 0.8, 1, 3),
        # a single iteration at the level is not enough when its window's mean stays below
        ([0.0, 1.0, 0.0, 0.0, 0.4], 0.5, 3, None),
        ([0.4] * 10, 0.5, 5, None),
        # shorter than the window: no full window, never reached (even at success 1)
        ([1.0, 1.0], 0.5, 3, None),
    ],
)
def test_first_reaching(success: list[float], level: float, window: int, expected: int | None) -> None:
    """The 1-based iteration at the end of the first window whose mean reaches the level, None if none does."""
    assert lc.first_reaching(np.array(success), level, window) == expected


def test_curves_of_orders_iterations_and_splits_runs() -> None:
    """Rows in any order come back per estimator and seed, as success in iteration order."""
    rows = all_rows()[::-1]
    curves = lc.curves_of(rows)
    assert {(est, seed) for est, per_seed in curves.items() for seed in per_seed} == set(CURVES)
    for (est, seed), success in CURVES.items():
        np.testing.assert_array_equal(curves[est][seed], success)


@pytest.mark.parametrize(
    "iterations",
    [[0, 2, 3], [0, 1, 1, 2], [1, 2, 3]],
    ids=["missing", "repeated", "not-from-zero"],
)
def test_curves_of_rejects_a_gap_or_a_repeat_naming_the_run(iterations: list[int]) -> None:
    """A run whose iterations are not 0..n-1 exactly once each would misalign the budget: it must raise."""
    bad = [dict(r, iteration=it) for r, it in zip(run_rows("grpo", 3, [0.5] * 4), iterations, strict=False)]
    rows = run_rows("gagpo", 0, [0.5] * 4) + bad
    with pytest.raises(ValueError, match=r"run grpo seed 3:"):
        lc.curves_of(rows)


def test_summarise_over_the_shortest_budget_with_paired_gaps() -> None:
    """Budget = shortest run; AUC per seed = mean success over the budget; GAGPO - X pairs the shared seeds only."""
    summary, budget = lc.summarise(all_rows(), WINDOW)
    assert budget == 4
    assert set(summary) == set(AUC)
    for est, auc in AUC.items():
        assert summary[est]["seeds"] == sorted(auc)
        assert summary[est]["auc"] == auc
        assert_same_interval(summary[est]["auc_interval"], mean_interval(list(auc.values())))
    assert summary["gagpo"]["auc_interval"].mean == pytest.approx((1.75 + 2.75 + 0.75) / 12)

    assert summary["gagpo"]["gap"] is None
    # grpo shares seeds 1 and 2 with gagpo (seed 3 is grpo's only): 2.75/4 - 1/4 and 0.75/4 - 0.5/4
    grpo = summary["grpo"]
    assert grpo["gap_seeds"] == [1, 2]
    assert grpo["gap"] == mean_interval([0.4375, 0.0625])
    assert grpo["gap"].mean == 0.25 and grpo["gap"].n == 2
    # two values: the resampled means are low, mid, high with p 1/4, 1/2, 1/4, so the 95% interval is [low, high]
    assert (grpo["gap"].low, grpo["gap"].high) == (0.0625, 0.4375)
    assert summary["ppo"]["gap_seeds"] == [0]
    assert_same_interval(summary["ppo"]["gap"], mean_interval([1.75 / 4 - 1.25 / 4]))
    assert summary["rloo"]["gap"] is None  # seed 7 is not a gagpo seed: nothing to pair

    # thresholds within the budget only: gagpo seed 0 reaches 80% at iteration 5, one past the budget
    assert summary["gagpo"]["to50"] == {0: 4, 1: 2, 2: None}
    assert summary["gagpo"]["to80"] == {0: None, 1: 4, 2: None}
    assert summary["grpo"]["to80"] == {1: None, 2: None, 3: 2}
    # final: mean over seeds of the last WINDOW iterations of the budget
    assert summary["gagpo"]["final"] == pytest.approx((0.75 + 0.875 + 0.375) / 3)
    assert summary["grpo"]["final"] == pytest.approx((0.375 + 0.25 + 1.0) / 3)


def test_summarise_intervals_are_the_seeded_bootstrap() -> None:
    """With many seeds the bootstrap bounds depend on the resampling seed: they must be mean_interval's (seed 0),
    the same on every call, so a table recomputed from the same CSVs is the same table."""
    rng = np.random.default_rng(3)
    rows = [r for seed in range(9) for r in run_rows("gagpo", seed, list(rng.uniform(size=6)))]
    rows += [r for seed in range(2, 11) for r in run_rows("grpo", seed, list(rng.uniform(size=6)))]
    first, budget = lc.summarise(rows, WINDOW)
    second, _ = lc.summarise(rows[::-1], WINDOW)
    assert budget == 6
    auc = {est: [first[est]["auc"][s] for s in first[est]["seeds"]] for est in ("gagpo", "grpo")}
    gap = [first["gagpo"]["auc"][s] - first["grpo"]["auc"][s] for s in range(2, 9)]
    for est in ("gagpo", "grpo"):
        assert_same_interval(first[est]["auc_interval"], mean_interval(auc[est]))
        assert_same_interval(second[est]["auc_interval"], mean_interval(auc[est]))
        assert first[est]["auc_interval"] != mean_interval(auc[est], seed=1)  # the check can tell seeds apart
    assert first["grpo"]["gap_seeds"] == list(range(2, 9))
    assert_same_interval(first["grpo"]["gap"], mean_interval(gap))
    assert_same_interval(second["grpo"]["gap"], mean_interval(gap))
    assert first["grpo"]["gap"] != mean_interval(gap, seed=1)


def from_csv(out: Path, task: str = "maze", window: int = WINDOW) -> None:
    lc.main(["--task", task, "--out", str(out), "--window", str(window), "--from-csv"])


def expected_rows() -> list[str]:
    """The Markdown rows of CURVES, in the estimators' order (gagpo, grpo, rloo, ppo), worked out by hand."""

    def ci(values: list[float]) -> str:
        return mean_interval(values).format()

    g, r = AUC["gagpo"], AUC["grpo"]
    return [
        f"| gagpo | 3 | {ci(list(g.values()))} | - | 4, 2, - (2/3) | -, 4, - (1/3) | 0.67 |",
        f"| grpo | 3 | {ci(list(r.values()))} | {ci([0.4375, 0.0625])} (2 seeds) | -, -, 2 (1/3) "
        "| -, -, 2 (1/3) | 0.54 |",
        "| rloo | 1 | 0.500 (n=1) | - | 2 (1/1) | - (0/1) | 0.50 |",
        "| ppo | 1 | 0.312 (n=1) | 0.125 (n=1) (1 seeds) | - (0/1) | - (0/1) | 0.38 |",
    ]


def test_from_csv_merges_the_runs_into_csv_md_png(tmp_path: Path) -> None:
    """--from-csv alone reads every run CSV of the task and writes the merged CSV, the table and the plot."""
    write_runs(tmp_path)
    from_csv(tmp_path)
    out = tmp_path / "maze"

    md = (out / "learning_curves.md").read_text()
    assert md.startswith(
        "Built-in maze, merged from 8 CSV file(s), a budget of 4 x 64 sampled episodes (4 iterations "
    )
    assert f"thresholds on a {WINDOW}-iteration rolling mean" in md
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| estimator")]
    assert table[1:] == expected_rows()  # table[0] is the separator

    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with (out / "learning_curves.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == lc.FIELDS
        merged = list(reader)
    rank = {"gagpo": 0, "grpo": 1, "rloo": 2, "ppo": 3}
    expected = sorted(CURVES, key=lambda run: (rank[run[0]], run[1]))
    keys = [(r["estimator"], int(r["seed"]), int(r["iteration"])) for r in merged]
    assert keys == [(est, seed, it) for est, seed in expected for it in range(len(CURVES[(est, seed)]))]
    assert [float(r["success_rate"]) for r in merged] == [s for run in expected for s in CURVES[run]]


def test_from_csv_is_reproducible(tmp_path: Path) -> None:
    """The same run CSVs give byte-identical tables and merged CSVs, also when merged again in place."""
    write_runs(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    from_csv(tmp_path / "a")
    md = (tmp_path / "a" / "maze" / "learning_curves.md").read_bytes()
    merged = (tmp_path / "a" / "maze" / "learning_curves.csv").read_bytes()
    from_csv(tmp_path / "a")
    from_csv(tmp_path / "b")
    for out in (tmp_path / "a", tmp_path / "b"):
        assert (out / "maze" / "learning_curves.md").read_bytes() == md
        assert (out / "maze" / "learning_curves.csv").read_bytes() == merged


def test_from_csv_ignores_unfinished_runs(tmp_path: Path) -> None:
    """A ``.csv.partial`` (a run still training or interrupted) is not a finished run: it must not count."""
    runs = write_runs(tmp_path)
    # a shorter unfinished gigpo run (would cut the budget to 2 and add a row) and a partial rerun of a present
    # run (would be a run in two files)
    write_run(runs / "gigpo_seed0.csv.partial", run_rows("gigpo", 0, [1.0, 1.0]))
    write_run(runs / "gagpo_seed0.csv.partial", run_rows("gagpo", 0, [1.0]))
    from_csv(tmp_path)
    md = (tmp_path / "maze" / "learning_curves.md").read_text()
    assert md.startswith(
        "Built-in maze, merged from 8 CSV file(s), a budget of 4 x 64 sampled episodes (4 iterations "
    )
    assert "| gigpo |" not in md
    assert [line for line in md.splitlines() if line.startswith("| gagpo |")] == expected_rows()[:1]
    merged = (tmp_path / "maze" / "learning_curves.csv").read_text()
    assert ",gigpo," not in merged


def test_from_csv_without_runs_is_an_error(tmp_path: Path) -> None:
    """No finished run (only a partial one): a usage error, not an empty table."""
    write_run(tmp_path / "maze" / "runs" / "gagpo_seed0.csv.partial", run_rows("gagpo", 0, [1.0]))
    with pytest.raises(SystemExit):
        from_csv(tmp_path)
    assert not (tmp_path / "maze" / "learning_curves.md").exists()


def test_from_csv_reads_runs_written_before_the_task_column(tmp_path: Path) -> None:
    """Older run CSVs lack task, num_state_groups and value_loss: they are the maze's, with NaN for the rest."""
    old_fields = [f for f in lc.FIELDS if f not in ("task", "num_state_groups", "value_loss")]
    path = tmp_path / "maze" / "runs" / "gagpo_seed1.csv"
    path.parent.mkdir(parents=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(run_rows("gagpo", 1, CURVES[("gagpo", 1)]))
    from_csv(tmp_path)
    md = (tmp_path / "maze" / "learning_curves.md").read_text()
    assert "| gagpo | 1 | 0.550 (n=1) | - | 2 (1/1) | 4 (1/1) | 0.38 |" in md  # budget 5: 2.75 / 5
    with (tmp_path / "maze" / "learning_curves.csv").open() as f:
        merged = list(csv.DictReader(f))
    assert {r["task"] for r in merged} == {"maze"}
    assert {r["num_state_groups"] for r in merged} == {"nan"}


@pytest.mark.parametrize("task", list(lc.TASKS))
def test_committed_runs_reproduce_the_committed_table(task: str, tmp_path: Path) -> None:
    """The committed table of a task is exactly what --from-csv makes of its committed run CSVs."""
    results = ROOT / "benchmarks" / "results" / task
    committed_runs = sorted((results / "runs").glob("*.csv"))
    committed_md = results / "learning_curves.md"
    if not committed_runs or not committed_md.exists():
        pytest.skip(f"no committed run CSVs and table under {results.relative_to(ROOT)}")
    expected = committed_md.read_text()
    window = re.search(r"thresholds on a (\d+)-iteration rolling mean", expected)
    assert window is not None, f"{committed_md} does not say its rolling window"
    runs = tmp_path / task / "runs"
    runs.mkdir(parents=True)
    for path in committed_runs:
        shutil.copy(path, runs / path.name)
    from_csv(tmp_path, task, int(window.group(1)))
    assert (tmp_path / task / "learning_curves.md").read_text() == expected


def test_missing_runs_are_the_protocol_seeds_without_a_finished_csv(tmp_path: Path) -> None:
    """Every estimator on the maze (the ablations only on the hard task), 8 seeds; a .partial is not finished."""
    runs = write_runs(tmp_path)
    write_run(runs / "gagpo_seed3.csv.partial", run_rows("gagpo", 3, [1.0]))
    rest = [4, 5, 6, 7]
    assert lc.missing_runs(runs, "maze") == {
        "gagpo": [3, *rest],
        "gigpo": list(range(8)),
        "grpo": [0, *rest],
        "rloo": list(range(7)),
        "ppo": [1, 2, 3, *rest],
        "gagpo-ds": list(range(8)),
        "grpo-ds": list(range(8)),
    }
    hard = lc.missing_runs(write_runs(tmp_path, "hard"), "hard")
    assert list(hard) == [*lc.ESTIMATORS, *lc.ABLATIONS] and hard["gagpo-lam0"] == list(range(8))
    assert list(lc.ABLATIONS)[-2:] == list(lc.DYNAMIC)  # the dynamic-sampling rows come last on both tasks


def test_missing_report_gives_one_command_per_seed_and_the_hours_left(tmp_path: Path) -> None:
    runs = tmp_path / "maze" / "runs"
    rows = run_rows("gagpo", 0, [0.5, 1.0])
    rows[-1]["wall_s"] = 7200.0  # a run's wall time is its last row's
    write_run(runs / "gagpo_seed0.csv", rows)
    report = lc.missing_report(runs, "maze", 100, num_cpus=2).splitlines()
    assert report[0] == "maze: 1 of 56 protocol runs finished (8 seeds each)"
    prefix = "python benchmarks/learning_curves.py --task maze --iterations 100"
    assert report[1] == f"{prefix} --seeds 0 --estimators gigpo grpo rloo ppo gagpo-ds grpo-ds"
    assert report[2:9] == [
        f"{prefix} --seeds {s} --estimators gagpo gigpo grpo rloo ppo gagpo-ds grpo-ds" for s in range(1, 8)
    ]
    # 55 runs x 2 h (the only finished run's wall time), 2 at once
    assert report[9] == "about 55.0 h at 2 runs in parallel"
    assert len(report) == 10


def test_missing_with_every_run_present_says_so(tmp_path: Path) -> None:
    runs = tmp_path / "maze" / "runs"
    for est in lc.protocol_variants("maze"):
        for seed in lc.PROTOCOL_SEEDS:
            write_run(runs / f"{est}_seed{seed}.csv", run_rows(est, seed, [0.5]))
    assert lc.missing_runs(runs, "maze") == {}
    assert lc.missing_report(runs, "maze", 100, 2) == "maze: 56 of 56 protocol runs finished (8 seeds each)"


def test_episode_curve_reads_success_per_64_sampled_episodes() -> None:
    """A dynamic-sampling run samples more per iteration: its curve is read on the same budget axis."""
    plain = [{"success_rate": s, "episodes_sampled": 64.0 * (i + 1)} for i, s in enumerate([0.1, 0.2, 0.3])]
    assert lc.episode_curve(plain).tolist() == [0.1, 0.2, 0.3]
    # 96, 200, 256 episodes: units 1 (<= 64) and 2 (<= 128) were sampled in iteration 0 and 1, ...
    dynamic = [
        {"success_rate": s, "episodes_sampled": e} for s, e in [(0.1, 96.0), (0.5, 200.0), (0.9, 256.0)]
    ]
    assert lc.episode_curve(dynamic).tolist() == [0.1, 0.5, 0.5, 0.9]
    old = [{"success_rate": 0.4, "episodes_sampled": float("nan")}, {"success_rate": 0.6}]
    assert lc.episode_curve(old).tolist() == [0.4, 0.6]  # runs written before the column: one unit each
