"""The generator: valid goals and placements, solvable games with winning walkthroughs, reproducible output."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from envs.alfworld.env import AlfworldEnv
from envs.alfworld.games import BUNDLED_DATA
from envs.alfworld.generate import LAMP_SURFACES, generate_split, more_train_games, sample_game, split_scenes
from envs.alfworld.scenes import load_scene
from envs.alfworld.tasks import TASK_TYPES

SMALL_KITCHEN = 14
SMALL_BEDROOM = 302


@pytest.mark.parametrize("seed", range(5))
def test_targets_start_away_from_goal_and_appliance(seed):
    scene = load_scene(SMALL_KITCHEN)
    kinds = {r.id: r.type for r in scene.receptacles}
    for task_type, appliance in (
        ("pick_heat_then_place_in_recep", "Microwave"),
        ("pick_cool_then_place_in_recep", "Fridge"),
        ("pick_clean_then_place_in_recep", "SinkBasin"),
    ):
        game = sample_game(scene, task_type, random.Random(seed))
        assert game is not None and game.task.recep != appliance
        targets = [o for o in game.objects if o.type == game.task.obj]
        assert targets and all(kinds[o.receptacle] not in (appliance, game.task.recep) for o in targets)


def test_pick_two_has_two_targets_and_look_has_a_lamp_on_a_surface():
    two = sample_game(load_scene(SMALL_KITCHEN), "pick_two_obj_and_place", random.Random(0))
    assert sum(o.type == two.task.obj for o in two.objects) >= 2
    look = sample_game(load_scene(SMALL_BEDROOM), "look_at_obj_in_light", random.Random(0))
    kinds = {r.id: r.type for r in look.scene.receptacles}
    lamps = [o for o in look.objects if o.type == look.task.toggle]
    assert lamps and all(kinds[o.receptacle] in LAMP_SURFACES for o in lamps)
    assert sample_game(load_scene(SMALL_BEDROOM), "pick_heat_then_place_in_recep", random.Random(0)) is None


def test_scene_split_is_disjoint_and_covers_all_rooms():
    scenes = split_scenes(seed=0, max_receptacles=20)
    assert not set(scenes["train"]) & set(scenes["valid_unseen"])
    for split in scenes.values():
        rooms = {load_scene(n).room for n in split}
        assert rooms == {"Kitchen", "LivingRoom", "Bedroom", "Bathroom"}
        assert all(len(load_scene(n).receptacles) <= 20 for n in split)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generated_games_replay_and_are_reproducible(tmp_path):
    types = ["pick_cool_then_place_in_recep", "look_at_obj_in_light"]
    scenes = [SMALL_KITCHEN, SMALL_BEDROOM]
    counts = generate_split(tmp_path / "a" / "train", scenes, per_type=1, seed=5, task_types=types)
    assert counts == dict.fromkeys(types, 1)
    generate_split(tmp_path / "b" / "train", scenes, per_type=1, seed=5, task_types=types)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")

    env = AlfworldEnv({"data_dir": str(tmp_path / "a")})
    assert sorted(g.task_type for g in env.games) == sorted(types)
    for task_id in range(env.num_tasks):
        _, info = env.reset(options={"task_id": task_id})
        walkthrough = json.loads(Path(info["game_file"]).read_text())["walkthrough"]
        for command in walkthrough:
            *_, terminated, _, info = env.step(command)
        assert terminated and info["won"]
        assert info["task_type"] in TASK_TYPES


def test_more_train_games_continue_the_bundled_ones_on_train_scenes_only(tmp_path):
    """The bundled games were written by the same seed and scene split: more games of a type start with them
    (same folders, same files), and no game is set in a scene whose games are held out."""
    task_type = "pick_and_place_simple"
    assert more_train_games(tmp_path, 3, [task_type]) == {task_type: 3}
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.glob(f"train/{task_type}-*/trial_*"))
    bundled = {p.relative_to(BUNDLED_DATA) for p in BUNDLED_DATA.glob(f"train/{task_type}-*/trial_*")}
    assert len(made) == 3 and set(made) <= bundled
    for trial in made:
        for name in ("game.tw-pddl", "traj_data.json"):
            assert (tmp_path / trial / name).read_text() == (BUNDLED_DATA / trial / name).read_text()
    held_out = {int(p.name.rsplit("-", 1)[1]) for p in (BUNDLED_DATA / "valid_unseen").iterdir()}
    assert not {int(t.parent.name.rsplit("-", 1)[1]) for t in made} & held_out
