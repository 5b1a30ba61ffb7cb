"""The ALFWorld CPU default's warm start: a tiny policy, behaviour-cloned on walkthroughs, as a cached set-up step.

``AlfworldWarmStart`` names its folders when the config is written and fills them only when training starts
(``GAGPOConfig.callbacks(on_setup_start=...)``): the tiny policy, its tokenizer trained on the texts of every
bundled train game, then fine-tuned on the walkthroughs of most of them (``rllib sft``'s ``finetune``), and a data
folder holding the train games kept out of it, on which GAGPO trains. Each part is cached on disk by a digest of
its inputs, so a second run reuses it and reading the config (Tune sweeps, tests) costs nothing.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.alfworld import SHORT_NAMES, TASK_TYPES
from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.prompts import (
    CONSTRAINED_FIRST_PROMPT_TEMPLATE,
    CONSTRAINED_PROMPT_TEMPLATE,
    FIRST_PROMPT_TEMPLATE,
    PROMPT_TEMPLATE,
)
from gagpo_rllib.policy.models import inputs_digest
from gagpo_rllib.tools.demonstrations import DemoSet, alfworld_demonstrations
from gagpo_rllib.tools.sft import SFTSettings, finetune
from gagpo_rllib.tools.tiny_policies import alfworld_tiny_policy

__all__ = [
    "VALID_SPLIT",
    "WARM_START_SETTINGS",
    "AlfworldWarmStart",
    "ValidationAgainstWarmStart",
    "format_before_after",
    "gagpo_data_dir",
    "gagpo_train_games",
    "split_games",
    "validate_warm_start",
    "warm_start",
]

VALID_SPLIT = "valid_unseen"
# Of each task type, GAGPO_GAMES_PER_TYPE bundled train games are kept out of the warm start for GAGPO.
GAGPO_GAMES_PER_TYPE = 3
WARM_START_SETTINGS = SFTSettings(epochs=30, lr=2e-3, batch_size=16, heldout_fraction=0.1, history_length=2)


def bundled_train_games() -> list[Path]:
    """Game files of the bundled train split, in the env's task-id order."""
    return [Path(g.game_file) for g in find_games(BUNDLED_DATA, "train").games]


@functools.cache
def train_demonstrations() -> DemoSet:
    """Every bundled train game's walkthrough replayed through the env (about a minute; done once a process)."""
    return alfworld_demonstrations({"split": "train"})


def split_games(per_type: int = GAGPO_GAMES_PER_TYPE, *, seed: int = 0) -> tuple[list[int], list[int]]:
    """(warm-start games, GAGPO games): task ids of the bundled train split; ``per_type`` games of each task
    type, drawn from ``seed``, are kept out of the warm start for GAGPO."""
    games = find_games(BUNDLED_DATA, "train").games
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA1F]))
    gagpo: list[int] = []
    for task_type in TASK_TYPES:
        ids = [i for i, g in enumerate(games) if g.task_type == task_type]
        gagpo += sorted(int(i) for i in rng.permutation(ids)[:per_type])
    held = set(gagpo)
    return [i for i in range(len(games)) if i not in held], sorted(gagpo)


def gagpo_train_games(held_out: list[int], per_type: int = 1) -> list[int]:
    """The first ``per_type`` held-out games of each task type (all of them when ``per_type`` is larger)."""
    games = find_games(BUNDLED_DATA, "train").games
    chosen: list[int] = []
    for task_type in TASK_TYPES:
        chosen += [i for i in sorted(held_out) if games[i].task_type == task_type][:per_type]
    return sorted(chosen)


def gagpo_data_dir(task_ids: list[int], out_dir: Path) -> Path:
    """A data folder in ALFWorld's layout whose train split holds only ``task_ids`` (copies of the bundled
    games) and whose valid_unseen is the bundled one; rewritten when the selection changes."""
    games = bundled_train_games()
    chosen = [games[i].parent for i in task_ids]
    marker = out_dir / "selection.json"
    selection = [str(p.relative_to(BUNDLED_DATA)) for p in chosen]
    if marker.is_file() and json.loads(marker.read_text()) == selection:
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for folder, rel in zip(chosen, selection, strict=True):
        shutil.copytree(folder, out_dir / rel)
    shutil.copytree(BUNDLED_DATA / VALID_SPLIT, out_dir / VALID_SPLIT)
    marker.write_text(json.dumps(selection))
    return out_dir


def warm_start(
    policy: Path, task_ids: list[int], out_dir: Path, *, settings: SFTSettings = WARM_START_SETTINGS
) -> Path:
    """The tiny policy fine-tuned on the walkthroughs of ``task_ids`` (cached by its inputs)."""
    games = bundled_train_games()
    # The templates RL uses with this decoding mode (constrained: the tag-free ones).
    first, later = (
        (CONSTRAINED_FIRST_PROMPT_TEMPLATE, CONSTRAINED_PROMPT_TEMPLATE)
        if settings.constrained
        else (FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE)
    )
    key = inputs_digest(
        files=[policy / "model.safetensors", policy / "tokenizer.json", *(games[i] for i in task_ids)],
        texts=[json.dumps(asdict(settings), sort_keys=True), first, later],
    )
    wanted = set(task_ids)

    def demos() -> DemoSet:
        demo_set = train_demonstrations()
        return DemoSet([d for d in demo_set.demonstrations if d.task_id in wanted], demo_set.skipped)

    finetune(policy, demos, out_dir, first_template=first, template=later, settings=settings, cache_key=key)
    return out_dir


@dataclass(frozen=True)
class AlfworldWarmStart:
    """The set-up step of the CPU default (``on_setup_start``): builds the tiny policy in ``policy_dir`` and, with
    ``warm``, fine-tunes it into ``model_dir`` and writes the GAGPO games into ``data_dir``; all cached."""

    policy_dir: Path
    warm: bool = True
    settings: SFTSettings = field(default_factory=lambda: WARM_START_SETTINGS)
    train_games_per_type: int = 1
    vocab_size: int = 1024
    seed: int = 0

    @property
    def model_dir(self) -> Path:
        """The policy GAGPO starts from: the warm start's folder, else the bare tiny policy's."""
        return (
            self.policy_dir.with_name(self.policy_dir.name + "_warm_start") if self.warm else self.policy_dir
        )

    @property
    def data_dir(self) -> Path | None:
        """The data folder of the GAGPO games (None without the warm start: every bundled train game)."""
        return self.policy_dir.with_name(self.policy_dir.name + "_gagpo_games") if self.warm else None

    def gagpo_games(self) -> list[int]:
        """Task ids (bundled train split) of the games GAGPO trains on, none of them seen by the warm start."""
        return gagpo_train_games(split_games()[1], self.train_games_per_type)

    def __call__(self, config: Any = None, **kwargs: Any) -> Path:
        """Make ``model_dir`` (and ``data_dir``) ready; nothing to do for a config that plays another model."""
        if config is not None and str(config.model_path) != str(self.model_dir):
            return Path(config.model_path)
        print(f"ALFWorld tiny policy: {self.policy_dir} (cached by its corpus)", flush=True)
        policy = alfworld_tiny_policy(
            self.policy_dir, vocab_size=self.vocab_size, seed=self.seed, demonstrations=train_demonstrations
        )
        if not self.warm:
            return policy
        warm_ids, _ = split_games()
        print(
            f"ALFWorld warm start: behaviour cloning on the walkthroughs of {len(warm_ids)} train games into "
            f"{self.model_dir} (cached by its inputs)",
            flush=True,
        )
        warm_start(policy, warm_ids, self.model_dir, settings=self.settings)
        gagpo_data_dir(self.gagpo_games(), self.data_dir)
        print("ALFWorld warm start ready; GAGPO starts from it", flush=True)
        return self.model_dir


def format_before_after(before: dict[str, float], after: dict[str, float], label: str) -> str:
    """Success per task type (percent) of the warm start and of ``label``, from two validation results."""
    names = [*(SHORT_NAMES[t] for t in TASK_TYPES), "All"]

    def cell(table: dict[str, float], name: str) -> str:
        value = table.get("success" if name == "All" else f"by_type/{name}", math.nan)
        return "-" if math.isnan(value) else f"{100 * value:.1f}"

    rows = [
        ["", *names],
        ["warm start", *(cell(before, n) for n in names)],
        [label, *(cell(after, n) for n in names)],
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(names) + 1)]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


class ValidationAgainstWarmStart:
    """The validation function, printing after each validation the per-task-type success of the warm start
    (the validation played when the algorithm starts) next to the latest one."""

    def __init__(self, validate):
        self.validate = validate
        self.before: dict[str, float] | None = None

    def __call__(self, algorithm, eval_group):
        out = self.validate(algorithm, eval_group)
        table = out[0]["valid"]
        if self.before is None:
            self.before = dict(table)
        else:
            # Called inside the training step, before the algorithm counts the iteration just trained.
            label = f"iteration {algorithm.iteration + 1}"
            print(
                f"{VALID_SPLIT} success by task type:\n{format_before_after(self.before, table, label)}",
                flush=True,
            )
        return out


def validate_warm_start(algorithm, **kwargs) -> None:
    """Play the validation once before training, so the curve and the table start at the warm start."""
    algorithm.evaluate()
