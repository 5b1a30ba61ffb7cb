"""The loader on a directory in ALFWorld's downloaded layout, with ALFWorld's filtering rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.alfworld.env import AlfworldEnv
from envs.alfworld.games import BUNDLED_DATA, find_games, read_game


def _write(folder: Path, game: dict, traj: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "game.tw-pddl").write_text(json.dumps(game))
    (folder / "traj_data.json").write_text(json.dumps(traj))


@pytest.fixture
def alfworld_data(tmp_path) -> Path:
    """``$ALFWORLD_DATA`` with ``json_2.1.1/valid_seen``: full game files (domain and grammar inside) as downloaded."""
    source = find_games(BUNDLED_DATA, "valid_unseen").games[0]
    full = read_game(source.game_file)  # domain and grammar filled in from the wheel
    traj = {k: v for k, v in source.traj_data.items() if k != "task_desc"}
    split = tmp_path / "json_2.1.1" / "valid_seen"
    name = Path(source.game_file).parent.parent.name
    _write(split / name / "trial_T1", full, traj)
    _write(split / (name + "-movable") / "trial_T2", full, traj)
    _write(split / name.replace("-None-", "-Sliced-") / "trial_T3", full, traj)
    _write(split / name / "trial_T4", {**full, "solvable": False}, traj)
    _write(split / name / "trial_T5", full, {**traj, "task_type": "pick_and_place_with_movable_recep"})
    no_flag = dict(full)
    no_flag.pop("solvable")
    _write(split / name / "trial_T6", no_flag, traj)
    return tmp_path


def test_filters_like_alfworld(alfworld_data):
    game_set = find_games(alfworld_data, "valid_seen")
    assert [Path(g.game_file).parent.name for g in game_set.games] == ["trial_T1"]
    assert game_set.skipped == {
        "movable or sliced": 2,
        "not solvable": 1,
        "unsupported task type": 1,
        "missing solvable flag": 1,
    }


def test_env_plays_a_downloaded_layout_game(alfworld_data):
    env = AlfworldEnv({"data_dir": str(alfworld_data), "split": "valid_seen"})
    assert env.num_tasks == 1
    _, info = env.reset()
    walkthrough = json.loads(Path(info["game_file"]).read_text())["walkthrough"]
    for command in walkthrough:
        obs, reward, terminated, truncated, info = env.step(command)
    assert terminated and reward == 10.0 and info["won"]


def test_missing_split_and_unknown_split_are_named(alfworld_data):
    with pytest.raises(FileNotFoundError, match="train"):
        find_games(alfworld_data, "train")
    with pytest.raises(ValueError, match="'dev'"):
        find_games(alfworld_data, "dev")


def test_compact_game_without_task_text_is_named(tmp_path):
    folder = tmp_path / "g"
    _write(folder, {"pddl_problem": "(define (problem p))", "solvable": True}, {"task_type": "x"})
    with pytest.raises(ValueError, match=re.escape(str(folder / "game.tw-pddl"))):
        read_game(folder / "game.tw-pddl")
