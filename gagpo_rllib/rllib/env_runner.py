"""An EnvRunner that plays a given list of grouped episodes: every planned episode runs to its end.

RLlib's ``sample(num_episodes=n)`` counts finished episodes over auto-resetting sub-envs, so short episodes can fill
the count while a long one is dropped, and ``reset`` is called without options, so the task cannot be chosen. Here
the driver hands each runner a plan (group id, task id, member, env seed per episode); the runner keeps its
sub-envs busy with the plan's episodes in order, steps only the live ones, and returns exactly the planned episodes,
each tagged with its group in ``custom_data``. Each step makes one batched generation call for all live sub-envs,
with one seed per row derived from the episode's own generation seed and step, so an episode's sampling does not
depend on which runner plays it or what else is in the batch.

An exception from a sub-env's ``reset`` or ``step`` never leaves this method: a failed ``step`` ends the episode as
truncated with ``info["env_error"]`` (and ``custom_data["env_error"]``), a failed ``reset`` means the episode never
starts; both are logged with the task id and listed in ``RolloutStats.env_errors``, and the sub-env goes on with
the next planned episode (its ``reset`` starts it afresh).
RLlib's ``on_episode_*`` callbacks are not called on this path; RLlib's own ``sample()`` still works (for
evaluation runners, with the env drawing its tasks from its seed).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.protocol import TASK_ID
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.seeds import derive_seed
from gagpo_rllib.policy.generation.base import GenerationBackend
from gagpo_rllib.rllib.rllib_internals import RunnerInternals
from gagpo_rllib.rllib.threads import set_torch_threads

__all__ = [
    "EnvError",
    "GAGPOEnvRunner",
    "GroupSource",
    "PlannedEpisode",
    "RolloutStats",
    "episode_env_error",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedEpisode:
    """One rollout of a group: which task instance to play, with which env seed and generation seed.

    ``gen_seed`` None: the row seeds derive from the ``gen_seed`` passed to ``sample_groups`` and (group, member).
    ``attempt`` counts re-plays of this member within an iteration (0 the first time).
    """

    group_id: int
    task_id: int
    member: int
    env_seed: int
    attempt: int = 0
    gen_seed: int | None = None


@dataclass(frozen=True)
class EnvError:
    """An exception raised by a sub-env's ``reset`` or ``step`` while playing a planned episode."""

    group_id: int
    task_id: int
    member: int
    attempt: int
    stage: str  # "reset" or "step"
    step: int
    error: str


@dataclass
class RolloutStats:
    """Where a runner's sampling time went, and how many tokens it generated."""

    # Seconds spent generating, stepping the envs (and the errors they raised) and in the connectors.
    generation_s: float = 0.0
    env_s: float = 0.0
    env_errors: list[EnvError] = field(default_factory=list)
    connector_s: float = 0.0
    # Counts.
    generated_tokens: int = 0
    env_steps: int = 0
    generate_calls: int = 0


class GAGPOEnvRunner(RunnerInternals):
    """``SingleAgentEnvRunner`` plus ``sample_groups(plan)``; needs ``gym_env_vectorize_mode='sync'``.

    Sets torch's threads to its CPU share (``gagpo_rllib.rllib.threads``) before the module is built.
    """

    def __init__(self, *, config, **kwargs) -> None:
        set_torch_threads(config, "EnvRunner")
        super().__init__(config=config, **kwargs)

    def make_module(self) -> None:
        """RLlib's module, with ``rollout_engine`` False on a local runner (worker index 0).

        The local runner lives in the driver's or, under Tune, the Algorithm's process, which Ray gave no GPU for
        an engine: a vLLM engine there would take memory of a GPU that belongs to a learner or another runner.
        """
        env = self.env.unwrapped if self.env is not None else None
        try:
            spec = self.config.get_rl_module_spec(env=env, spaces=self.get_spaces(), inference_only=True)
        except NotImplementedError:
            self.module = None
            return
        spec.model_config = {
            **dict(spec.model_config or {}),
            "rollout_engine": int(self.worker_index or 0) > 0,
        }
        self.module = spec.build()
        self.module.to(self.device)

    def engine_report(self) -> dict:
        """Where this runner runs and how many vLLM engines its process started (0 without the vLLM backend)."""
        import os
        import sys

        import ray

        engines = 0
        if "gagpo_rllib.policy.generation.vllm" in sys.modules:
            engines = sys.modules["gagpo_rllib.policy.generation.vllm"].engines_started()
        context = ray.get_runtime_context() if ray.is_initialized() else None
        return {
            Columns.WORKER_INDEX: int(self.worker_index or 0),
            "pid": os.getpid(),
            "node_id": context.get_node_id() if context is not None else None,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()] if context is not None else [],
            "engines": int(engines),
        }

    def torch_threads(self) -> int:
        """torch's intra-op thread count in this runner's process."""
        return int(torch.get_num_threads())

    def sub_envs(self) -> list:
        if self.env is None:
            raise RuntimeError("this EnvRunner has no env (the local runner of a job with remote runners)")
        return list(self.env.unwrapped.envs)

    def num_tasks(self) -> int:
        """The number of task instances of the env's configured split (env protocol: ``env.num_tasks``)."""
        return int(self.sub_envs()[0].unwrapped.num_tasks)

    def has_env(self) -> bool:
        """Whether this runner can play episodes (the local runner of a job with remote runners has no env)."""
        return self.env is not None

    def sample_groups(
        self,
        plan: Sequence[PlannedEpisode],
        *,
        gen_seed: int | None = None,
        explore: bool = True,
        per_episode: bool = False,
        source: GroupSource | None = None,
    ) -> tuple[list[SingleAgentEpisode], RolloutStats]:
        """Play every planned episode to its end; return them (in completion order) and the timing split.

        Episodes ended by an env error are returned too (truncated, ``custom_data["env_error"]`` set); episodes
        whose ``reset`` failed are only in ``stats.env_errors``. Row seeds: ``derive_seed(base, step)`` with base
        the planned episode's ``gen_seed``, else ``derive_seed(gen_seed, group_id, member)``; with neither, the
        backend's global RNG.

        ``per_episode``: each episode asks for its next answer as soon as its own env step returns, and env steps
        run on a thread pool (``_play_per_episode``); False plays in lock-step, one batched call per turn.
        ``source``: more whole groups to take (``GroupSource.take``) whenever this runner has a free sub-env and
        nothing of ``plan`` left, until the source is empty.
        """
        rollout = _Rollout(self, plan, gen_seed, source)
        if per_episode:
            try:
                self._play_per_episode(rollout, explore)
            finally:  # a call that stopped early leaves no request behind for the next one
                backend = self.module.started_backend
                dropped = backend.abort() if backend is not None else 0
                if dropped:
                    logger.warning("dropped %d generation request(s) of an unfinished rollout", dropped)
        else:
            self._play_lockstep(rollout, explore)
        self.count_sampled(rollout.done, rollout.stats.env_steps)
        return rollout.done, rollout.stats

    def _play_lockstep(self, rollout: _Rollout, explore: bool) -> None:
        """One batched generation per turn for all live sub-envs, then their env steps one after another."""
        for i in range(len(rollout.envs)):
            rollout.start(i)
        while live := rollout.live():
            episodes = [rollout.slots[i] for i in live]
            t0 = time.perf_counter()
            to_module = self.env_to_module(episodes, explore=explore)
            rollout.stats.connector_s += time.perf_counter() - t0
            rollout.add_seeds(to_module, live)
            forward = self.module.forward_exploration if explore else self.module.forward_inference
            gen_before = self.module.generation_time_s
            out = forward(to_module)
            rollout.stats.generation_s += self.module.generation_time_s - gen_before
            rollout.stats.generate_calls += 1
            for i, step in self._actions(rollout, out, live, explore):
                rollout.record(i, step())

    def _play_per_episode(self, rollout: _Rollout, explore: bool) -> None:
        """Per-episode generation: an episode's request goes to the backend the moment its env step returns.

        With an engine that batches continuously (``submit``/``collect`` overridden, vLLM) the engine holds every
        ready episode's request while the others' env steps run; a batching backend (HF) gets everything that
        became ready together, after the env steps of the turn ran side by side on the pool, so its batches are
        the lock-step ones. Either way an episode's answer depends only on its own seed.
        """
        module = self.module
        continuous = type(module.backend).collect is not GenerationBackend.collect
        envs = rollout.envs
        ready = []
        for i in range(len(envs)):
            rollout.start(i)
            if rollout.slots[i] is not None:
                ready.append(i)
        stepping: dict[Future, tuple[int, int]] = {}
        with ThreadPoolExecutor(max_workers=max(1, len(envs)), thread_name_prefix="env-step") as pool:
            while ready or stepping or module.backend.in_flight():
                if ready:
                    t0 = time.perf_counter()
                    to_module = self.env_to_module([rollout.slots[i] for i in ready], explore=explore)
                    rollout.stats.connector_s += time.perf_counter() - t0
                    rollout.add_seeds(to_module, ready)
                    gen_before = module.generation_time_s
                    module.submit_generation(
                        to_module, [(i, len(rollout.slots[i])) for i in ready], explore=explore
                    )
                    rollout.stats.generation_s += module.generation_time_s - gen_before
                    ready = []
                if module.backend.in_flight():
                    gen_before = module.generation_time_s
                    keys, out = module.collect_generation()
                    rollout.stats.generation_s += module.generation_time_s - gen_before
                    rollout.stats.generate_calls += 1
                    slots = [i for i, _ in keys]
                    for i, step in self._actions(rollout, out, slots, explore):
                        stepping[pool.submit(step)] = (i, len(stepping))
                if not stepping:
                    continue
                if continuous and module.backend.in_flight():
                    finished = [f for f in stepping if f.done()]  # the engine has work: take what is ready
                else:  # nothing to generate (or a batching backend): wait for the env steps
                    finished, _ = wait(stepping, return_when=FIRST_COMPLETED if continuous else ALL_COMPLETED)
                for future in sorted(finished, key=lambda f: stepping[f]):
                    i, _ = stepping.pop(future)
                    rollout.record(i, future.result())
                    if rollout.slots[i] is not None:
                        ready.append(i)

    def _actions(self, rollout: _Rollout, out: dict, slots: list[int], explore: bool):
        """The env step of each answered slot, as (slot, callable returning the step's outcome)."""
        episodes = [rollout.slots[i] for i in slots]
        rollout.stats.generated_tokens += sum(len(ids) for ids in out[Columns.ACTION_IDS])
        t0 = time.perf_counter()
        to_env = self.module_to_env(out, episodes, explore=explore)
        rollout.stats.connector_s += time.perf_counter() - t0
        actions = to_env.pop(RLlibColumns.ACTIONS)
        env_actions = to_env.pop(RLlibColumns.ACTIONS_FOR_ENV, actions)
        for j, i in enumerate(slots):
            extra = {k: v[j] for k, v in to_env.items()}
            rollout.pending_actions[i] = (actions[j], extra)
            yield i, _env_step(rollout.envs[i], env_actions[j])


@dataclass
class _StepOutcome:
    """What a sub-env's ``step`` returned, or the exception it raised, and how long it took."""

    result: tuple | None
    error: Exception | None
    seconds: float


def _env_step(env: Any, action: Any):
    """A callable that steps ``env`` once and never raises (the error is returned)."""

    def step() -> _StepOutcome:
        t0 = time.perf_counter()
        try:
            return _StepOutcome(env.step(action), None, time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001 - any env failure ends the episode, not the run
            return _StepOutcome(None, err, time.perf_counter() - t0)

    return step


class GroupSource(Protocol):
    """Whole groups handed out on request (a queue shared by the runners of an iteration)."""

    def take(self) -> list[PlannedEpisode]:
        """The next group's planned episodes; [] when no group is left."""


class _Rollout:
    """The state of one ``sample_groups`` call: the sub-envs' live episodes, what is planned, what is done."""

    def __init__(
        self, runner: GAGPOEnvRunner, plan: Sequence[PlannedEpisode], gen_seed: int | None, source: Any
    ) -> None:
        self.runner = runner
        self.envs = runner.sub_envs()
        self.pending = deque(plan)
        self.source = source
        self.gen_seed = gen_seed
        self.slots: list[SingleAgentEpisode | None] = [None] * len(self.envs)
        self.items: list[PlannedEpisode | None] = [None] * len(self.envs)
        self.pending_actions: dict[int, tuple[Any, dict]] = {}
        self.done: list[SingleAgentEpisode] = []
        self.stats = RolloutStats()

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is not None]

    def row_seed_base(self, item: PlannedEpisode) -> int | None:
        if item.gen_seed is not None:
            return int(item.gen_seed)
        if self.gen_seed is None:
            return None
        return derive_seed(self.gen_seed, item.group_id, item.member)

    def add_seeds(self, to_module: dict, slots: list[int]) -> None:
        """One generation seed per row, from the episode's own seed base and its step."""
        bases = [self.row_seed_base(self.items[i]) for i in slots]
        if all(b is not None for b in bases):
            to_module[Columns.GEN_SEED] = [
                derive_seed(b, len(self.slots[i])) for b, i in zip(bases, slots, strict=True)
            ]

    def env_error(self, item: PlannedEpisode, stage: str, step: int, err: Exception) -> str:
        text = f"{type(err).__name__}: {err}"
        self.stats.env_errors.append(
            EnvError(item.group_id, item.task_id, item.member, item.attempt, stage, step, text)
        )
        logger.warning(
            "env error in %s on task %s (group %s, member %s, attempt %s, step %s): %s",
            stage,
            item.task_id,
            item.group_id,
            item.member,
            item.attempt,
            step,
            text,
        )
        return text

    def next_item(self) -> PlannedEpisode | None:
        if not self.pending and self.source is not None:
            self.pending.extend(self.source.take())
        return self.pending.popleft() if self.pending else None

    def start(self, i: int) -> None:
        """Reset sub-env i for the next planned episode; a failing reset moves on to the one after."""
        runner = self.runner
        while self.slots[i] is None:
            item = self.next_item()
            if item is None:
                return
            episode = SingleAgentEpisode(
                observation_space=runner.env.single_observation_space,
                action_space=runner.env.single_action_space,
            )
            episode.custom_data.update(
                {
                    Columns.GROUP_ID: item.group_id,
                    Columns.TASK_ID: item.task_id,
                    Columns.MEMBER: item.member,
                    Columns.ATTEMPT: item.attempt,
                    Columns.WORKER_INDEX: runner.worker_index,
                    Columns.WEIGHTS_SEQ_NO: runner.weights_seq_no(),
                }
            )
            t0 = time.perf_counter()
            try:
                obs, info = self.envs[i].reset(seed=item.env_seed, options={TASK_ID: item.task_id})
            except Exception as err:  # noqa: BLE001 - any env failure ends the episode, not the run
                self.env_error(item, "reset", 0, err)
                continue
            finally:
                self.stats.env_s += time.perf_counter() - t0
            episode.add_env_reset(observation=obs, infos=info)
            self.slots[i], self.items[i] = episode, item

    def record(self, i: int, outcome: _StepOutcome) -> None:
        """Add sub-env i's step to its episode; a finished episode frees the sub-env for the next one."""
        episode, item = self.slots[i], self.items[i]
        action, extra = self.pending_actions.pop(i)
        self.stats.env_s += outcome.seconds
        if outcome.error is not None:
            text = self.env_error(item, "step", len(episode), outcome.error)
            obs, reward, terminated, truncated = episode.get_observations(-1), 0.0, False, True
            info = {Columns.ENV_ERROR: text, Columns.TASK_ID: item.task_id}
            episode.custom_data[Columns.ENV_ERROR] = text
        else:
            obs, reward, terminated, truncated, info = outcome.result
        episode.add_env_step(
            observation=obs,
            action=action,
            reward=float(reward),
            infos=info,
            terminated=bool(terminated),
            truncated=bool(truncated),
            extra_model_outputs=extra,
        )
        self.stats.env_steps += 1
        if episode.is_done:
            self.done.append(episode)
            self.slots[i], self.items[i] = None, None
            self.start(i)


def episode_env_error(episode: SingleAgentEpisode) -> str | None:
    """The env error that ended ``episode``, or None for an episode the env played to its end."""
    return episode.custom_data.get(Columns.ENV_ERROR)
