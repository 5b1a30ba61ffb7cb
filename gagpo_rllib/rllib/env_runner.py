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
from dataclasses import dataclass, field

import torch
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.seeds import derive_seed
from gagpo_rllib.rllib.rllib_internals import RunnerInternals
from gagpo_rllib.rllib.threads import set_torch_threads

__all__ = ["EnvError", "GAGPOEnvRunner", "PlannedEpisode", "RolloutStats", "episode_env_error"]

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

    generation_s: float = 0.0
    env_s: float = 0.0
    connector_s: float = 0.0
    generated_tokens: int = 0
    env_steps: int = 0
    generate_calls: int = 0
    env_errors: list[EnvError] = field(default_factory=list)


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
            "worker_index": int(self.worker_index or 0),
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
        self, plan: Sequence[PlannedEpisode], *, gen_seed: int | None = None, explore: bool = True
    ) -> tuple[list[SingleAgentEpisode], RolloutStats]:
        """Play every planned episode to its end; return them (in completion order) and the timing split.

        Episodes ended by an env error are returned too (truncated, ``custom_data["env_error"]`` set); episodes
        whose ``reset`` failed are only in ``stats.env_errors``. Row seeds: ``derive_seed(base, step)`` with base
        the planned episode's ``gen_seed``, else ``derive_seed(gen_seed, group_id, member)``; with neither, the
        backend's global RNG.
        """
        envs = self.sub_envs()
        pending = deque(plan)
        slots: list[SingleAgentEpisode | None] = [None] * len(envs)
        items: list[PlannedEpisode | None] = [None] * len(envs)
        done: list[SingleAgentEpisode] = []
        stats = RolloutStats()

        def row_seed_base(item: PlannedEpisode) -> int | None:
            if item.gen_seed is not None:
                return int(item.gen_seed)
            if gen_seed is None:
                return None
            return derive_seed(gen_seed, item.group_id, item.member)

        def env_error(item: PlannedEpisode, stage: str, step: int, err: Exception) -> str:
            text = f"{type(err).__name__}: {err}"
            stats.env_errors.append(
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

        def start(i: int) -> None:
            """Reset sub-env i for the next planned episode; a failing reset moves on to the one after."""
            while pending and slots[i] is None:
                item = pending.popleft()
                episode = SingleAgentEpisode(
                    observation_space=self.env.single_observation_space,
                    action_space=self.env.single_action_space,
                )
                episode.custom_data.update(
                    {
                        Columns.GROUP_ID: item.group_id,
                        Columns.TASK_ID: item.task_id,
                        Columns.MEMBER: item.member,
                        Columns.ATTEMPT: item.attempt,
                        Columns.WORKER_INDEX: self.worker_index,
                    }
                )
                t0 = time.perf_counter()
                try:
                    obs, info = envs[i].reset(seed=item.env_seed, options={"task_id": item.task_id})
                except Exception as err:  # noqa: BLE001 - any env failure ends the episode, not the run
                    env_error(item, "reset", 0, err)
                    continue
                finally:
                    stats.env_s += time.perf_counter() - t0
                episode.add_env_reset(observation=obs, infos=info)
                slots[i], items[i] = episode, item

        for i in range(len(envs)):
            start(i)
        while any(s is not None for s in slots):
            live = [i for i, s in enumerate(slots) if s is not None]
            episodes = [slots[i] for i in live]
            t0 = time.perf_counter()
            to_module = self.env_to_module(episodes, explore=explore)
            stats.connector_s += time.perf_counter() - t0
            bases = [row_seed_base(items[i]) for i in live]
            if all(b is not None for b in bases):
                to_module[Columns.GEN_SEED] = [
                    derive_seed(b, len(ep)) for b, ep in zip(bases, episodes, strict=True)
                ]
            forward = self.module.forward_exploration if explore else self.module.forward_inference
            gen_before = self.module.generation_time_s
            out = forward(to_module)
            stats.generation_s += self.module.generation_time_s - gen_before
            stats.generate_calls += 1
            stats.generated_tokens += sum(len(ids) for ids in out[Columns.ACTION_IDS])
            t0 = time.perf_counter()
            to_env = self.module_to_env(out, episodes, explore=explore)
            stats.connector_s += time.perf_counter() - t0
            actions = to_env.pop(RLlibColumns.ACTIONS)
            env_actions = to_env.pop(RLlibColumns.ACTIONS_FOR_ENV, actions)
            for j, i in enumerate(live):
                t0 = time.perf_counter()
                try:
                    obs, reward, terminated, truncated, info = envs[i].step(env_actions[j])
                except Exception as err:  # noqa: BLE001 - any env failure ends the episode, not the run
                    text = env_error(items[i], "step", len(episodes[j]), err)
                    obs, reward, terminated, truncated = episodes[j].get_observations(-1), 0.0, False, True
                    info = {Columns.ENV_ERROR: text, Columns.TASK_ID: items[i].task_id}
                    episodes[j].custom_data[Columns.ENV_ERROR] = text
                finally:
                    stats.env_s += time.perf_counter() - t0
                episodes[j].add_env_step(
                    observation=obs,
                    action=actions[j],
                    reward=float(reward),
                    infos=info,
                    terminated=bool(terminated),
                    truncated=bool(truncated),
                    extra_model_outputs={k: v[j] for k, v in to_env.items()},
                )
                stats.env_steps += 1
                if episodes[j].is_done:
                    done.append(episodes[j])
                    slots[i], items[i] = None, None
                    start(i)
        self.count_sampled(done, stats.env_steps)
        return done, stats


def episode_env_error(episode: SingleAgentEpisode) -> str | None:
    """The env error that ended ``episode``, or None for an episode the env played to its end."""
    return episode.custom_data.get(Columns.ENV_ERROR)
