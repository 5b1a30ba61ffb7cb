"""Seeded maze layouts and task instances for the built-in maze environment.

A maze is a grid of named rooms joined by doors (a random spanning tree, so every room is reachable and there is
one simple path between two rooms). A task instance is (maze, start room, goal room). Instances are kept only when
the shortest path is long enough and a uniformly random walk over the open exits rarely reaches the goal within
the step limit; that probability is computed exactly, so the random-policy success rate of the environment is
bounded by construction rather than by luck.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = [
    "DIRECTIONS",
    "SPLITS",
    "ROOM_NAMES",
    "Maze",
    "MazeParams",
    "MazeTask",
    "build_tasks",
    "generate_maze",
    "random_walk_success",
    "shortest_distances",
]

# (name, row offset, column offset); the order fixes the order of the admissible actions.
DIRECTIONS: tuple[tuple[str, int, int], ...] = (
    ("north", -1, 0),
    ("east", 0, 1),
    ("south", 1, 0),
    ("west", 0, -1),
)

# One-word room names: a small, regular vocabulary. Mazes of one task set never share a name, so the goal and the
# current room together identify the maze.
ROOM_NAMES: tuple[str, ...] = (
    "kitchen", "hall", "library", "cellar", "garden", "study", "bedroom", "bathroom", "attic",
    "pantry", "office", "lounge", "porch", "garage", "nursery", "chapel", "gallery", "tower",
    "vault", "workshop", "armory", "ballroom", "cloister", "courtyard", "dungeon", "foyer", "greenhouse",
    "laundry", "parlor", "sauna", "stable", "studio", "theater", "closet", "balcony", "den",
)  # fmt: skip

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Maze:
    """Rooms (by index), their names and the doors out of each room as (direction, neighbour) pairs."""

    names: tuple[str, ...]
    exits: tuple[tuple[tuple[str, int], ...], ...]

    @property
    def num_rooms(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class MazeTask:
    """One task instance: walk from `start` to `goal` in maze number `maze_index`.

    `random_success` is the exact success probability of a uniformly random policy within `max_steps`.
    """

    maze_index: int
    start: int
    goal: int
    shortest_path: int
    max_steps: int
    random_success: float


@dataclass(frozen=True)
class MazeParams:
    """Everything that determines a task set; equal params give identical tasks."""

    seed: int = 0
    width: int = 4
    height: int = 3
    num_mazes: int = 2
    min_shortest_path: int = 5
    max_shortest_path: int = 7
    min_tasks_per_maze: int = 4
    step_limit_factor: float = 3.0
    max_random_success: float = 0.2

    def step_limit(self, shortest: int) -> int:
        """The default step limit of an instance whose shortest solution takes `shortest` steps."""
        return max(1, math.ceil(self.step_limit_factor * shortest))


def generate_maze(rng: np.random.Generator, width: int, height: int, names: tuple[str, ...]) -> Maze:
    """A random spanning tree of the grid (randomised depth-first search), rooms named from `names`."""
    n = width * height
    neighbours: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    visited = np.zeros(n, dtype=bool)
    start = int(rng.integers(n))
    visited[start] = True
    stack = [start]
    while stack:
        cell = stack[-1]
        r, c = divmod(cell, width)
        options = [
            (d, (r + dr) * width + (c + dc))
            for d, dr, dc in DIRECTIONS
            if 0 <= r + dr < height and 0 <= c + dc < width and not visited[(r + dr) * width + (c + dc)]
        ]
        if not options:
            stack.pop()
            continue
        direction, nxt = options[int(rng.integers(len(options)))]
        opposite = {"north": "south", "south": "north", "east": "west", "west": "east"}[direction]
        neighbours[cell].append((direction, nxt))
        neighbours[nxt].append((opposite, cell))
        visited[nxt] = True
        stack.append(nxt)
    order = {d: i for i, (d, _, _) in enumerate(DIRECTIONS)}
    exits = tuple(tuple(sorted(room, key=lambda e: order[e[0]])) for room in neighbours)
    return Maze(names=tuple(names), exits=exits)


def shortest_distances(maze: Maze, goal: int) -> list[int]:
    """Breadth-first distance (in steps) from every room to `goal`."""
    dist = [-1] * maze.num_rooms
    dist[goal] = 0
    queue = deque([goal])
    while queue:
        room = queue.popleft()
        for _, nxt in maze.exits[room]:
            if dist[nxt] < 0:
                dist[nxt] = dist[room] + 1
                queue.append(nxt)
    return dist


def random_walk_success(maze: Maze, start: int, goal: int, max_steps: int) -> float:
    """Exact probability that a uniformly random choice among the open exits reaches `goal` within `max_steps`."""
    p = np.zeros(maze.num_rooms)  # p[room]: success probability with the remaining steps
    p[goal] = 1.0
    for _ in range(max_steps):
        nxt = np.array([np.mean([p[j] for _, j in maze.exits[room]]) for room in range(maze.num_rooms)])
        nxt[goal] = 1.0
        p = nxt
    return float(p[start])


def _maze_tasks(maze: Maze, maze_index: int, params: MazeParams) -> list[MazeTask]:
    """The qualifying (start, goal) pairs of one maze, in a fixed order."""
    tasks = []
    for goal in range(maze.num_rooms):
        dist = shortest_distances(maze, goal)
        for start in range(maze.num_rooms):
            d = dist[start]
            if not params.min_shortest_path <= d <= params.max_shortest_path:
                continue
            limit = params.step_limit(d)
            p = random_walk_success(maze, start, goal, limit)
            if p <= params.max_random_success:
                tasks.append(MazeTask(maze_index, start, goal, d, limit, p))
    return tasks


def draw_task_mazes(
    params: Any,
    seed_tag: int,
    tasks_of_maze: Callable[[Maze, int], list],
    *,
    what: str,
    bounds: str,
) -> tuple[tuple[Maze, ...], dict[str, tuple]]:
    """Mazes drawn until each offers ``params.min_tasks_per_maze`` tasks per split, and each split's task list.

    Shared by the task sets of this package. A maze's tasks (``tasks_of_maze(maze, index)``, in a fixed order) are
    shuffled and dealt alternately to train and eval, so the splits never share a task; each split's list
    interleaves the mazes (maze 0, maze 1, ..., maze 0, ...), so its first n tasks spread evenly over them.
    ``what`` and ``bounds`` name the tasks and their bounds in the error raised when no maze qualifies.
    """
    rooms = params.width * params.height
    if params.num_mazes * rooms > len(ROOM_NAMES):
        raise ValueError(
            f"num_mazes * width * height = {params.num_mazes * rooms} exceeds the {len(ROOM_NAMES)} room names"
        )
    rng = np.random.default_rng(np.random.SeedSequence([params.seed, seed_tag]))
    names = [ROOM_NAMES[i] for i in rng.permutation(len(ROOM_NAMES))]
    mazes, pools = [], []
    for m in range(params.num_mazes):
        maze_names = tuple(names[m * rooms : (m + 1) * rooms])
        for _attempt in range(200):
            maze = generate_maze(rng, params.width, params.height, maze_names)
            tasks = tasks_of_maze(maze, m)
            shuffled = [tasks[i] for i in rng.permutation(len(tasks))]
            pairs = {"train": shuffled[0::2], "eval": shuffled[1::2]}
            if min(len(pairs[s]) for s in SPLITS) >= params.min_tasks_per_maze:
                break
        else:
            raise ValueError(
                f"no {params.width}x{params.height} maze (width x height) in 200 draws offers "
                f"min_tasks_per_maze={params.min_tasks_per_maze} {what} per split with {bounds}; "
                "enlarge the maze or relax those keys"
            )
        mazes.append(maze)
        pools.append(pairs)
    splits = {}
    for split in SPLITS:
        longest = max(len(pool[split]) for pool in pools)
        splits[split] = tuple(
            pool[split][k] for k in range(longest) for pool in pools if k < len(pool[split])
        )
    return tuple(mazes), splits


@lru_cache(maxsize=64)
def build_tasks(params: MazeParams) -> tuple[tuple[Maze, ...], dict[str, tuple[MazeTask, ...]]]:
    """The mazes of a task set and the task instances of each split, in a fixed order.

    Train and eval share the mazes and never share a (start, goal) pair (``draw_task_mazes``).
    """
    return draw_task_mazes(
        params,
        0x6D617A65,
        lambda maze, m: _maze_tasks(maze, m, params),
        what="(start, goal) pairs",
        bounds=(
            f"min_shortest_path={params.min_shortest_path} <= shortest path <= "
            f"max_shortest_path={params.max_shortest_path} and exact random success <= "
            f"max_random_success={params.max_random_success}"
        ),
    )
