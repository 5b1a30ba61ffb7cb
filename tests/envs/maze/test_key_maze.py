"""The hard maze (difficulty "hard"): its bounds hold for every task, checked by playing the env itself."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.maze import MazeEnv
from envs.maze.key_layout import (
    KeyMazeParams,
    build_key_tasks,
    key_state_graph,
    random_policy_success,
    shortest_solution,
    tree_paths,
)
from envs.maze.layout import generate_maze

HARD = {"difficulty": "hard"}


def replay(env: MazeEnv, task_id: int, actions: list[str]) -> tuple[dict, bool]:
    """Reset to `task_id`, play `actions`; the last info and whether the episode was won."""
    _, info = env.reset(options={"task_id": task_id})
    won = False
    for action in actions:
        _, _, won, _, info = env.step(action)
    return info, won


def explore(
    env: MazeEnv, task_id: int, prefix: list[str] | None = None
) -> tuple[dict, dict, list[str] | None]:
    """The state graph as seen through reset/step only: state = observation text (room and key).

    Returns (moves: state -> [next state or "WON"], one action path per state, a shortest winning path).
    """
    prefix = list(prefix or [])
    info, _ = replay(env, task_id, prefix)
    paths = {info["state_key"]: prefix}
    moves: dict[str, list[str]] = {}
    queue = deque([info["state_key"]])
    best: list[str] | None = None
    while queue:
        state = queue.popleft()
        info, _ = replay(env, task_id, paths[state])
        moves[state] = []
        for action in info["admissible_actions"]:
            nxt, won = replay(env, task_id, [*paths[state], action])
            if won:
                moves[state].append("WON")
                if best is None:
                    best = [*paths[state], action]
                continue
            moves[state].append(nxt["state_key"])
            if nxt["state_key"] not in paths:
                paths[nxt["state_key"]] = [*paths[state], action]
                queue.append(nxt["state_key"])
    return moves, paths, best


def success_by_dynamic_programming(moves: dict[str, list[str]], start: str, steps: int) -> float:
    """Exact success of uniformly random admissible actions within `steps`, over the explored graph."""
    p = dict.fromkeys(moves, 0.0)
    for _ in range(steps):
        p = {s: sum(1.0 if n == "WON" else p[n] for n in nxt) / len(nxt) for s, nxt in moves.items()}
    return p[start]


@pytest.fixture(scope="module")
def env() -> MazeEnv:
    return MazeEnv(HARD)


def test_key_corridor_has_the_hand_computed_solution_and_random_success() -> None:
    """Rooms a-b-c-d in a row, start b, key a, goal d: the only win is b>a>b(>a>b...)>c>d; east first dooms."""
    maze = generate_maze(np.random.default_rng(0), 4, 1, ("a", "b", "c", "d"))
    graph = key_state_graph(maze, start=1, key=0, goal=3, gate=(1, 2))
    assert shortest_solution(graph) == 4
    assert [random_policy_success(graph, t) for t in (3, 4, 5, 6)] == pytest.approx([0.0, 0.25, 0.25, 0.375])
    assert random_policy_success(graph, 50, state=2) == 0.0  # in c without the key: the gate shut behind


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_hard_task_set_meets_the_bounds(seed: int) -> None:
    params = KeyMazeParams(seed=seed)
    mazes, splits = build_key_tasks(params)
    names = [n for m in mazes for n in m.names]
    assert len(names) == len(set(names))
    for tasks in splits.values():
        assert len(tasks) >= params.num_mazes * params.min_tasks_per_maze
        for task in tasks:
            maze = mazes[task.maze_index]
            graph = key_state_graph(maze, task.start, task.key, task.goal, (task.fork, task.gate))
            assert shortest_solution(graph) == task.shortest_path
            assert 8 <= task.shortest_path <= 14
            assert task.max_steps == math.ceil(2.5 * task.shortest_path)
            assert random_policy_success(graph, task.max_steps) == task.random_success
            assert 0.03 <= task.random_success <= 0.15
            to_goal, to_key = tree_paths(maze, task.start)[task.goal], tree_paths(maze, task.start)[task.key]
            assert task.key not in to_goal and task.goal not in to_key
            assert task.fork_step <= 2 and to_goal[task.fork_step] == to_key[task.fork_step] == task.fork
            assert to_goal[task.fork_step + 1] == task.gate != to_key[task.fork_step + 1]
            assert task.gate != task.goal


@pytest.mark.parametrize("config", [{"split": "train"}, {"split": "eval"}, {"seed": 5, "split": "train"}])
def test_played_env_has_the_stated_shortest_path_and_exact_random_success(config: dict) -> None:
    """Explored through reset/step only, each task's BFS solution and random success equal the stated ones."""
    env = MazeEnv({**HARD, **config})
    for task_id in range(env.num_tasks):
        task = env.task(task_id)
        moves, paths, best = explore(env, task_id)
        start = replay(env, task_id, [])[0]["state_key"]
        assert best is not None and len(best) == task.shortest_path
        assert 8 <= len(best) <= 14
        limit = replay(env, task_id, [])[0]["max_steps"]
        p = success_by_dynamic_programming(moves, start, limit)
        assert p == pytest.approx(task.random_success, abs=1e-12)
        assert 0.03 <= p <= 0.15


def test_random_play_matches_the_exact_success(env: MazeEnv) -> None:
    rng = np.random.default_rng(3)
    wins: dict[int, list[bool]] = {}
    for episode in range(3000):
        _, info = env.reset(seed=episode)
        done = False
        while not done:
            actions = info["admissible_actions"]
            _, _, terminated, truncated, info = env.step(actions[rng.integers(len(actions))])
            done = terminated or truncated
        wins.setdefault(info["task_id"], []).append(bool(info["won"]))
    expected = np.mean([env.task(i).random_success for i in range(env.num_tasks)])
    rate = np.mean([w for ws in wins.values() for w in ws])
    assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / 3000)
    assert 0.03 <= rate <= 0.15


def test_the_wrong_turn_at_the_early_fork_makes_success_impossible(env: MazeEnv) -> None:
    for task_id in range(env.num_tasks):
        task = env.task(task_id)
        maze = env.maze(task_id)
        _, _, best = explore(env, task_id)
        to_fork, at_fork = best[: task.fork_step], best[task.fork_step]
        info, _ = replay(env, task_id, to_fork)
        assert info["room"] == maze.names[task.fork] and not info["carries_key"]
        gate_move = next(f"go {d}" for d, j in maze.exits[task.fork] if j == task.gate)
        assert at_fork != gate_move and gate_move in info["admissible_actions"]
        moves, _, won_path = explore(env, task_id, [*to_fork, gate_move])
        assert won_path is None and "WON" not in {n for nxt in moves.values() for n in nxt}
        assert all("You carry the key" not in state for state in moves)


def test_goal_door_opens_only_with_the_key(env: MazeEnv) -> None:
    for task_id in range(env.num_tasks):
        task, maze = env.task(task_id), env.maze(task_id)
        _, _, best = explore(env, task_id)
        rooms = [replay(env, task_id, best[: i + 1])[0]["room"] for i in range(len(best))]
        assert maze.names[task.key] in rooms[:-1] and rooms[-1] == maze.names[task.goal]
        assert len(best) > len(tree_paths(maze, task.start)[task.goal]) - 1


def test_observation_names_room_and_key_and_repeats_across_rollouts(env: MazeEnv) -> None:
    _, _, best = explore(env, 0)
    info, _ = replay(env, 0, best[:-1])
    assert info["carries_key"] and info["state_key"] == f"You are in the {info['room']}. You carry the key."
    assert info["task"].startswith("get the key in the ") and ", then go to the " in info["task"]
    keys = []
    for episode in range(8):
        rng = np.random.default_rng(episode)
        _, info = env.reset(options={"task_id": 0})
        seen, done = [info["state_key"]], False
        while not done:
            action = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
            _, _, terminated, truncated, info = env.step(action)
            seen.append(info["state_key"])
            done = terminated or truncated
        keys.append(seen)
    assert len({k[0] for k in keys}) == 1
    in_rollouts = {key: sum(key in set(k) for k in keys) for key in set().union(*keys)}
    assert sum(count >= 4 for count in in_rollouts.values()) >= 4  # a group of 8 shares several states
    assert all(len(set(k)) < len(k) for k in keys)


def test_hard_env_passes_the_checker_and_its_corpus_covers_its_texts(env: MazeEnv) -> None:
    check_env(MazeEnv(HARD), skip_render_check=True)
    words = {w for text in env.corpus() for w in text.replace(".", " ").replace(",", " ").split()}
    for task_id in range(env.num_tasks):
        moves, paths, _ = explore(env, task_id)
        info, _ = replay(env, task_id, [])
        texts = [*moves, info["task"], *info["admissible_actions"]]
        assert {w for t in texts for w in t.replace(".", " ").replace(",", " ").split()} <= words


def test_standard_difficulty_is_unchanged_by_default() -> None:
    assert MazeEnv().task(0) == MazeEnv({"difficulty": "standard"}).task(0)
    assert MazeEnv().difficulty == "standard" and MazeEnv(HARD).difficulty == "hard"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"difficulty": "expert"}, "difficulty"),
        ({"max_fork_step": 1}, "max_fork_step"),  # a hard-only key under the standard difficulty
        ({**HARD, "max_fork_step": -1}, "max_fork_step"),
        ({**HARD, "min_random_success": 0.2, "max_random_success": 0.1}, "min_random_success"),
        ({**HARD, "min_random_success": "low"}, "min_random_success"),
        ({**HARD, "min_shortest_path": 30, "max_shortest_path": 30}, "min_shortest_path"),
        ({**HARD, "num_mazes": 3}, "num_mazes"),
    ],
)
def test_bad_hard_config_raises_naming_the_field(config: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MazeEnv(config)
