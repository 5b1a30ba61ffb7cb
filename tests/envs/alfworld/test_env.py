"""AlfworldEnv on bundled games: protocol, invalid commands, step limit, seeds, bad input, engine failures."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from envs.alfworld.env import INVALID_FEEDBACK, AlfworldEnv
from envs.alfworld.games import read_game
from envs.protocol import INFO_KEYS, check_info
from envs.spaces import TextSpace

ALFWORLD_KEYS = ("admissible_commands", "game_file")


@pytest.fixture(scope="module")
def env():
    return AlfworldEnv({"split": "valid_unseen", "seed": 7})


def test_reset_info_and_spaces(env):
    obs, info = env.reset(options={"task_id": 0})
    assert isinstance(env.observation_space, TextSpace) and isinstance(env.action_space, TextSpace)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    check_info(info, (*INFO_KEYS, *ALFWORLD_KEYS))
    assert info["task_id"] == 0 and info["won"] is False
    assert obs.endswith(f"Your task is to: {info['task']}.")
    assert info["state_key"] == obs
    assert "help" in info["admissible_commands"] and "help" not in info["admissible_actions"]
    assert set(info["admissible_actions"]) < set(info["admissible_commands"])
    assert info["game_file"] == env.games[0].game_file and info["task_type"] == env.games[0].task_type


def test_facts_are_reported_only_when_asked_for(env):
    """``facts``: the engine's PDDL state for an expert that reads it (ALFWorld's hand-coded one)."""
    _, info = env.reset(options={"task_id": 0})
    assert "facts" not in info
    with_facts = AlfworldEnv({"split": "valid_unseen", "seed": 7, "facts": True})
    obs, info = with_facts.reset(options={"task_id": 0})
    names = {f.name for f in info["facts"]}
    assert {"atlocation", "inreceptacle"} <= names
    _, _, _, _, info = with_facts.step(info["admissible_actions"][0])
    assert info["facts"] and all(hasattr(f, "names") for f in info["facts"])


def test_invalid_command_is_a_step_that_changes_nothing(env):
    env.reset(options={"task_id": 1})
    obs, reward, terminated, truncated, info = env.step("fly to the moon")
    assert obs == INVALID_FEEDBACK and reward == 0.0 and not terminated and not truncated
    assert info["steps"] == 1 and info["state_key"] == INVALID_FEEDBACK
    # Case and spacing are normalised to ALFWorld's spelling: this is a valid command.
    obs, *_ = env.step("  LOOK ")
    assert obs != INVALID_FEEDBACK


def test_step_limit_truncates():
    env = AlfworldEnv({"split": "valid_unseen", "max_steps": 3})
    env.reset(options={"task_id": 0})
    outcomes = [env.step("inventory")[2:4] for _ in range(3)]
    assert outcomes == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_success_reward_is_configurable():
    env = AlfworldEnv({"split": "valid_unseen", "success_reward": 1.5})
    _, info = env.reset(options={"task_id": 2})
    walkthrough = json.loads(Path(info["game_file"]).read_text())["walkthrough"]
    rewards = [env.step(c)[1] for c in walkthrough]
    assert rewards == [0.0] * (len(walkthrough) - 1) + [1.5]


def test_same_seed_same_games_and_different_seeds_differ():
    a, b = AlfworldEnv({"split": "train", "seed": 3}), AlfworldEnv({"split": "train", "seed": 3})
    seq_a = [a.reset()[1]["task_id"] for _ in range(6)]
    seq_b = [b.reset()[1]["task_id"] for _ in range(6)]
    assert seq_a == seq_b
    c = AlfworldEnv({"split": "train", "seed": 4})
    assert [c.reset()[1]["task_id"] for _ in range(6)] != seq_a
    assert a.reset(seed=11)[0] == b.reset(seed=11)[0]


def test_task_id_and_game_file_pick_the_same_game(env):
    obs_id, info_id = env.reset(options={"task_id": 3})
    obs_file, info_file = env.reset(options={"game_file": info_id["game_file"]})
    assert obs_id == obs_file and info_file["task_id"] == 3
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": env.num_tasks})


def test_envs_in_one_process_stay_independent():
    a, b = AlfworldEnv({"split": "valid_unseen"}), AlfworldEnv({"split": "valid_unseen"})
    _, info_a = a.reset(options={"task_id": 0})
    _, info_b = b.reset(options={"task_id": 5})
    walk_a = json.loads(Path(info_a["game_file"]).read_text())["walkthrough"]
    walk_b = json.loads(Path(info_b["game_file"]).read_text())["walkthrough"]
    for i in range(max(len(walk_a), len(walk_b))):
        if i < len(walk_a):
            out_a = a.step(walk_a[i])
        if i < len(walk_b):
            out_b = b.step(walk_b[i])
    assert out_a[2] and out_b[2]


def test_envs_stepped_on_threads_play_as_one_after_another():
    """Per-episode rollouts step a runner's sub-envs on a thread pool: the same games give the same
    observations, rewards and admissible commands as stepped one after another."""
    from concurrent.futures import ThreadPoolExecutor

    def play(threaded: bool) -> list:
        envs = [AlfworldEnv({"split": "valid_unseen"}) for _ in range(4)]
        walks = []
        for i, env in enumerate(envs):
            _, info = env.reset(options={"task_id": i})
            walks.append(json.loads(Path(info["game_file"]).read_text())["walkthrough"])
        trace = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            for t in range(max(len(w) for w in walks)):
                todo = [(env, w[t]) for env, w in zip(envs, walks, strict=True) if t < len(w)]
                step = lambda pair: pair[0].step(pair[1])  # noqa: E731
                outs = list(pool.map(step, todo)) if threaded else [step(pair) for pair in todo]
                trace.append([(o[0], o[1], o[2], tuple(o[4]["admissible_commands"])) for o in outs])
        return trace

    trace = play(threaded=True)
    assert trace == play(threaded=False)
    assert sum(bool(step[2]) for turn in trace for step in turn) == 4  # every walkthrough wins


def test_passes_gymnasium_env_checker():
    check_env(AlfworldEnv({"split": "valid_unseen"}), skip_render_check=True)


def test_bad_config_is_named(tmp_path):
    with pytest.raises(ValueError, match="max_step"):
        AlfworldEnv({"max_step": 5})
    with pytest.raises(ValueError, match="'test'"):
        AlfworldEnv({"split": "test"})
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        AlfworldEnv({"data_dir": str(tmp_path / "nowhere")})
    (tmp_path / "train").mkdir()
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "train"))):
        AlfworldEnv({"data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="task_types"):
        AlfworldEnv({"split": "valid_unseen", "task_types": ["pick_and_place_with_movable_recep"]})


def _copy_game(src_game: str, root: Path) -> Path:
    src = Path(src_game).parent
    dst = root / "train" / src.parent.name / src.name
    shutil.copytree(src, dst)
    return dst


def test_corrupt_game_file_is_named(tmp_path):
    game = _copy_game(AlfworldEnv({"split": "valid_unseen"}).games[0].game_file, tmp_path)
    (game / "game.tw-pddl").write_text('{"pddl_problem": "(define')  # truncated JSON
    with pytest.raises(ValueError, match=re.escape(str(game / "game.tw-pddl"))):
        AlfworldEnv({"data_dir": str(tmp_path)})


def test_engine_exception_ends_the_episode_truncated(tmp_path):
    source = AlfworldEnv({"split": "valid_unseen"}).games[0].game_file
    game = _copy_game(source, tmp_path)
    data = read_game(source)
    # A grammar without the rule for arriving somewhere: TextWorld raises while rendering any "go to" step.
    data["grammar"] = data["grammar"].replace('"GotoLocation.feedback"', '"GotoLocation.unused"')
    (game / "game.tw-pddl").write_text(json.dumps(data))
    env = AlfworldEnv({"data_dir": str(tmp_path)})
    _, info = env.reset(options={"task_id": 0})
    go = next(c for c in info["admissible_commands"] if c.startswith("go to "))
    obs, reward, terminated, truncated, info = env.step(go)
    assert truncated and not terminated and reward == 0.0
    assert "GotoLocation.feedback" in info["engine_error"] and env.engine_errors == 1
    _, info = env.reset(options={"task_id": 0})  # the env keeps working
    assert env.step("inventory")[0].startswith("You are not carrying")
