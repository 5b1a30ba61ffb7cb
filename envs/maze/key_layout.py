"""The hard maze: a locked goal, a key off the way and a one-way gate, so an early fork decides success.

Each task instance is (maze, start, key room, goal room). The goal room is locked: its doors open only once the
agent carries the key, which it picks up by entering the key room. The key lies off the direct path from the start
to the goal: the two paths part at the fork room, at most ``max_fork_step`` steps from the start. The door from
the fork room towards the goal is a one-way gate: through it without the key, the key can no longer be reached
and the episode cannot succeed. So the turn taken at the fork, early in the episode, decides success, while the
credit for it arrives only at the end of a solution of ``min_shortest_path`` to ``max_shortest_path`` steps.

The state is (room, carries key); observations name both, so they repeat across the rollouts of a task. The
shortest solution (breadth-first search) and the success probability of a uniformly random policy over the
admissible moves within the step limit (dynamic programming over the states) are computed exactly; an instance
is kept only when both lie within the bounds, so the bounds hold by construction for every task.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from envs.maze.layout import Maze, draw_task_mazes

__all__ = [
    "KeyMazeParams",
    "KeyTask",
    "StateGraph",
    "build_key_tasks",
    "key_state_graph",
    "random_policy_success",
    "shortest_solution",
    "tree_paths",
]


@dataclass(frozen=True)
class KeyTask:
    """Walk from `start` through `key` (picks up the key) to the locked `goal` in maze number `maze_index`.

    `fork` is the room where the way to the key leaves the way to the goal, `fork_step` its distance from the
    start and `gate` the room behind the one-way gate (the first room from the fork towards the goal).
    `random_success` is the exact success probability of a uniformly random policy within `max_steps`.
    """

    maze_index: int
    start: int
    key: int
    goal: int
    fork: int
    gate: int
    fork_step: int
    shortest_path: int
    max_steps: int
    random_success: float


@dataclass(frozen=True)
class KeyMazeParams:
    """Everything that determines a hard task set; equal params give identical tasks."""

    seed: int = 0
    width: int = 4
    height: int = 4
    num_mazes: int = 2
    min_shortest_path: int = 8
    max_shortest_path: int = 14
    min_tasks_per_maze: int = 4
    step_limit_factor: float = 2.5
    min_random_success: float = 0.03
    max_random_success: float = 0.15
    max_fork_step: int = 2

    def step_limit(self, shortest: int) -> int:
        """The default step limit of an instance whose shortest solution takes `shortest` steps."""
        return max(1, math.ceil(self.step_limit_factor * shortest))


@dataclass(frozen=True)
class StateGraph:
    """The moves of one task: state = room + num_rooms * carries_key; `moves[s]` is ((direction, next), ...).

    `start` is the initial state; the task succeeds on entering any state in `goals`.
    """

    num_rooms: int
    moves: tuple[tuple[tuple[str, int], ...], ...]
    start: int
    goals: frozenset[int]

    def room(self, state: int) -> int:
        return state % self.num_rooms

    def has_key(self, state: int) -> bool:
        return state >= self.num_rooms


def tree_paths(maze: Maze, a: int) -> list[list[int]]:
    """paths[b]: the rooms of the unique simple path from `a` to `b` in a tree maze, both ends included."""
    parent = {a: -1}
    queue = deque([a])
    while queue:
        room = queue.popleft()
        for _, nxt in maze.exits[room]:
            if nxt not in parent:
                parent[nxt] = room
                queue.append(nxt)
    paths = []
    for b in range(maze.num_rooms):
        path = [b]
        while path[-1] != a:
            path.append(parent[path[-1]])
        paths.append(path[::-1])
    return paths


def key_state_graph(maze: Maze, start: int, key: int, goal: int, gate: tuple[int, int]) -> StateGraph:
    """Moves over (room, carries key): the goal is entered only with the key, `gate` = (from, to) is one-way.

    Entering the key room picks the key up; the door back from gate[1] to gate[0] is absent in both key states.
    The locked goal door stays a move without the key and leaves the agent where it is, so every state of a tree
    maze keeps at least one move.
    """
    n = maze.num_rooms
    moves: list[tuple[tuple[str, int], ...]] = []
    for state in range(2 * n):
        room, carries = state % n, state >= n
        out = []
        for direction, nxt in maze.exits[room]:
            if (room, nxt) == (gate[1], gate[0]):
                continue
            if nxt == goal and not carries:
                out.append((direction, state))  # the locked door: the move is admissible and fails
                continue
            out.append((direction, nxt + n if carries or nxt == key else nxt))
        moves.append(tuple(out))
    first = start + n if start == key else start
    return StateGraph(num_rooms=n, moves=tuple(moves), start=first, goals=frozenset({goal + n}))


def shortest_solution(graph: StateGraph) -> int | None:
    """Breadth-first number of moves from the start to a goal state; None when no goal state is reachable."""
    if graph.start in graph.goals:
        return 0
    dist = {graph.start: 0}
    queue = deque([graph.start])
    while queue:
        state = queue.popleft()
        for _, nxt in graph.moves[state]:
            if nxt not in dist:
                dist[nxt] = dist[state] + 1
                if nxt in graph.goals:
                    return dist[nxt]
                queue.append(nxt)
    return None


def random_policy_success(graph: StateGraph, max_steps: int, state: int | None = None) -> float:
    """Exact probability that uniformly random moves reach a goal state within `max_steps` (from `state`).

    A state without moves is a dead end: the episode runs out its steps there.
    """
    size = len(graph.moves)
    transition = np.zeros((size, size))  # transition[s, j]: probability that a random move from s enters j
    for s, moves in enumerate(graph.moves):
        for _, j in moves:
            transition[s, j] += 1.0 / len(moves)
    goals = np.zeros(size, dtype=bool)
    goals[list(graph.goals)] = True
    p = goals.astype(np.float64)  # p[s]: success probability from s with the remaining steps
    for _ in range(max_steps):
        p = transition @ p
        p[goals] = 1.0
    return float(p[graph.start if state is None else state])


def _tasks_of_maze(maze: Maze, maze_index: int, params: KeyMazeParams) -> list[KeyTask]:
    """Every (start, key, goal) of one maze that meets the bounds, in a fixed order."""
    tasks = []
    n = maze.num_rooms
    distance = [[len(path) - 1 for path in tree_paths(maze, room)] for room in range(n)]
    for start in range(n):
        paths = tree_paths(maze, start)
        for goal in range(n):
            if goal == start:
                continue
            to_goal = paths[goal]
            for key in range(n):
                if key in to_goal:
                    continue  # the key must lie off the way (which also excludes start and goal)
                to_key = paths[key]
                if goal in to_key:
                    continue
                via_key = distance[start][key] + distance[key][goal]  # the solution's length, checked below
                if not params.min_shortest_path <= via_key <= params.max_shortest_path:
                    continue
                fork_step = next(i for i in range(len(to_key)) if to_key[i] != to_goal[i]) - 1
                if fork_step > params.max_fork_step:
                    continue
                fork, gate = to_goal[fork_step], to_goal[fork_step + 1]
                if gate == goal:
                    continue  # the wrong turn must be one the agent can take
                graph = key_state_graph(maze, start, key, goal, (fork, gate))
                shortest = shortest_solution(graph)
                if shortest is None or not params.min_shortest_path <= shortest <= params.max_shortest_path:
                    continue
                limit = params.step_limit(shortest)
                p = random_policy_success(graph, limit)
                if params.min_random_success <= p <= params.max_random_success:
                    tasks.append(
                        KeyTask(maze_index, start, key, goal, fork, gate, fork_step, shortest, limit, p)
                    )
    return tasks


@lru_cache(maxsize=64)
def build_key_tasks(params: KeyMazeParams) -> tuple[tuple[Maze, ...], dict[str, tuple[KeyTask, ...]]]:
    """The mazes of a hard task set and the task instances of each split, in a fixed order.

    Train and eval share the mazes and never share a (start, key, goal) triple; each split's list interleaves
    the mazes, so its first n tasks spread evenly over them.
    """
    if params.max_shortest_path < params.min_shortest_path:
        raise ValueError(
            f"max_shortest_path ({params.max_shortest_path}) is below min_shortest_path "
            f"({params.min_shortest_path})"
        )
    if params.max_random_success < params.min_random_success:
        raise ValueError(
            f"max_random_success ({params.max_random_success}) is below min_random_success "
            f"({params.min_random_success})"
        )
    return draw_task_mazes(
        params,
        0x6B6579,
        lambda maze, m: _tasks_of_maze(maze, m, params),
        what="(start, key, goal) triples",
        bounds=(
            f"min_shortest_path={params.min_shortest_path} <= shortest solution <= "
            f"max_shortest_path={params.max_shortest_path}, fork within max_fork_step="
            f"{params.max_fork_step} and min_random_success={params.min_random_success} <= exact random "
            f"success <= max_random_success={params.max_random_success}"
        ),
    )
