"""The env protocol: what every env of this project promises the trainer, checked in one place.

The trainer (``gagpo_rllib``) plays any env that follows this contract and imports no specific env: it reads the
info keys below, asks the class for its splits and its evaluation layout, and checks both only through
``check_info`` and ``check_env_class``. This module imports nothing of ``gagpo_rllib`` and no specific env.

An env is a ``gymnasium.Env(config: dict)`` with whole-string observations and actions (``envs.spaces.TextSpace``),
``num_tasks`` (the task instances of its configured split, ``config["split"]``), ``reset(options={"task_id": i})``
to play instance i, and a ``prompts`` module in its package with the prompt templates.

Every info, after ``reset`` and after each ``step``, carries ``INFO_KEYS``:

    task                the task text the prompt shows
    task_id             the task instance being played
    admissible_actions  the actions valid now (a list of str; the prompt lists them, constrained decoding keeps to
                        them)
    state_key           the anchor state of GAGPO's step-level groups (hashable; equal keys: the same state)
    won                 whether the episode is won (the final info decides success)
    task_type           the task's type (success per type; one type: any name, e.g. "all")

and optionally ``task_score`` (a 0-1 score of the final step, logged as its mean; WebShop's purchase score) and
``provenance`` (what the env plays on: data, split; shown by evaluation reports).

Class attributes (an env class that lacks one gets the default, see ``check_env_class``):

    splits       the split names ``config["split"]`` accepts (default None: not declared, not checked)
    eval_split   the split that evaluation plays when none is given (default "eval")
    eval_table   an ``EvalTable``: how evaluation lays out the results in the papers' Table-1 row (default: one
                 success column per task type, and All)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "GENERIC_TABLE",
    "INFO_KEYS",
    "PROMPT_INFO_KEYS",
    "PROVENANCE",
    "STATE_KEY",
    "TASK",
    "TASK_ID",
    "TASK_SCORE",
    "TASK_TYPE",
    "UNTYPED",
    "WON",
    "EnvSpec",
    "EvalTable",
    "Outcome",
    "TextEnv",
    "check_env_class",
    "check_info",
    "outcome",
]

# Info keys every info carries.
TASK = "task"
TASK_ID = "task_id"
ADMISSIBLE_ACTIONS = "admissible_actions"
STATE_KEY = "state_key"
WON = "won"
TASK_TYPE = "task_type"
INFO_KEYS: tuple[str, ...] = (TASK, TASK_ID, ADMISSIBLE_ACTIONS, STATE_KEY, WON, TASK_TYPE)
# What building a prompt reads from the current info.
PROMPT_INFO_KEYS: tuple[str, ...] = (TASK, ADMISSIBLE_ACTIONS)
# Optional info keys.
TASK_SCORE = "task_score"
PROVENANCE = "provenance"

GENERIC_NAME = "generic"
# The task type of an env whose infos name none.
UNTYPED = "all"


@dataclass(frozen=True)
class Outcome:
    """How an episode ended, as its env reported it in the final info: the one reading of ``won``, ``task_type``
    and ``task_score`` that rollout metrics, validation and demonstrations share."""

    won: bool
    task_type: str
    task_score: float | None = None


def outcome(final_info: Mapping[str, Any]) -> Outcome:
    """The ``Outcome`` in an episode's final info (not won, type ``UNTYPED`` and no score where keys are absent)."""
    score = final_info.get(TASK_SCORE)
    return Outcome(
        won=bool(final_info.get(WON, False)),
        task_type=str(final_info.get(TASK_TYPE, UNTYPED)),
        task_score=None if score is None else float(score),
    )


@dataclass(frozen=True)
class EvalTable:
    """How evaluation lays out an env's results in the papers' Table-1 row (all numbers are percentages).

    ``name``: the layout's name in reports. ``task_type_columns``: task_type -> column, in column order; the row is
    success per column and "All" (a column without episodes shows as "-"). ``score``: the row is "score" (mean
    final ``task_score`` x 100) and "success". Neither: one success column per task type seen, sorted, and "All".
    A layout applies only when the episodes fit it (every task type has a column; every episode has a score);
    otherwise evaluation falls back to the generic row.
    """

    name: str = GENERIC_NAME
    task_type_columns: Mapping[str, str] = field(default_factory=dict)
    score: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"EvalTable.name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.task_type_columns, Mapping):
            raise TypeError(
                f"EvalTable.task_type_columns must be a mapping task_type -> column, got "
                f"{type(self.task_type_columns).__name__}"
            )
        bad = [c for c in self.task_type_columns.values() if not isinstance(c, str) or not c or c == "All"]
        if bad:
            raise ValueError(
                f"EvalTable.task_type_columns: columns must be non-empty str other than 'All', got {bad}"
            )
        if self.task_type_columns and self.score:
            raise ValueError("EvalTable: give task_type_columns or score, not both")
        if (self.task_type_columns or self.score) and self.name == GENERIC_NAME:
            raise ValueError(
                f"EvalTable.name: a layout with columns or a score needs a name other than {GENERIC_NAME!r}"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        """The row's columns in order (by task type: its columns and All; score: score and success; else ())."""
        if self.score:
            return ("score", "success")
        if self.task_type_columns:
            return (*dict.fromkeys(self.task_type_columns.values()), "All")
        return ()

    @property
    def success_column(self) -> str:
        """The column that holds the overall success."""
        return "success" if self.score else "All"


GENERIC_TABLE = EvalTable()


@dataclass(frozen=True)
class EnvSpec:
    """An env class's protocol attributes, checked, with the defaults filled in."""

    name: str
    splits: tuple[str, ...] | None = None
    eval_split: str = "eval"
    eval_table: EvalTable = GENERIC_TABLE

    def check_split(self, split: Any, what: str = "split") -> str:
        """``split`` when the env declares it (or declares no splits); else a ValueError naming ``what``."""
        if not isinstance(split, str) or not split:
            raise ValueError(f"{what} must be a non-empty str, got {split!r}")
        if self.splits is not None and split not in self.splits:
            raise ValueError(f"{what} {split!r}: {self.name} has the splits {list(self.splits)}")
        return split


class TextEnv(Protocol):
    """The typed protocol of an env class (instances: ``num_tasks``, ``reset``, ``step``; class: metadata)."""

    splits: ClassVar[tuple[str, ...]]
    eval_split: ClassVar[str]
    eval_table: ClassVar[EvalTable]

    @property
    def num_tasks(self) -> int: ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...


_CLASS_ATTRIBUTES = ("splits", "eval_split", "eval_table")
_INSTANCE_MEMBERS = ("num_tasks", "reset", "step")


def check_info(info: Any, keys: Iterable[str] = INFO_KEYS, *, where: str = "") -> Mapping[str, Any]:
    """``info`` itself when it holds every key of ``keys``; else a KeyError naming the missing key(s).

    ``where`` (e.g. " at step 3 of episode x") goes into the message after "env info".
    """
    if not isinstance(info, Mapping):
        raise TypeError(f"env info{where} must be a dict (env protocol), got {type(info).__name__}")
    missing = [k for k in keys if k not in info]
    if missing:
        raise KeyError(
            f"env info{where} lacks required key(s) {missing} (env protocol, envs/protocol.py); "
            f"got keys {sorted(map(str, info))}"
        )
    return info


def check_env_class(env: Any, *, strict: bool = False) -> EnvSpec:
    """The protocol attributes of env class ``env``, checked; a missing attribute takes its default.

    ``env`` that is not a class (an env registered by name) gets every default. ``strict``: the class must be a
    class that declares every attribute and has ``num_tasks``, ``reset`` and ``step`` (the bundled envs do).
    A bad attribute raises naming ``<Class>.<attribute>``.
    """
    if not isinstance(env, type):
        if strict:
            raise TypeError(f"env protocol: expected an env class, got {env!r}")
        return EnvSpec(name=str(env))
    name = env.__name__
    if strict:
        missing = [a for a in (*_CLASS_ATTRIBUTES, *_INSTANCE_MEMBERS) if not hasattr(env, a)]
        if missing:
            raise TypeError(f"{name} does not follow the env protocol (envs/protocol.py): it lacks {missing}")
    splits = getattr(env, "splits", None)
    if splits is not None:
        if (
            isinstance(splits, str)
            or not isinstance(splits, Iterable)
            or not all(isinstance(s, str) and s for s in splits)
        ):
            raise TypeError(f"{name}.splits must be a tuple of non-empty str, got {splits!r}")
        splits = tuple(splits)
        if not splits or len(set(splits)) != len(splits):
            raise ValueError(f"{name}.splits must name at least one split, each once, got {splits!r}")
    eval_split = getattr(env, "eval_split", "eval")
    if not isinstance(eval_split, str) or not eval_split:
        raise TypeError(f"{name}.eval_split must be a non-empty str, got {eval_split!r}")
    if splits is not None and eval_split not in splits:
        raise ValueError(f"{name}.eval_split {eval_split!r} is not one of {name}.splits {list(splits)}")
    eval_table = getattr(env, "eval_table", GENERIC_TABLE)
    if not isinstance(eval_table, EvalTable):
        raise TypeError(f"{name}.eval_table must be an envs.protocol.EvalTable, got {eval_table!r}")
    return EnvSpec(name=name, splits=splits, eval_split=eval_split, eval_table=eval_table)
