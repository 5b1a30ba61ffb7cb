"""MazeEnv: a fast multi-turn text environment for CPU learning checks.

The agent walks through a small maze of named rooms towards a goal room. Observations are short and repeat
whenever a room is revisited ("You are in the kitchen."), so the anchor states of GAGPO/GiGPO groups recur across
the rollouts of one task instance; the observation text is the state key. The reward is sparse (only on reaching
the goal), and a uniformly random policy over the admissible actions succeeds in at most `max_random_success` of
episodes on every task instance (computed exactly when the task set is built).

``difficulty="hard"`` plays the key maze of ``envs.maze.key_layout`` instead: a locked goal, a key off the way
and a one-way gate, so a turn early in the episode decides success; the observation also says whether the agent
carries the key.
"""

from __future__ import annotations

import operator
from dataclasses import fields
from typing import Any

import gymnasium as gym

from envs.maze.key_layout import KeyMazeParams, KeyTask, build_key_tasks, key_state_graph
from envs.maze.layout import SPLITS, Maze, MazeParams, MazeTask, build_tasks
from envs.protocol import EvalTable
from envs.spaces import TextSpace

__all__ = ["DIFFICULTIES", "MazeEnv"]

DIFFICULTIES = ("standard", "hard")
_ENV_KEYS = {
    "split": "train",
    "num_tasks": 8,
    "max_steps": None,
    "success_reward": 10.0,
    "difficulty": "standard",
}
_PARAM_KEYS = {
    "standard": {f.name: f.default for f in fields(MazeParams)},
    "hard": {f.name: f.default for f in fields(KeyMazeParams)},
}
_INT_KEYS = (
    "seed",
    "width",
    "height",
    "num_mazes",
    "min_shortest_path",
    "max_shortest_path",
    "min_tasks_per_maze",
    "max_fork_step",
)


def _require_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"MazeEnv config {name!r} must be an int, got {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"MazeEnv config {name!r} must be >= {minimum}, got {value}")
    return value


def _require_float(name: str, value: Any, low: float, high: float = float("inf")) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"MazeEnv config {name!r} must be a number, got {value!r}")
    if not low < float(value) <= high:
        raise ValueError(f"MazeEnv config {name!r} must be in ({low}, {high}], got {value}")
    return float(value)


def _parse_config(
    config: dict[str, Any] | None,
) -> tuple[MazeParams | KeyMazeParams, str, int | None, int | None, float]:
    """Validate the env config; every bad key or value raises ValueError naming it."""
    config = dict(config or {})
    difficulty = config.get("difficulty", "standard")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"MazeEnv config 'difficulty' must be one of {DIFFICULTIES}, got {difficulty!r}")
    param_keys = _PARAM_KEYS[difficulty]
    unknown = sorted(set(config) - set(_ENV_KEYS) - set(param_keys))
    if unknown:
        raise ValueError(
            f"MazeEnv config: unknown key(s) {unknown} for difficulty {difficulty!r}; known keys: "
            f"{sorted(set(_ENV_KEYS) | set(param_keys))}"
        )
    merged = {**_ENV_KEYS, **param_keys, **config}
    params = {}
    for name in _INT_KEYS:
        if name in param_keys:
            params[name] = _require_int(name, merged[name], 0 if name in ("seed", "max_fork_step") else 1)
    if params["max_shortest_path"] < params["min_shortest_path"]:
        raise ValueError(
            f"MazeEnv config 'max_shortest_path' ({params['max_shortest_path']}) is below "
            f"'min_shortest_path' ({params['min_shortest_path']})"
        )
    params["step_limit_factor"] = _require_float("step_limit_factor", merged["step_limit_factor"], 0.0)
    params["max_random_success"] = _require_float(
        "max_random_success", merged["max_random_success"], 0.0, 1.0
    )
    if "min_random_success" in param_keys:
        low = merged["min_random_success"]
        if isinstance(low, bool) or not isinstance(low, (int, float)) or not 0.0 <= low <= 1.0:
            raise ValueError(f"MazeEnv config 'min_random_success' must be a number in [0, 1], got {low!r}")
        if low > params["max_random_success"]:
            raise ValueError(
                f"MazeEnv config 'min_random_success' ({low}) is above 'max_random_success' "
                f"({params['max_random_success']})"
            )
        params["min_random_success"] = float(low)
    max_steps = merged["max_steps"]
    max_steps = None if max_steps is None else _require_int("max_steps", max_steps, 1)
    split = merged["split"]
    if split not in SPLITS:
        raise ValueError(f"MazeEnv config 'split' must be one of {SPLITS}, got {split!r}")
    num_tasks = merged["num_tasks"]
    num_tasks = None if num_tasks is None else _require_int("num_tasks", num_tasks, 1)
    reward = _require_float("success_reward", merged["success_reward"], 0.0)
    param_cls = KeyMazeParams if difficulty == "hard" else MazeParams
    return param_cls(**params), split, num_tasks, max_steps, reward


def _normalise(action: Any) -> str | None:
    """The command as the env compares it: lower case, single spaces; None for anything that is not text."""
    if not isinstance(action, str):
        return None
    return " ".join(action.lower().split())


class MazeEnv(gym.Env):
    """Walk from a start room to a goal room with 'go <direction>' commands.

    Config keys (all optional): split ("train" | "eval"), seed (task set), num_tasks (instances in the split, None
    for all; default 8), max_steps (None: the instance's own limit, ceil(step_limit_factor * shortest path); an
    int overrides it for every instance without changing the task set), step_limit_factor (3.0), success_reward
    (10.0), width/height (grid, 4x3), num_mazes (2), min_shortest_path / max_shortest_path (5 / 7),
    max_random_success (0.2, the cap on each instance's exact random-policy success under its own limit),
    min_tasks_per_maze (4: pairs a maze must offer each split), difficulty ("standard" | "hard").

    With difficulty "hard" the task set is ``envs.maze.key_layout``'s and its keys replace the ones above that
    differ: width/height 4x4, min_shortest_path / max_shortest_path 8 / 14, step_limit_factor 2.5,
    min_random_success / max_random_success 0.03 / 0.15, max_fork_step 2 (see ``KeyMazeParams``). There, a move
    through the locked goal door without the key is admissible and leaves the agent where it is (not invalid).

    An inadmissible or unparsable action leaves the agent where it is, counts as a step and sets
    info["invalid_action"]; the observation (and so the state key) stays that of the current room.
    """

    metadata = {"render_modes": []}
    # Env protocol (envs/protocol.py): success per maze in evaluation's generic row.
    splits = SPLITS
    eval_split = "eval"
    eval_table = EvalTable()

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__()
        params, self.split, num_tasks, self._max_steps, self.success_reward = _parse_config(config)
        self.params = params
        self.difficulty = "hard" if isinstance(params, KeyMazeParams) else "standard"
        self._mazes, splits = build_key_tasks(params) if self.difficulty == "hard" else build_tasks(params)
        self._all_tasks = tuple(t for split in SPLITS for t in splits[split])
        available = splits[self.split]
        if num_tasks is None:
            num_tasks = len(available)
        if num_tasks > len(available):
            raise ValueError(
                f"MazeEnv config 'num_tasks'={num_tasks} exceeds the {len(available)} task instances of split "
                f"{self.split!r} for these maze settings; lower num_tasks or raise num_mazes"
            )
        self._tasks: tuple[MazeTask | KeyTask, ...] = available[:num_tasks]
        if self.difficulty == "hard":
            self._views = [_KeyMazeView(self._mazes[t.maze_index], t) for t in self._tasks]
        else:
            maze_views = [_MazeView(m) for m in self._mazes]
            self._views = [maze_views[t.maze_index] for t in self._tasks]
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._task: MazeTask | KeyTask | None = None
        self._task_id = -1
        self._view = self._views[0]
        self._goal_text = ""
        self._limit = 0
        self._room = -1
        self._steps = 0
        self._done = True

    @property
    def num_tasks(self) -> int:
        return len(self._tasks)

    def task(self, task_id: int) -> MazeTask | KeyTask:
        """The instance `task_id` of this split (start, goal, shortest path, step limit, random success)."""
        return self._tasks[self._check_task_id(task_id)]

    def maze(self, task_id: int) -> Maze:
        """The maze that task instance `task_id` is played in."""
        return self._mazes[self.task(task_id).maze_index]

    def corpus(self) -> list[str]:
        """Every task, observation and action text of this task set: material to train a small tokenizer on."""
        texts = [_task_text(t, self._mazes[t.maze_index]) for t in self._all_tasks]
        for maze in self._mazes:
            texts += [f"go to the {name}" for name in maze.names]
            if self.difficulty == "hard":
                texts += [
                    f"You are in the {name}.{suffix}" for name in maze.names for suffix in ("", _CARRIES)
                ]
        for view in self._views:
            texts += view.observations
            texts += [a for actions in view.admissible for a in actions]
        return sorted(set(texts))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - {"task_id"})
        if unknown:
            raise ValueError(f"MazeEnv.reset: unknown option(s) {unknown}; known: ['task_id']")
        if options.get("task_id") is None:
            task_id = int(self.np_random.integers(self.num_tasks))
        else:
            task_id = self._check_task_id(options["task_id"])
        self._task_id = task_id
        self._task = self._tasks[task_id]
        self._view = self._views[task_id]
        self._goal_text = _task_text(self._task, self._view.maze)
        self._limit = self._task.max_steps if self._max_steps is None else self._max_steps
        self._room = self._task.start
        self._steps = 0
        self._done = False
        return self._view.observations[self._room], self._info(invalid=False)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("MazeEnv.step called before reset() or after the episode ended")
        self._steps += 1
        nxt = self._view.moves[self._room].get(_normalise(action))
        invalid = nxt is None
        if not invalid:
            self._room = nxt
        won = self._view.room_of[self._room] == self._task.goal
        truncated = not won and self._steps >= self._limit
        self._done = won or truncated
        reward = self.success_reward if won else 0.0
        return self._view.observations[self._room], reward, won, truncated, self._info(invalid=invalid)

    def _check_task_id(self, task_id: Any) -> int:
        try:
            index = operator.index(task_id)
        except TypeError:
            raise ValueError(f"task_id must be an int, got {task_id!r}") from None
        if not 0 <= index < self.num_tasks:
            raise ValueError(f"task_id must be in [0, {self.num_tasks}), got {index}")
        return index

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        observation = self._view.observations[self._room]
        return {
            "task": self._goal_text,
            "task_id": self._task_id,
            "admissible_actions": list(self._view.admissible[self._room]),
            "state_key": observation,
            "won": self._view.room_of[self._room] == self._task.goal,
            "task_type": f"{self._view.kind}{self._task.maze_index}",
            "invalid_action": invalid,
            "room": self._view.maze.names[self._view.room_of[self._room]],
            "carries_key": self._view.carries_key[self._room],
            "steps": self._steps,
            "max_steps": self._limit,
            "shortest_path": self._task.shortest_path,
        }


_CARRIES = " You carry the key."


def _task_text(task: MazeTask | KeyTask, maze: Maze) -> str:
    if isinstance(task, KeyTask):
        return f"get the key in the {maze.names[task.key]}, then go to the {maze.names[task.goal]}"
    return f"go to the {maze.names[task.goal]}"


class _MazeView:
    """Per-state texts and moves of one maze (state = room), precomputed so a step is a few dictionary lookups."""

    kind = "maze"

    def __init__(self, maze: Maze):
        self.maze = maze
        self.room_of = list(range(maze.num_rooms))
        self.carries_key = [False] * maze.num_rooms
        self.observations = [f"You are in the {name}." for name in maze.names]
        self.admissible = [tuple(f"go {d}" for d, _ in exits) for exits in maze.exits]
        self.moves = [{f"go {d}": j for d, j in exits} for exits in maze.exits]


class _KeyMazeView:
    """The same for one key-maze task: state = room + num_rooms * carries key (``key_layout.StateGraph``)."""

    kind = "key_maze"

    def __init__(self, maze: Maze, task: KeyTask):
        graph = key_state_graph(maze, task.start, task.key, task.goal, (task.fork, task.gate))
        self.maze = maze
        self.room_of = [graph.room(s) for s in range(len(graph.moves))]
        self.carries_key = [graph.has_key(s) for s in range(len(graph.moves))]
        self.observations = [
            f"You are in the {maze.names[r]}.{_CARRIES if k else ''}"
            for r, k in zip(self.room_of, self.carries_key, strict=True)
        ]
        self.admissible = [tuple(f"go {d}" for d, _ in moves) for moves in graph.moves]
        self.moves = [{f"go {d}": j for d, j in moves} for moves in graph.moves]
