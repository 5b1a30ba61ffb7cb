"""Which episodes an iteration, a dynamic-sampling round or an evaluation plays, and the seeds they play with.

Every plan is a pure function of its seeds, so a restored or replayed run plays the same task instances: training
draws N tasks per iteration (``task_plan``), dynamic sampling draws extra groups per round (``extra_plan``),
evaluation plays all or a seeded subset of its split (``evaluation_plan``). The seeds that make a sample
reproducible come from here too: each episode's env seed (in the plan), its generation seed per attempt
(``episode_gen_seed``, never from the runner that plays it), validation's generation base (``validation_seed``)
and the learners' minibatch shuffle (``shuffle_rng``). The salts and the seed hashes are in
``gagpo_rllib.method.seeds``, the one place every layer may import (the generation backends' ``mix_seed`` too).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from gagpo_rllib.method.seeds import (
    EVALUATION_SALT,
    EXTRA_PLAN_SALT,
    TASK_PLAN_SALT,
    derive_seed,
    salted_rng,
    shuffle_rng,
)
from gagpo_rllib.rllib.env_runner import PlannedEpisode

__all__ = [
    "EXTRA_GROUP_ID_BASE",
    "EvaluationPlanSettings",
    "derive_seed",
    "episode_gen_seed",
    "evaluation_plan",
    "extra_plan",
    "shuffle_rng",
    "task_plan",
    "validation_seed",
]

logger = logging.getLogger(__name__)

# Extra groups' ids start here: above every plan's id (iteration x N + g), distinct in the low 32 bits that
# derive_seed uses.
EXTRA_GROUP_ID_BASE = 1 << 31


def task_plan(
    num_tasks: int, *, groups: int, group_size: int, seed: int, iteration: int
) -> list[PlannedEpisode]:
    """N task instances x K episodes for one iteration, a pure function of (seed, iteration).

    Tasks are drawn without replacement while N <= num_tasks. Group ids are unique over iterations.
    """
    if num_tasks < 1:
        raise ValueError(f"env.num_tasks must be >= 1, got {num_tasks}")
    rng = np.random.default_rng(
        np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(iteration), TASK_PLAN_SALT])
    )
    tasks = rng.choice(num_tasks, size=groups, replace=groups > num_tasks)
    return [
        PlannedEpisode(
            group_id=iteration * groups + g,
            task_id=int(task),
            member=k,
            env_seed=derive_seed(seed, iteration, g, k),
        )
        for g, task in enumerate(tasks)
        for k in range(group_size)
    ]


def extra_plan(
    num_tasks: int,
    *,
    groups: int,
    group_size: int,
    seed: int,
    iteration: int,
    round_index: int,
    first_group_id: int,
) -> list[PlannedEpisode]:
    """``groups`` new task instances x K episodes for extra round ``round_index`` (>= 1) of an iteration.

    Tasks come from a stream of their own per (seed, iteration, round), with replacement (a task can be drawn
    again: its new rollouts may disagree). Group ids run from ``first_group_id``.
    """
    if round_index < 1:
        raise ValueError(f"extra_plan: round_index must be >= 1, got {round_index}")
    if num_tasks < 1:
        raise ValueError(f"env.num_tasks must be >= 1, got {num_tasks}")
    rng = np.random.default_rng(
        np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(iteration), EXTRA_PLAN_SALT, int(round_index)])
    )
    tasks = rng.integers(0, num_tasks, size=groups)
    return [
        PlannedEpisode(
            group_id=first_group_id + g,
            task_id=int(task),
            member=k,
            env_seed=derive_seed(seed, iteration, first_group_id + g, k),
        )
        for g, task in enumerate(tasks)
        for k in range(group_size)
    ]


class EvaluationPlanSettings(Protocol):
    """What an evaluation plan needs of ``gagpo_rllib.rllib.evaluation.EvalSettings``."""

    num_tasks: int | None
    episodes_per_task: int
    seed: int


def evaluation_plan(num_tasks_in_split: int, settings: EvaluationPlanSettings) -> list[PlannedEpisode]:
    """Which tasks to play: all of the split, or ``num_tasks`` of them drawn without replacement from the seed.

    Each task is a group of ``episodes_per_task`` episodes (group id: the task's rank in the plan).
    """
    if num_tasks_in_split < 1:
        raise ValueError(f"the evaluation split has no task (env.num_tasks = {num_tasks_in_split})")
    if settings.num_tasks is not None and settings.num_tasks > num_tasks_in_split:
        logger.warning(
            "evaluation: %d tasks asked (--num-tasks) but the split has only %d: playing all %d",
            settings.num_tasks,
            num_tasks_in_split,
            num_tasks_in_split,
        )
    if settings.num_tasks is None or settings.num_tasks >= num_tasks_in_split:
        tasks = list(range(num_tasks_in_split))
    else:
        rng = salted_rng(settings.seed, EVALUATION_SALT)
        tasks = sorted(int(t) for t in rng.choice(num_tasks_in_split, size=settings.num_tasks, replace=False))
    return [
        PlannedEpisode(group_id=g, task_id=t, member=k, env_seed=derive_seed(settings.seed, t, k))
        for g, t in enumerate(tasks)
        for k in range(settings.episodes_per_task)
    ]


def episode_gen_seed(seed: int, iteration: int, episode: PlannedEpisode, attempt: int) -> int:
    """The generation seed of one planned episode's ``attempt``: the same whichever runner plays it."""
    return derive_seed(seed, iteration, episode.group_id, episode.member, attempt)


def validation_seed(seed: int) -> int:
    """The base of validation's generation seeds (``episode_gen_seed``), apart from training's for one seed."""
    return derive_seed(seed, EVALUATION_SALT)
