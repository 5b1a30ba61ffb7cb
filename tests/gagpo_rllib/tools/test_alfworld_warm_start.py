"""The ALFWorld warm start as a set-up step: folders named up front, filled only when the step runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from envs.alfworld import TASK_TYPES
from gagpo_rllib.tools.alfworld_warm_start import AlfworldWarmStart, split_games
from gagpo_rllib.tools.tiny_policies import TinyPolicy


def test_folders_are_named_without_building_anything(tmp_path: Path) -> None:
    stage = AlfworldWarmStart(tmp_path / "tiny")
    assert stage.model_dir == tmp_path / "tiny_warm_start" and stage.data_dir == tmp_path / "tiny_gagpo_games"
    games = stage.gagpo_games()
    assert len(games) == len(TASK_TYPES) and set(games) <= set(split_games()[1])
    bare = AlfworldWarmStart(tmp_path / "tiny", warm=False)
    assert bare.model_dir == tmp_path / "tiny" and bare.data_dir is None
    assert list(tmp_path.iterdir()) == []


def test_a_config_playing_another_model_skips_the_steps(tmp_path: Path) -> None:
    other = SimpleNamespace(model_path=str(tmp_path / "elsewhere"))
    assert AlfworldWarmStart(tmp_path / "tiny")(config=other) == tmp_path / "elsewhere"
    built: list[Path] = []
    step = TinyPolicy(lambda out, seed: built.append(out) or out, tmp_path / "tiny")
    assert step(config=other) == tmp_path / "elsewhere" and built == []
    assert step(config=SimpleNamespace(model_path=str(tmp_path / "tiny"))) == tmp_path / "tiny"
    assert built == [tmp_path / "tiny"] and list(tmp_path.iterdir()) == []
