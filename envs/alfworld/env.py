"""ALFWorld as a gymnasium text environment on the real engine, playing downloaded or bundled games.

Config keys (one dict, as RLlib passes env_config):
    split          "train" (default), "valid_seen" or "valid_unseen"
    data_dir       folder in ALFWorld's layout (``$ALFWORLD_DATA`` or its ``json_2.1.1``); default: the bundled games
    seed           seed of the game draws when ``reset`` gets no seed (default 0)
    max_steps      steps before truncation (default 50)
    success_reward reward on the winning step (default 10.0)
    task_types     optional list of task types to keep
    facts          put the engine's PDDL facts in ``info["facts"]`` (for an expert that reads the game state,
                   e.g. ALFWorld's hand-coded one; default False)

``state_key`` (the anchor state for GAGPO's step-level groups) is the current observation text, as the GiGPO
reference does: within a group every rollout plays the same game, so equal texts mean the agent sees the same
situation. It is coarse on purpose ("Nothing happens." after different invalid commands is one anchor state).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.alfworld.games import BUNDLED_DATA, SPLITS, GameRecord, find_games, read_game
from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES, task_type_from_path
from envs.protocol import EvalTable
from envs.spaces import TextSpace

__all__ = ["AlfworldEnv", "INVALID_FEEDBACK"]

log = logging.getLogger(__name__)

INVALID_FEEDBACK = "Nothing happens."
TASK_MARKER = "Your task is to: "
HIDDEN_ACTIONS = frozenset({"help"})  # offered by ALFWorld, useless to an agent (as in the GiGPO reference)
DEFAULTS: dict[str, Any] = {
    "split": "train",
    "data_dir": None,
    "seed": 0,
    "max_steps": 50,
    "success_reward": 10.0,
    "task_types": None,
    "facts": False,
}


def _task_text(first_observation: str) -> str:
    _, _, tail = first_observation.partition(TASK_MARKER)
    return tail.strip().rstrip(".").strip()


def normalize_command(command: str) -> str:
    """ALFWorld's commands are lower case with single spaces."""
    return " ".join(command.strip().lower().split())


class AlfworldEnv(gym.Env):
    """One ALFWorld game per episode; see the module docstring for the config keys and the anchor state."""

    metadata = {"render_modes": []}
    # Env protocol (envs/protocol.py): the papers evaluate on valid_unseen, with success per task type (Pick, Look,
    # Clean, Heat, Cool, Pick2) and All.
    splits = SPLITS
    eval_split = "valid_unseen"
    eval_table = EvalTable(name="alfworld", task_type_columns=SHORT_NAMES)

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown AlfworldEnv config key(s) {unknown}; known: {sorted(DEFAULTS)}")
        cfg = {**DEFAULTS, **config}
        self.max_steps = int(cfg["max_steps"])
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {cfg['max_steps']!r}")
        self.success_reward = float(cfg["success_reward"])
        self._facts = bool(cfg["facts"])
        self._seed = int(cfg["seed"])
        data_dir = Path(cfg["data_dir"]) if cfg["data_dir"] is not None else BUNDLED_DATA
        game_set = find_games(data_dir, cfg["split"])
        games = game_set.games
        if cfg["task_types"] is not None:
            wanted = set(cfg["task_types"])
            bad = sorted(wanted - set(TASK_TYPES))
            if bad:
                raise ValueError(f"unknown task_types {bad}; expected some of {TASK_TYPES}")
            games = tuple(g for g in games if g.task_type in wanted)
            if not games:
                raise ValueError(f"no game of task_types {sorted(wanted)} under {game_set.root}")
        self.games: tuple[GameRecord, ...] = games
        self.skipped_games = game_set.skipped
        self._index = {str(Path(g.game_file).resolve()): i for i, g in enumerate(games)}

        self.observation_space = TextSpace()
        self.action_space = TextSpace()

        from envs.alfworld.engine import AlfredEngine  # the engine imports alfworld and textworld

        self._engine = AlfredEngine(facts=self._facts)
        self._game_data: OrderedDict[str, dict] = OrderedDict()
        self._seeded = False
        self._done = True
        self._steps = 0
        self._obs = ""
        self._info: dict[str, Any] = {}
        self.engine_errors = 0

    @property
    def num_tasks(self) -> int:
        return len(self.games)

    def _load(self, game_file: str) -> dict:
        if game_file in self._game_data:
            self._game_data.move_to_end(game_file)
            return self._game_data[game_file]
        data = read_game(game_file)
        self._game_data[game_file] = data
        if len(self._game_data) > 256:
            self._game_data.popitem(last=False)
        return data

    def _pick(self, options: dict | None) -> tuple[int, str, str]:
        """(task_id, game_file, task_type) for this episode; task_id is -1 for a file outside the split."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"task_id", "game_file"})
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown}; known: ['game_file', 'task_id']")
        if "task_id" in options and "game_file" in options:
            raise ValueError("reset options: give either 'task_id' or 'game_file', not both")
        if "game_file" in options:
            path = str(Path(options["game_file"]))
            task_id = self._index.get(str(Path(path).resolve()), -1)
            task_type = (
                self.games[task_id].task_type if task_id >= 0 else task_type_from_path(path) or "unknown"
            )
            return task_id, path, task_type
        if "task_id" in options:
            task_id = int(options["task_id"])
            if not 0 <= task_id < self.num_tasks:
                raise ValueError(f"task_id {task_id} out of range [0, {self.num_tasks})")
        else:
            task_id = int(self.np_random.integers(self.num_tasks))
        game = self.games[task_id]
        return task_id, game.game_file, game.task_type

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        if seed is None and not self._seeded:
            seed = self._seed
        super().reset(seed=seed)
        self._seeded = True
        task_id, game_file, task_type = self._pick(options)
        data = self._load(game_file)
        try:
            self._engine.load(data, game_file)
            state = self._engine.reset()
        except Exception as err:
            raise ValueError(
                f"ALFWorld engine could not start game {game_file}: {type(err).__name__}: {err}"
            ) from err
        self._steps = 0
        self._done = False
        self._obs = str(state.feedback)
        self._info = {
            "task": _task_text(self._obs),
            "task_id": task_id,
            "task_type": task_type,
            "game_file": game_file,
        }
        return self._obs, self._make_info(state)

    def _make_info(self, state: Any, engine_error: str | None = None) -> dict:
        commands = list(state["admissible_commands"]) if state is not None else []
        return {
            **self._info,
            "admissible_commands": commands,
            "admissible_actions": [c for c in commands if c not in HIDDEN_ACTIONS],
            "won": bool(state["won"]) if state is not None else False,
            "state_key": self._obs,
            "steps": self._steps,
            "engine_error": engine_error,
            **({"facts": list(state["facts"]) if state is not None else []} if self._facts else {}),
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("AlfworldEnv.step called on a finished episode: call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"AlfworldEnv action must be a str, got {type(action).__name__}")
        self._steps += 1
        try:
            state = self._engine.step(normalize_command(action))
        except Exception as err:  # an engine failure ends this episode, never the process
            self.engine_errors += 1
            message = f"{type(err).__name__}: {err}"
            log.warning(
                "ALFWorld engine error in %s at step %d: %s", self._info["game_file"], self._steps, message
            )
            self._done = True
            return self._obs, 0.0, False, True, self._make_info(None, engine_error=message)
        self._obs = str(state.feedback)
        won = bool(state["won"])
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        reward = self.success_reward if won else 0.0
        return self._obs, reward, won, truncated, self._make_info(state)
