"""Task-set construction: maze shape, exact random-walk success, and the random-policy bound measured by play."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.maze import MazeEnv
from envs.maze.layout import (
    ROOM_NAMES,
    MazeParams,
    build_tasks,
    generate_maze,
    random_walk_success,
    shortest_distances,
)


def play_random(env: MazeEnv, episodes: int, seed: int) -> tuple[float, dict[int, list[bool]]]:
    """Uniformly random policy over the admissible actions; tasks drawn from each episode's seed."""
    rng = np.random.default_rng(seed)
    per_task: dict[int, list[bool]] = {}
    for episode in range(episodes):
        _, info = env.reset(seed=seed * 1_000_003 + episode)
        done = False
        while not done:
            actions = info["admissible_actions"]
            _, _, terminated, truncated, info = env.step(actions[rng.integers(len(actions))])
            done = terminated or truncated
        per_task.setdefault(info["task_id"], []).append(bool(info["won"]))
    wins = [w for ws in per_task.values() for w in ws]
    return float(np.mean(wins)), per_task


@pytest.mark.parametrize("split", ["train", "eval"])
def test_random_policy_succeeds_in_at_most_20_percent(split: str) -> None:
    env = MazeEnv({"split": split})
    rate, per_task = play_random(env, 2000, seed=1)
    assert rate <= 0.20
    expected = np.mean([env.task(i).random_success for i in range(env.num_tasks)])
    assert abs(rate - expected) < 4 * np.sqrt(expected * (1 - expected) / 2000)
    assert rate > 0.05  # a learner must see some successes to start from


def test_exact_random_walk_success_matches_play() -> None:
    env = MazeEnv()
    _, per_task = play_random(env, 4000, seed=2)
    for task_id, wins in per_task.items():
        p = env.task(task_id).random_success
        assert abs(np.mean(wins) - p) < 4.5 * np.sqrt(p * (1 - p) / len(wins)) + 1e-9


def test_random_walk_success_on_a_corridor() -> None:
    """A 1x3 corridor from one end to the other: only 'east, east' (p 1/2) or longer walks succeed."""
    maze = generate_maze(np.random.default_rng(0), 3, 1, ("a", "b", "c"))
    assert random_walk_success(maze, 0, 2, 1) == 0.0
    assert random_walk_success(maze, 0, 2, 2) == pytest.approx(0.5)
    assert random_walk_success(maze, 0, 2, 4) == pytest.approx(0.75)
    assert shortest_distances(maze, 2) == [2, 1, 0]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), width=st.integers(2, 6), height=st.integers(1, 6))
def test_generated_maze_is_a_spanning_tree_with_two_way_doors(seed: int, width: int, height: int) -> None:
    names = tuple(ROOM_NAMES[: width * height])
    maze = generate_maze(np.random.default_rng(seed), width, height, names)
    doors = sum(len(e) for e in maze.exits) // 2
    assert doors == width * height - 1
    assert min(shortest_distances(maze, 0)) >= 0  # every room reachable
    step = {"north": -width, "south": width, "east": 1, "west": -1}
    for room, exits in enumerate(maze.exits):
        for direction, nxt in exits:
            assert nxt - room == step[direction]
            assert room in [j for _, j in maze.exits[nxt]]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_task_set_meets_the_bounds(seed: int) -> None:
    params = MazeParams(seed=seed)
    mazes, splits = build_tasks(params)
    names = [n for m in mazes for n in m.names]
    assert len(names) == len(set(names))
    for tasks in splits.values():
        assert len(tasks) >= params.num_mazes * params.min_tasks_per_maze
        for task in tasks:
            assert shortest_distances(mazes[task.maze_index], task.goal)[task.start] == task.shortest_path
            assert 5 <= task.shortest_path <= 7
            assert task.random_success <= 0.2
            assert task.max_steps == 3 * task.shortest_path
