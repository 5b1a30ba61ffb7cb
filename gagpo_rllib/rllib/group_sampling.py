"""Grouped sampling that survives lost EnvRunners and failing environments: only whole groups come back.

One iteration's plan (N groups x K members) is played in rounds. In each round the members still missing go to
the remote EnvRunners that are healthy now: with per-episode rollouts (``rollout_schedule="per_episode"``) as a
queue of whole groups that each runner takes from whenever it has a free sub-env (``GroupQueue``), so a runner
that finishes early takes the next group instead of idling; in lock-step, as contiguous shares (so a group may
span runners). The round collects what comes back. A member is done when its episode ended without an env
error; a group is complete when all K members are done. Members lost with a runner (killed, restarted, timed out) or ended by an env error are played again in
the next round, on whichever runners are healthy or restored by then, with ``attempt`` + 1: generation seeds
derive from (seed, iteration, group, member, attempt) and the step, never from the runner. After
``max_group_attempts`` rounds or ``group_sampling_timeout_s`` seconds, incomplete groups are dropped whole (and
logged); an update never sees a partial group.

No healthy remote runner: the local runner plays when it has an env (``create_env_on_local_worker=True``),
otherwise the round waits for RLlib to restore a runner (``Algorithm.restore_env_runners``, polled) until the
deadline. Nothing left at the end: the caller skips the update with a warning, except when every episode played
in the iteration ended with an env error, or every runner call raised: then a deterministic failure is the likely
cause and ``GroupSamplingError`` names it (after the bounded attempts, instead of looping).

The function sent to a runner never raises (an exception inside ``foreach_env_runner``'s function makes RLlib's
actor sleep ``delay_between_env_runner_restarts_s`` and exit): it returns the error's traceback instead. A runner
that restarted behind RLlib's back (a call served by the fresh process) holds the initial weights; it is found by
its weights' sequence number, re-synced, and its share is played again.

**Plans**: which episodes an iteration, a dynamic-sampling round or an evaluation plays, and the seeds they play
with. Every plan is a pure function of its seeds, so a restored or replayed run plays the same task instances: training
draws N tasks per iteration (``task_plan``), dynamic sampling draws extra groups per round (``extra_plan``),
evaluation plays all or a seeded subset of its split (``evaluation_plan``). The seeds that make a sample
reproducible come from here too: each episode's env seed (in the plan), its generation seed per attempt
(``episode_gen_seed``, never from the runner that plays it), validation's generation base (``validation_seed``)
and the learners' minibatch shuffle (``shuffle_rng``). The salts and the seed hashes are in
``gagpo_rllib.method.seeds``, the one place every layer may import (the generation backends' ``mix_seed`` too).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import ray

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.seeds import (
    EVALUATION_SALT,
    EXTRA_PLAN_SALT,
    TASK_PLAN_SALT,
    derive_seed,
    salted_rng,
)
from gagpo_rllib.rllib.env_runner import PlannedEpisode, RolloutStats, episode_env_error

__all__ = [
    "EvaluationPlanSettings",
    "GroupQueue",
    "GroupSample",
    "GroupSamplingError",
    "PlanQueue",
    "RunnerResult",
    "EXTRA_GROUP_ID_BASE",
    "ask_env_runner",
    "episode_gen_seed",
    "evaluation_plan",
    "extra_plan",
    "sample_whole_groups",
    "split_plan",
    "task_plan",
    "validation_seed",
    "whole_groups",
]

logger = logging.getLogger(__name__)

# How often an iteration without any healthy remote runner asks RLlib to restore one.
RESTORE_POLL_S = 1.0


class GroupSamplingError(RuntimeError):
    """Every episode of an iteration failed the same way (env errors or runner exceptions) after all attempts."""


@dataclass
class RunnerResult:
    """What one runner call returns: the episodes it played, or why it played none."""

    worker_index: int
    episodes: list = field(default_factory=list)
    stats: RolloutStats | None = None
    metrics: Any = None
    error: str | None = None  # the traceback of an exception inside the call
    stale: bool = False  # the runner held older weights than the driver (it restarted unnoticed)
    pid: int = 0


@dataclass
class GroupSample:
    """The whole groups of one iteration and what it took to get them."""

    episodes: list  # complete groups only, ordered by (group id, member)
    stats: list[RolloutStats]
    runner_metrics: list
    groups_planned: int
    groups_complete: int
    groups_replayed: int  # groups with at least one member played again
    groups_dropped: list[int]  # ids of the groups still incomplete after the attempts
    env_errors: int
    runner_failures: int  # runner calls that returned nothing (lost, timed out) or found a restarted runner
    attempts: int  # rounds played

    def metrics(self) -> dict[str, float]:
        """The ``gagpo/`` values this iteration reports."""
        return {
            "groups_planned": float(self.groups_planned),
            "groups_complete": float(self.groups_complete),
            "groups_replayed": float(self.groups_replayed),
            "groups_dropped": float(len(self.groups_dropped)),
            "env_errors": float(self.env_errors),
            "runner_failures": float(self.runner_failures),
            "sampling_attempts": float(self.attempts),
        }


def split_plan(plan: list[PlannedEpisode], parts: int) -> list[list[PlannedEpisode]]:
    """Contiguous, balanced shares of the plan (so most groups stay on one runner)."""
    bounds = np.linspace(0, len(plan), parts + 1).round().astype(int)
    return [plan[bounds[i] : bounds[i + 1]] for i in range(parts)]


def whole_groups(items: list[PlannedEpisode]) -> list[list[PlannedEpisode]]:
    """``items`` as whole groups, in the order their groups first appear."""
    groups: dict[int, list[PlannedEpisode]] = {}
    for item in items:
        groups.setdefault(item.group_id, []).append(item)
    return list(groups.values())


class PlanQueue:
    """Whole groups handed out one at a time (``GroupSource``); the local form of ``GroupQueue``."""

    def __init__(self, items: list[PlannedEpisode]) -> None:
        self.groups = whole_groups(items)
        self.taken = 0

    def take(self) -> list[PlannedEpisode]:
        if self.taken >= len(self.groups):
            return []
        self.taken += 1
        return self.groups[self.taken - 1]


@ray.remote(num_cpus=0, max_restarts=-1)
class _GroupQueueActor:
    """The queue of one round's groups, shared by the runners; ``round_id`` keeps a late call of an earlier
    round (a runner timed out but still playing) from taking the next round's groups."""

    def __init__(self) -> None:
        self.round_id = -1
        self.queue = PlanQueue([])

    def fill(self, round_id: int, items: list[PlannedEpisode]) -> None:
        self.round_id, self.queue = round_id, PlanQueue(items)

    def take(self, round_id: int) -> list[PlannedEpisode]:
        return self.queue.take() if round_id == self.round_id else []


@dataclass
class GroupQueue:
    """A runner's handle on the round's queue: ``take`` asks the queue actor for the next group."""

    actor: Any
    round_id: int

    def take(self) -> list[PlannedEpisode]:
        return ray.get(self.actor.take.remote(self.round_id))


def _group_queue(algo: Any, items: list[PlannedEpisode]) -> GroupQueue:
    """The algorithm's queue actor (started on first use, one per Algorithm) filled with this round's groups."""
    actor = getattr(algo, "_group_queue_actor", None)
    if actor is None:
        actor = algo._group_queue_actor = _GroupQueueActor.remote()
    algo._group_queue_rounds = round_id = getattr(algo, "_group_queue_rounds", 0) + 1
    ray.get(actor.fill.remote(round_id, items))
    return GroupQueue(actor, round_id)


def _play_fn(
    share: list[PlannedEpisode],
    explore: bool,
    expected_seq_no: int | None,
    per_episode: bool = False,
    source: Any = None,
):
    """The function sent to a runner: play ``share`` (and the groups it takes from ``source``); never raise (see
    the module docstring)."""

    def play(runner: Any) -> RunnerResult:
        result = RunnerResult(worker_index=int(runner.worker_index), pid=os.getpid())
        try:
            if expected_seq_no is not None and runner.weights_seq_no() != expected_seq_no:
                result.stale = True
                return result
            result.episodes, result.stats = runner.sample_groups(
                share, explore=explore, per_episode=per_episode, source=source
            )
            result.metrics = runner.get_metrics()
        except Exception:  # noqa: BLE001 - reported to the driver instead of killing the actor
            result.error = traceback.format_exc()
        return result

    return play


def _wait_for_runner(algo: Any, deadline: float, group: Any = None) -> list[int]:
    """Poll RLlib's restore until a remote runner of ``group`` (default: the training runners) is healthy again or
    the deadline passes."""
    group = group if group is not None else algo.env_runner_group
    logger.warning("GAGPO: no healthy EnvRunner; waiting for RLlib to restore one")
    while True:
        algo.restore_env_runners(group)
        ids = group.healthy_env_runner_ids()
        if ids or time.monotonic() >= deadline:
            return ids
        time.sleep(min(RESTORE_POLL_S, max(0.0, deadline - time.monotonic())))


def ask_env_runner(
    algo: Any, func: Any, *, timeout_s: float | None = None, env_runner_group: Any = None
) -> Any:
    """``func(runner)`` on one runner with an env: the local one if it has an env, else a healthy remote one.

    Waits for a restored runner while none is healthy (until ``timeout_s``, default the sampling timeout).
    ``env_runner_group``: whose runners (default the training ones).
    """
    group = env_runner_group if env_runner_group is not None else algo.env_runner_group
    local = group.local_env_runner
    if group.num_remote_env_runners() == 0 or (local is not None and local.has_env()):
        return func(local)
    timeout_s = timeout_s if timeout_s is not None else algo.config.group_sampling_timeout_s
    deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
    while True:
        ids = group.healthy_env_runner_ids() or _wait_for_runner(algo, deadline, group)
        if ids:
            answers = group.foreach_env_runner(func, local_env_runner=False, remote_worker_ids=ids[:1])
            if answers:
                return answers[0]
        if time.monotonic() >= deadline:
            raise GroupSamplingError(f"no EnvRunner answered within {timeout_s} s")


def _play_round(
    algo: Any, group: Any, items: list[PlannedEpisode], explore: bool, deadline: float, schedule: str
) -> tuple[list[RunnerResult], int]:
    """Play ``items`` once on ``group``'s runners available now; returns the results and the failed runner calls."""
    local = group.local_env_runner
    per_episode = schedule == "per_episode"
    if group.num_remote_env_runners() == 0:
        return [_play_fn(items, explore, None, per_episode)(local)], 0
    ids = sorted(group.healthy_env_runner_ids())
    if not ids and local is not None and local.has_env():
        logger.warning(
            "GAGPO: no healthy remote EnvRunner; the local EnvRunner plays %d episodes", len(items)
        )
        if algo.learner_group is not None:  # it holds no weights while remote runners sample
            from gagpo_rllib.rllib.weight_sync import sync_local_runner

            sync_local_runner(group, algo.learner_group)
        return [_play_fn(items, explore, None, per_episode)(local)], 0
    if not ids:
        ids = sorted(_wait_for_runner(algo, deadline, group))
    if not ids:
        return [], 0
    expected = local.weights_seq_no() if local is not None else None
    if per_episode and len(ids) > 1:
        queue = _group_queue(algo, items)
        calls = [(i, _play_fn([], explore, expected, True, queue)) for i in ids]
    else:
        shares = split_plan(items, len(ids))
        calls = [
            (i, _play_fn(s, explore, expected, per_episode)) for i, s in zip(ids, shares, strict=True) if s
        ]
    remaining = max(1.0, deadline - time.monotonic()) if math.isfinite(deadline) else None
    results = group.foreach_env_runner(
        [fn for _, fn in calls],
        local_env_runner=False,
        remote_worker_ids=[i for i, _ in calls],
        timeout_seconds=remaining,
    )
    failures = len(calls) - len(results)
    stale = [r.worker_index for r in results if r.stale]
    if stale:
        logger.warning("GAGPO: EnvRunner(s) %s restarted with initial weights; syncing and replaying", stale)
        group.sync_weights(
            from_worker_or_learner_group=algo.learner_group,
            to_worker_indices=stale,
            inference_only=True,
            timeout_seconds=None,
        )
    return results, failures + len(stale)


def sample_whole_groups(
    algo: Any,
    plan: list[PlannedEpisode],
    iteration: int,
    *,
    explore: bool = True,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    env_runner_group: Any = None,
    seed: int | None = None,
    schedule: str | None = None,
) -> GroupSample:
    """Play ``plan`` on ``algo``'s EnvRunners until every group is whole or the attempts / deadline run out.

    ``max_attempts`` and ``timeout_s`` default to the config's ``max_group_attempts`` and
    ``group_sampling_timeout_s``. ``env_runner_group``: the runners that play (default the training ones; validation
    passes the evaluation ones). ``seed``: the base of the generation seeds (``episode_gen_seed``; default
    the config's seed). ``schedule``: "per_episode" or "lockstep" (default the config's ``rollout_schedule``).
    Raises ``GroupSamplingError`` only when nothing but failures came back (see the module
    docstring).
    """
    cfg = algo.config
    group = env_runner_group if env_runner_group is not None else algo.env_runner_group
    seed = int(seed if seed is not None else cfg.seed or 0)
    schedule = schedule if schedule is not None else cfg.rollout_schedule
    max_attempts = int(max_attempts if max_attempts is not None else cfg.max_group_attempts)
    timeout_s = timeout_s if timeout_s is not None else cfg.group_sampling_timeout_s
    deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
    group_size = defaultdict(int)
    for item in plan:
        group_size[item.group_id] += 1
    missing = {(p.group_id, p.member): p for p in plan}
    done: dict[tuple[int, int], Any] = {}
    stats: list[RolloutStats] = []
    runner_metrics: list = []
    replayed: set[int] = set()
    env_errors = runner_failures = clean = 0
    call_errors: list[str] = []
    first_env_error: str | None = None
    attempt = 0
    while missing and attempt < max_attempts and time.monotonic() < deadline:
        items = [
            dataclasses.replace(p, attempt=attempt, gen_seed=episode_gen_seed(seed, iteration, p, attempt))
            for p in missing.values()
        ]
        if attempt > 0:
            replayed.update(p.group_id for p in items)
            logger.warning(
                "GAGPO: iteration %d attempt %d: playing %d episode(s) of %d group(s) again",
                iteration,
                attempt + 1,
                len(items),
                len({p.group_id for p in items}),
            )
        results, failures = _play_round(algo, group, items, explore, deadline, schedule)
        runner_failures += failures
        attempt += 1
        for result in results:
            if result.error is not None:
                call_errors.append(result.error)
                logger.error(
                    "GAGPO: EnvRunner %d raised while sampling:\n%s", result.worker_index, result.error
                )
                continue
            if result.stats is None:
                continue
            stats.append(result.stats)
            runner_metrics.append(result.metrics)
            env_errors += len(result.stats.env_errors)
            if result.stats.env_errors and first_env_error is None:
                e = result.stats.env_errors[0]
                where = f"step {e.step}" if e.stage == "step" else "reset"
                first_env_error = f"task {e.task_id}, {where}: {e.error}"
            for episode in result.episodes:
                key = (episode.custom_data[Columns.GROUP_ID], episode.custom_data[Columns.MEMBER])
                if key in missing and episode.is_done and episode_env_error(episode) is None:
                    done[key] = episode
                    del missing[key]
                    clean += 1
    incomplete = sorted({g for g, _ in missing})
    complete = [g for g in sorted(group_size) if g not in incomplete]
    episodes = [done[k] for k in sorted(done) if k[0] not in incomplete]
    if incomplete:
        logger.warning(
            "GAGPO: iteration %d: dropped %d of %d group(s) still incomplete after %d attempt(s): %s",
            iteration,
            len(incomplete),
            len(group_size),
            attempt,
            incomplete,
        )
    if plan and not episodes and clean == 0:
        if call_errors and env_errors == 0:
            raise GroupSamplingError(
                f"iteration {iteration}: every EnvRunner call raised in {attempt} attempt(s); the last error:\n"
                f"{call_errors[-1]}"
            )
        if env_errors:
            raise GroupSamplingError(
                f"iteration {iteration}: every episode ended with an env error in {attempt} attempt(s) "
                f"({env_errors} env errors; first: {first_env_error}); the environment fails deterministically"
            )
    return GroupSample(
        episodes=episodes,
        stats=stats,
        runner_metrics=runner_metrics,
        groups_planned=len(group_size),
        groups_complete=len(complete),
        groups_replayed=len(replayed),
        groups_dropped=incomplete,
        env_errors=env_errors,
        runner_failures=runner_failures,
        attempts=attempt,
    )


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
