"""The real-model benchmark's run summary: what its page reads from a run's CSV."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import benchmarks.real_model_learning as rml
from gagpo_rllib.tools.real_model import ALFWORLD, WEBSHOP


def _row(phase: str, iteration: int, elapsed: float, **values) -> dict:
    return {"phase": phase, "iteration": str(iteration), "elapsed_s": str(elapsed), **values}


def test_summary_reads_start_end_and_grouping_means() -> None:
    rows = [
        _row(rml.WARM, 0, 60.0, seconds="60.0"),
        _row(rml.BEFORE, 0, 90.0, success="0.25", score="0.5"),
        _row(rml.TRAIN, 1, 120.0, episodes="8", singleton_share="0.2", adv_zero_share="0.4"),
        _row(rml.TRAIN, 2, 130.0, episodes="0", singleton_share="nan", adv_zero_share=""),  # nothing played
        _row(rml.TRAIN, 3, 150.0, singleton_share="0.6", adv_zero_share="0.8"),
        # Played, but every rollout got the same return: no learner step, no ratio.
        _row(rml.TRAIN, 4, 160.0, episodes="8", first_minibatch_ratio_max_dev=""),
        _row(rml.TRAIN, 5, 170.0, episodes="8", first_minibatch_ratio_max_dev="1e-06"),
        _row(rml.AFTER, 5, 180.0, success="0.5", score="0.75"),
    ]
    s = rml.summary(rows)
    assert (s["before"], s["after"], s["score_before"], s["score_after"]) == (0.25, 0.5, 0.5, 0.75)
    assert (s["iterations"], s["empty_iterations"], s["warm_start_s"], s["wall_s"]) == (5, 1, 60.0, 180.0)
    assert s["stepless_iterations"] == 1
    assert s["finished"]
    assert math.isclose(s["singleton_share"], 0.4) and math.isclose(s["adv_zero_share"], 0.6)


def test_summary_of_a_run_logged_before_the_grouping_columns() -> None:
    rows = [_row(rml.WARM, 0, 60.0, seconds="60.0"), _row(rml.TRAIN, 1, 120.0)]
    s = rml.summary(rows)
    assert math.isnan(s["singleton_share"]) and math.isnan(s["adv_zero_share"])
    assert not s["finished"] and (s["iterations"], s["empty_iterations"]) == (1, 0)


def test_summary_reads_peak_memory_runner_failures_and_restores() -> None:
    rows = [
        _row(rml.TRAIN, 1, 120.0, driver_peak_gib="9.5", runner_failures="0", runners_restored="1"),
        _row(rml.TRAIN, 2, 130.0, driver_peak_gib="16.25", runner_failures="3", runners_restored="2"),
        _row(rml.TRAIN, 3, 150.0, driver_peak_gib="12.0", runner_failures="1", runners_restored="0"),
    ]
    s = rml.summary(rows)
    assert (s["driver_peak_gib"], s["runner_failures"], s["runners_restored"]) == (16.25, 4, 3)
    old = rml.summary([_row(rml.TRAIN, 1, 120.0)])
    assert math.isnan(old["driver_peak_gib"]) and math.isnan(old["runner_failures"])
    assert math.isnan(old["runners_restored"])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_peak_resident_memory_restarts_from_the_current_size() -> None:
    block = bytearray(256 * 2**20)  # touched: resident
    block[::4096] = b"\1" * len(block[::4096])
    del block
    peak_before = rml.rss_gib("VmHWM")
    assert peak_before >= rml.rss_gib() + 0.2
    rml.reset_peak_rss()
    assert rml.rss_gib("VmHWM") < peak_before - 0.2


def test_several_runs_go_to_fresh_processes_with_the_same_settings(monkeypatch, tmp_path) -> None:
    calls = []
    for name in ("VLLM_CPU_KVCACHE_SPACE", "ALFWORLD_DATA"):  # main sets defaults; restored after the test
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setattr(
        rml.subprocess, "run", lambda argv, check: calls.append(argv) or SimpleNamespace(returncode=0)
    )
    argv = ["--env", "webshop", "--seeds", "1", "2", "--estimators", "grpo", "--minutes", "85"]
    argv += ["--iterations", "3", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out")]
    assert rml.main(argv) == 0
    children = [rml.parse_args(c[2:]) for c in calls]
    assert [(c.seeds, c.estimators) for c in children] == [([1], ["grpo"]), ([2], ["grpo"])]
    assert all(c.env == "webshop" and c.minutes == 85 and c.iterations == 3 for c in children)
    assert all(c.work == str(tmp_path / "w") and c.out == str(tmp_path / "out") for c in children)
    assert (tmp_path / "out" / "README.md").exists()


def test_recipe_changes_name_each_differing_field_nested_ones_dotted() -> None:
    then = rml.recipe_record(WEBSHOP)
    now = rml.recipe_record(replace(WEBSHOP, kl_coeff=0.5, warm_start=replace(WEBSHOP.warm_start, epochs=3)))
    assert rml.recipe_changes(then, now) == [
        f"kl_coeff {WEBSHOP.kl_coeff} -> 0.5",
        "warm_start.epochs 1 -> 3",
    ]
    assert rml.recipe_changes(now, now) == []
    assert rml.recipe_changes({"a": 1}, {}) == ["a 1 -> unset"]


def _write_run(out: Path, stem: str, before: float, after: float) -> Path:
    path = out / f"{stem}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rml.COLUMNS)
        w.writeheader()
        w.writerow({"phase": rml.WARM, "iteration": 0, "elapsed_s": 60.0, "seconds": 60.0})
        w.writerow(
            {"phase": rml.BEFORE, "iteration": 0, "elapsed_s": 90.0, "success": before, "score": before}
        )
        w.writerow({"phase": rml.TRAIN, "iteration": 1, "elapsed_s": 120.0, "success": 0.5, "score": 0.5})
        w.writerow({"phase": rml.AFTER, "iteration": 1, "elapsed_s": 150.0, "success": after, "score": after})
    return path


def test_page_tables_runs_by_the_recipe_they_recorded(tmp_path: Path) -> None:
    rml.write_recipe(_write_run(tmp_path, "webshop_gagpo_seed0", 0.25, 0.5), WEBSHOP)
    earlier = replace(WEBSHOP, kl_coeff=WEBSHOP.kl_coeff + 0.5)
    rml.write_recipe(_write_run(tmp_path, "webshop_grpo_seed0", 0.125, 0.75), earlier)
    _write_run(tmp_path, "webshop_grpo_seed1", 0.375, 0.0)  # recorded before runs wrote their recipe
    rml.write_recipe(_write_run(tmp_path, "alfworld_gagpo_seed0", 0.0, 0.25), ALFWORLD)
    page = rml.render(tmp_path)
    webshop = page[page.index("## webshop") :]
    current, rest = webshop.split("Runs of an earlier recipe", 1)
    assert "| GAGPO | 0 | 25.0% | 50.0% | +25.0 |" in current and "GRPO" not in current
    changed, unrecorded = rest.split("Runs of an earlier recipe", 1)
    assert f"kl_coeff {WEBSHOP.kl_coeff + 0.5} -> {WEBSHOP.kl_coeff}" in changed
    assert "| GRPO | 0 | 12.5% | 75.0% | +62.5 |" in changed and "| GRPO | 1 |" not in changed
    assert "its recipe was not recorded" in unrecorded and "| GRPO | 1 | 37.5% | 0.0% | -37.5 |" in unrecorded
    alfworld = page[: page.index("## webshop")]
    assert "| GAGPO | 0 | 0.0% | 25.0% | +25.0 |" in alfworld and "earlier recipe" not in alfworld
    assert (tmp_path / "webshop.png").is_file() and (tmp_path / "alfworld.png").is_file()


def test_runs_in_another_compute_dtype_share_their_recipe_table(tmp_path: Path) -> None:
    """The dtype follows the CPU (bf16 only with bf16 arithmetic): a column, not another recipe. A record written
    before the recipe had a dtype of its own ran in its warm start's."""
    rml.write_recipe(
        _write_run(tmp_path, "webshop_gagpo_seed0", 0.25, 0.5), replace(WEBSHOP, dtype="float32")
    )
    run = _write_run(tmp_path, "webshop_grpo_seed0", 0.125, 0.75)
    rml.write_recipe(run, replace(WEBSHOP, dtype="bfloat16"))
    record = json.loads(run.with_suffix(".recipe.json").read_text())
    assert record["warm_start"]["dtype"] == record["dtype"] == "bfloat16"
    del record["dtype"]
    run.with_suffix(".recipe.json").write_text(json.dumps(record))
    webshop = rml.render(tmp_path).split("## webshop", 1)[1]
    assert "earlier recipe" not in webshop
    rows = {line.split("|")[1].strip(): line for line in webshop.splitlines() if line.startswith("| G")}
    assert rows["GAGPO"].endswith("| float32 |") and rows["GRPO"].endswith("| bfloat16 |")
    other = rml.recipe_record(replace(WEBSHOP, dtype="float32", kl_coeff=0.5))
    assert rml.recipe_changes(
        rml.recipe_identity(other), rml.recipe_identity(rml.recipe_record(WEBSHOP))
    ) == [f"kl_coeff 0.5 -> {WEBSHOP.kl_coeff}"]


def test_a_broken_recipe_record_names_its_file(tmp_path: Path) -> None:
    run = _write_run(tmp_path, "webshop_gagpo_seed0", 0.25, 0.5)
    record = run.with_suffix(".recipe.json")
    record.write_text("{not json")
    with pytest.raises(ValueError, match="webshop_gagpo_seed0.recipe.json: not a recipe record"):
        rml.render(tmp_path)
    record.write_text("[1, 2]")
    with pytest.raises(ValueError, match="webshop_gagpo_seed0.recipe.json: a recipe record is a JSON object"):
        rml.read_recipe(run)
