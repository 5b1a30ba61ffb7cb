"""Finding and reading ALFWorld games: the user's downloaded data set and the bundled games share this loader.

Layout: ``<root>/<split>/<task>-<obj>-<mrecep>-<recep>-<scene>/trial_*/{game.tw-pddl, traj_data.json}``, where
``<root>`` is ``$ALFWORLD_DATA/json_2.1.1`` for the downloaded set (splits train, valid_seen, valid_unseen) or
this package's ``data`` folder (splits train, valid_unseen). ALFWorld's own filtering applies: a game is kept only
if its traj_data.json names a known task type and pddl_params, its game file says ``"solvable": true``, and its path
contains neither ``movable`` nor ``Sliced``. Skipped games are counted and logged, never silently dropped.

A game file may omit ``pddl_domain`` and ``grammar`` (the bundled games do, to stay small): they are then read from
the alfworld wheel, with the goal text from traj_data.json filled into the grammar as ALFWorld does.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from envs.alfworld.tasks import TASK_TYPES
from envs.alfworld.wheel import read_domain, read_grammar

__all__ = ["BUNDLED_DATA", "SPLITS", "GameRecord", "GameSet", "find_games", "full_game_data", "read_game"]

log = logging.getLogger(__name__)

BUNDLED_DATA = Path(__file__).resolve().parent / "data"
SPLITS = ("train", "valid_seen", "valid_unseen")
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"


@dataclass(frozen=True)
class GameRecord:
    game_file: str
    task_type: str
    traj_data: dict


@dataclass(frozen=True)
class GameSet:
    """The playable games of one split, in sorted path order, and why the others were skipped."""

    root: Path
    split: str
    games: tuple[GameRecord, ...]
    skipped: dict[str, int]


def _split_dir(data_dir: str | Path, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"ALFWorld data directory not found: {root}")
    if (root / "json_2.1.1").is_dir():
        root = root / "json_2.1.1"
    split_dir = root / split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"split {split!r} not found: no directory {split_dir}")
    return split_dir


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"corrupt or unreadable ALFWorld file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"corrupt ALFWorld file {path}: expected a JSON object, got {type(data).__name__}")
    return data


def find_games(data_dir: str | Path, split: str) -> GameSet:
    """All playable games of ``split`` under ``data_dir``; raises if the folder is missing or holds none."""
    split_dir = _split_dir(data_dir, split)
    games: list[GameRecord] = []
    skipped: Counter[str] = Counter()
    for traj_path in sorted(split_dir.rglob(TRAJ_FILE)):
        folder = traj_path.parent
        rel = str(folder.relative_to(split_dir))
        if "movable" in rel or "Sliced" in rel:
            skipped["movable or sliced"] += 1
            continue
        traj = _read_json(traj_path)
        if traj.get("task_type") not in TASK_TYPES or "pddl_params" not in traj:
            skipped["unsupported task type"] += 1
            continue
        game_path = folder / GAME_FILE
        if not game_path.is_file():
            skipped["missing game file"] += 1
            continue
        solvable = _read_json(game_path).get("solvable")
        if solvable is not True:
            skipped["not solvable" if solvable is False else "missing solvable flag"] += 1
            continue
        games.append(GameRecord(str(game_path), traj["task_type"], traj))
    if skipped:
        log.info("%s: kept %d games, skipped %s", split_dir, len(games), dict(skipped))
    if not games:
        raise ValueError(
            f"no playable ALFWorld game under {split_dir} (skipped: {dict(skipped) or 'none found'})"
        )
    return GameSet(split_dir, split, tuple(games), dict(skipped))


def full_game_data(game: dict, traj_data: dict | None) -> dict:
    """A game dict the engine can load: domain and grammar come from the wheel when the file leaves them out."""
    if "pddl_problem" not in game:
        raise ValueError("game data has no 'pddl_problem'")
    out = dict(game)
    if not out.get("pddl_domain"):
        out["pddl_domain"] = read_domain()
    if not out.get("grammar"):
        task = (traj_data or {}).get("task_desc")
        if not task:
            raise ValueError("game data has no grammar and its traj_data.json has no 'task_desc'")
        out["grammar"] = read_grammar().replace("UNKNOWN GOAL", task)
    return out


def read_game(game_file: str | Path) -> dict:
    """Load one game file (and its traj_data.json when the grammar must be rebuilt); errors name the path."""
    path = Path(game_file)
    if not path.is_file():
        raise FileNotFoundError(f"ALFWorld game file not found: {path}")
    game = _read_json(path)
    traj_path = path.parent / TRAJ_FILE
    traj = _read_json(traj_path) if traj_path.is_file() else None
    try:
        return full_game_data(game, traj)
    except ValueError as err:
        raise ValueError(f"corrupt ALFWorld game {path}: {err}") from err
