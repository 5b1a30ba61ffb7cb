"""The results pages (``benchmarks/results/<name>/README.md``) are generated: each committed page is exactly what its
script writes from the committed data, so a hand edit or a stale page fails here."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import benchmarks.cpu_learning as cpu
import benchmarks.learning_curves as lc

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("task", list(lc.TASKS))
def test_learning_curves_page_is_what_from_csv_writes(task: str, tmp_path: Path) -> None:
    """--from-csv writes README.md next to the table: the committed page, up to the folder it was written in."""
    committed = RESULTS / task / "README.md"
    runs = sorted((RESULTS / task / "runs").glob("*.csv"))
    if not committed.exists() or not runs:
        pytest.skip(f"no committed page and runs under {committed.parent.relative_to(ROOT)}")
    out = tmp_path / task
    (out / "runs").mkdir(parents=True)
    for path in runs:
        shutil.copy(path, out / "runs" / path.name)
    lc.main(["--task", task, "--from-csv", "--dir", str(out)])
    page = (out / "README.md").read_text()
    assert f" --dir {out}" in page  # the page names the folder it was written from
    page = page.replace(f" --dir {out}", "").replace(
        os.path.relpath(ROOT / "docs" / "learning.md", out), "../../../docs/learning.md"
    )
    assert page == committed.read_text()
    assert (out / "learning_curves.md").read_text() in page


def test_learning_curves_page_names_its_command() -> None:
    """The command in a page re-renders that folder: the default folder needs no --dir, others do."""
    default = RESULTS / "maze"
    assert (
        lc.render_command("maze", default, 5, [])
        == "python benchmarks/learning_curves.py --task maze --from-csv"
    )
    other = lc.render_command("hard", RESULTS / "x", 3, [RESULTS / "x" / "a.csv"])
    assert other == (
        "python benchmarks/learning_curves.py --task hard --from-csv benchmarks/results/x/a.csv "
        "--dir benchmarks/results/x --window 3"
    )


@pytest.mark.parametrize(
    ("env", "files"),
    [
        ("alfworld", ["seed0.json", "seeds1-2.json"]),
        ("webshop", ["seeds0-2.json"]),
    ],
)
def test_cpu_learning_page_is_what_merge_writes(env: str, files: list[str], tmp_path: Path) -> None:
    """--merge with --out writes README.md: the committed page is that of the committed JSON files."""
    name = f"{env}_cpu"
    paths = [f"benchmarks/results/{name}/{f}" for f in files]
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)  # the command in the page names the files as given
        assert cpu.main(["--env", env, "--merge", *paths, "--out", str(tmp_path)]) == 0
    finally:
        os.chdir(cwd)
    page = (tmp_path / "README.md").read_text()
    assert (
        page.replace(f"--out {tmp_path}", f"--out benchmarks/results/{name}")
        == (RESULTS / name / "README.md").read_text()
    )
    rows = sorted(
        (r for f in files for r in json.loads((RESULTS / name / f).read_text())["seeds"]),
        key=lambda r: r["seed"],
    )
    assert cpu.ENVS[env].table(rows) in page
    assert page.startswith("# ")


def test_real_model_learning_page_is_what_render_writes(tmp_path: Path) -> None:
    """--render writes README.md (and a PNG per env with runs) from the run CSVs: the committed page is theirs."""
    import benchmarks.real_model_learning as rml

    name = "real_model_learning"
    for path in [*(RESULTS / name).glob("*.csv"), *(RESULTS / name).glob("*.recipe.json")]:
        shutil.copy(path, tmp_path / path.name)
    assert rml.main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == (RESULTS / name / "README.md").read_text()
    for env, runs in {
        e: [k for k in rml.read_runs(tmp_path) if k.startswith(e + "_")] for e in ("alfworld", "webshop")
    }.items():
        assert (tmp_path / f"{env}.png").is_file() == bool(runs)


def test_real_model_setups_page_is_what_render_writes(tmp_path: Path) -> None:
    import benchmarks.real_model_setups as rms

    name = "real_model_setups"
    csvs = sorted((RESULTS / name).glob("*.csv"))
    assert csvs
    for path in csvs:
        shutil.copy(path, tmp_path / path.name)
    assert rms.main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == (RESULTS / name / "README.md").read_text()
