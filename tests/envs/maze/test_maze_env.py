"""MazeEnv against the environment protocol and its own promises (reward, step limit, invalid actions, seeds)."""

from __future__ import annotations

import math
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.maze import MazeEnv
from envs.protocol import check_info
from envs.spaces import TextSpace


def solve(env: MazeEnv, task_id: int) -> list[str]:
    """Shortest action sequence found by breadth-first search that only uses reset/step (no internals)."""
    _, info = env.reset(options={"task_id": task_id})
    paths = {info["room"]: []}
    queue = deque([info["room"]])
    while queue:
        room = queue.popleft()
        _, info = env.reset(options={"task_id": task_id})
        for action in paths[room]:
            _, _, _, _, info = env.step(action)
        for action in info["admissible_actions"]:
            env.reset(options={"task_id": task_id})
            for prev in paths[room]:
                env.step(prev)
            _, _, terminated, _, nxt = env.step(action)
            if terminated:
                return [*paths[room], action]
            if nxt["room"] not in paths:
                paths[nxt["room"]] = [*paths[room], action]
                queue.append(nxt["room"])
    raise AssertionError(f"task {task_id} has no solution")


@pytest.fixture(scope="module")
def env() -> MazeEnv:
    return MazeEnv()


def test_env_checker_passes() -> None:
    check_env(MazeEnv(), skip_render_check=True)
    check_env(MazeEnv({"split": "eval", "seed": 3}), skip_render_check=True)


def test_spaces_and_info_follow_protocol(env: MazeEnv) -> None:
    assert isinstance(env.observation_space, TextSpace) and isinstance(env.action_space, TextSpace)
    assert env.num_tasks == 8
    obs, info = env.reset(seed=0, options={"task_id": 3})
    assert env.observation_space.contains(obs)
    check_info(info)
    assert info["task_id"] == 3 and info["won"] is False and info["state_key"] == obs
    assert info["task"].startswith("go to the ")
    assert info["admissible_actions"] and all(a.startswith("go ") for a in info["admissible_actions"])
    _, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])
    check_info(info)
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_shortest_solution_takes_at_least_four_steps_in_every_split() -> None:
    for config in ({"split": "train"}, {"split": "eval"}, {"seed": 7, "num_tasks": None}):
        env = MazeEnv(config)
        for task_id in range(env.num_tasks):
            path = solve(env, task_id)
            assert len(path) >= 4
            assert len(path) == env.task(task_id).shortest_path


def test_sparse_reward_only_on_success(env: MazeEnv) -> None:
    path = solve(env, 0)
    _, info = env.reset(options={"task_id": 0})
    rewards = []
    for action in path:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        assert not truncated
    assert rewards == [0.0] * (len(path) - 1) + [10.0]
    assert terminated and info["won"] is True
    with pytest.raises(RuntimeError, match="reset"):
        env.step(path[-1])


def test_success_reward_is_configurable() -> None:
    env = MazeEnv({"success_reward": 1.5})
    path = solve(env, 2)
    env.reset(options={"task_id": 2})
    total = sum(env.step(a)[1] for a in path)
    assert total == 1.5


def test_default_step_limit_is_three_times_the_shortest_path(env: MazeEnv) -> None:
    for task_id in range(env.num_tasks):
        _, info = env.reset(options={"task_id": task_id})
        limit = info["max_steps"]
        assert limit == math.ceil(3 * info["shortest_path"])
        for step in range(1, limit + 1):
            _, reward, terminated, truncated, info = env.step("wait")
            assert not terminated and reward == 0.0
            assert truncated == (step == limit)
        assert info["steps"] == limit


def test_max_steps_overrides_the_limit_without_changing_tasks(env: MazeEnv) -> None:
    short = MazeEnv({"max_steps": 4})
    assert [short.task(i) for i in range(8)] == [env.task(i) for i in range(8)]
    short.reset(options={"task_id": 0})
    flags = [short.step("go nowhere")[3] for _ in range(4)]
    assert flags == [False, False, False, True]


@pytest.mark.parametrize("action", ["fly", "", "go up", "north", None, 42, b"go north", "go north go north"])
def test_inadmissible_action_does_nothing_counts_and_is_flagged(env: MazeEnv, action: object) -> None:
    obs, info = env.reset(options={"task_id": 1})
    obs2, reward, terminated, truncated, info2 = env.step(action)
    assert obs2 == obs and info2["state_key"] == info["state_key"] and info2["room"] == info["room"]
    assert info2["invalid_action"] is True and info2["steps"] == 1
    assert info2["admissible_actions"] == info["admissible_actions"]
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_admissible_action_moves_and_is_not_flagged(env: MazeEnv) -> None:
    obs, info = env.reset(options={"task_id": 1})
    action = info["admissible_actions"][0]
    obs2, _, _, _, info2 = env.step("  " + action.upper().replace(" ", "   ") + "\n")
    assert info2["invalid_action"] is False and obs2 != obs and info2["steps"] == 1


def test_exits_are_two_way_doors(env: MazeEnv) -> None:
    opposite = {"north": "south", "south": "north", "east": "west", "west": "east"}
    obs, info = env.reset(options={"task_id": 5})
    for action in info["admissible_actions"]:
        env.reset(options={"task_id": 5})
        _, _, _, _, moved = env.step(action)
        back = "go " + opposite[action.split()[1]]
        assert back in moved["admissible_actions"]
        if not moved["won"]:
            assert env.step(back)[0] == obs


def test_observation_identifies_the_room_within_a_task() -> None:
    env = MazeEnv({"num_tasks": None})
    for task_id in range(env.num_tasks):
        maze = env.maze(task_id)
        assert len(set(maze.names)) == maze.num_rooms
    seen: dict[str, tuple[str, ...]] = {}
    for task_id in range(env.num_tasks):
        for room, exits in zip(env.maze(task_id).names, env.maze(task_id).exits, strict=True):
            key = f"You are in the {room}."
            assert seen.setdefault(key, exits) == exits


def test_state_keys_repeat_across_rollouts_of_one_task() -> None:
    """Two random rollouts of the same instance revisit the same observation texts (grouping has work to do)."""
    env = MazeEnv()
    keys = []
    for episode in range(2):
        rng = np.random.default_rng(episode)
        _, info = env.reset(options={"task_id": 0})
        seen = [info["state_key"]]
        done = False
        while not done:
            action = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
            _, _, terminated, truncated, info = env.step(action)
            seen.append(info["state_key"])
            done = terminated or truncated
        keys.append(seen)
    assert keys[0][0] == keys[1][0]
    assert len(set(keys[0]) & set(keys[1])) >= 2
    assert len(set(keys[0])) < len(keys[0])


def test_same_seed_same_tasks_and_different_seed_different_tasks() -> None:
    a, b, c = MazeEnv({"seed": 11}), MazeEnv({"seed": 11}), MazeEnv({"seed": 12})
    assert [a.task(i) for i in range(8)] == [b.task(i) for i in range(8)]
    assert [a.maze(i) for i in range(8)] == [b.maze(i) for i in range(8)]
    assert a.corpus() == b.corpus()
    assert [a.maze(i) for i in range(8)] != [c.maze(i) for i in range(8)]


def test_reset_without_task_id_draws_from_the_seed() -> None:
    env = MazeEnv()
    drawn = [env.reset(seed=s)[1]["task_id"] for s in range(64)]
    again = [env.reset(seed=s)[1]["task_id"] for s in range(64)]
    assert drawn == again
    assert set(drawn) == set(range(env.num_tasks))
    env.reset(seed=5)
    sequence = [env.reset()[1]["task_id"] for _ in range(10)]
    env.reset(seed=5)
    assert [env.reset()[1]["task_id"] for _ in range(10)] == sequence


def test_train_and_eval_share_mazes_but_never_a_task() -> None:
    train, evaluation = MazeEnv({"num_tasks": None}), MazeEnv({"split": "eval", "num_tasks": None})
    pairs = {(t.maze_index, t.start, t.goal) for t in (train.task(i) for i in range(train.num_tasks))}
    eval_pairs = {
        (t.maze_index, t.start, t.goal) for t in (evaluation.task(i) for i in range(evaluation.num_tasks))
    }
    assert pairs and eval_pairs and not pairs & eval_pairs
    assert train.maze(0) == evaluation.maze(0)
    assert MazeEnv({"num_tasks": 3}).task(2) == train.task(2)


def test_instances_are_independent() -> None:
    a, b, reference = MazeEnv(), MazeEnv(), MazeEnv()
    path = solve(reference, 4)
    a.reset(options={"task_id": 4})
    b.reset(options={"task_id": 6})
    b_obs = [b.step("go north")[0] for _ in path]
    for action in path:
        out_a = a.step(action)
    assert out_a[2] is True and out_a[1] == 10.0
    reference.reset(options={"task_id": 6})
    assert [reference.step("go north")[0] for _ in path] == b_obs


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"bogus": 1}, "bogus"),
        ({"split": "test"}, "split"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"width": 0}, "width"),
        ({"max_steps": 0}, "max_steps"),
        ({"num_tasks": 10_000}, "num_tasks"),
        ({"success_reward": "ten"}, "success_reward"),
        ({"max_random_success": 0.0}, "max_random_success"),
        ({"min_shortest_path": 8, "max_shortest_path": 6}, "max_shortest_path"),
        ({"num_mazes": 4}, "num_mazes"),
        ({"min_shortest_path": 12, "max_shortest_path": 12}, "min_shortest_path"),
    ],
)
def test_bad_config_raises_naming_the_field(config: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MazeEnv(config)


@pytest.mark.parametrize(
    ("options", "field"), [({"task_id": 8}, "task_id"), ({"task_id": "a"}, "task_id"), ({"x": 1}, "x")]
)
def test_bad_reset_options_raise_naming_the_field(env: MazeEnv, options: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        env.reset(options=options)


def test_corpus_covers_every_text_the_env_emits(env: MazeEnv) -> None:
    words = {w for text in env.corpus() for w in text.replace(".", " ").split()}
    for task_id in range(env.num_tasks):
        obs, info = env.reset(options={"task_id": task_id})
        texts = [obs, info["task"], *info["admissible_actions"]]
        assert {w for t in texts for w in t.replace(".", " ").split()} <= words


def test_runs_in_a_gymnasium_vector_env_with_autoreset() -> None:
    """Batched observations stay whole strings and finished sub-envs reset themselves (as RLlib's runner uses it)."""
    vec = gym.vector.SyncVectorEnv([MazeEnv, MazeEnv, MazeEnv])
    obs, infos = vec.reset(seed=0)
    assert obs.dtype == object and obs.shape == (3,) and all(o.startswith("You are in the ") for o in obs)
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(200):
        actions = np.empty(3, dtype=object)
        actions[:] = [a[rng.integers(len(a))] for a in infos["admissible_actions"]]
        obs, _, terminated, truncated, infos = vec.step(actions)
        assert all(isinstance(o, str) and o.startswith("You are in the ") for o in obs)
        finished += int(np.sum(terminated | truncated))
    assert finished >= 3
    vec.close()
