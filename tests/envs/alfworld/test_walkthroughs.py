"""Every bundled game is won by replaying its stored walkthrough (a sample here; all of them under -m slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.tasks import TASK_TYPES

SPLITS = ("train", "valid_unseen")


def _games(split: str) -> list[str]:
    return [g.game_file for g in find_games(BUNDLED_DATA, split).games]


def _sample(split: str, per_type: int = 1) -> list[str]:
    picked = []
    games = find_games(BUNDLED_DATA, split).games
    for task_type in TASK_TYPES:
        picked += [g.game_file for g in games if g.task_type == task_type][:per_type]
    return picked


def _replay(env, game_file: str) -> None:
    walkthrough = json.loads(Path(game_file).read_text())["walkthrough"]
    obs, info = env.reset(options={"game_file": game_file})
    assert "Your task is to:" in obs
    for i, command in enumerate(walkthrough):
        assert command in info["admissible_commands"], (game_file, i, command)
        obs, reward, terminated, truncated, info = env.step(command)
        assert obs != "Nothing happens.", (game_file, command)
        last = i == len(walkthrough) - 1
        assert terminated == last and info["won"] == last, (game_file, i)
        assert not truncated
    assert reward == 10.0


@pytest.fixture(scope="module")
def envs():
    from envs.alfworld.env import AlfworldEnv

    return {split: AlfworldEnv({"split": split}) for split in SPLITS}


def test_bundle_has_the_promised_size_and_types():
    train, evaluation = find_games(BUNDLED_DATA, "train"), find_games(BUNDLED_DATA, "valid_unseen")
    assert len(train.games) >= 120 and len(evaluation.games) >= 36
    for game_set in (train, evaluation):
        assert {g.task_type for g in game_set.games} == set(TASK_TYPES)
        assert game_set.skipped == {}
    scenes = {
        split: {g.traj_data["scene"]["scene_num"] for g in s.games}
        for split, s in (("train", train), ("valid_unseen", evaluation))
    }
    assert not scenes["train"] & scenes["valid_unseen"]


@pytest.mark.parametrize("game_file", [g for s in SPLITS for g in _sample(s)], ids=lambda p: p.split("/")[-3])
def test_walkthrough_wins_sample(envs, game_file):
    split = "train" if "/train/" in game_file else "valid_unseen"
    _replay(envs[split], game_file)


@pytest.mark.slow
@pytest.mark.parametrize("split", SPLITS)
def test_walkthrough_wins_every_bundled_game(envs, split):
    for game_file in _games(split):
        _replay(envs[split], game_file)
