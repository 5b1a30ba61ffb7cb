"""An EnvRunner that plays a given list of grouped episodes: every planned episode runs to its end.

RLlib's ``sample(num_episodes=n)`` counts finished episodes over auto-resetting sub-envs, so short episodes can fill
the count while a long one is dropped, and ``reset`` is called without options, so the task cannot be chosen. Here
the driver hands each runner a plan (group id, task id, member, env seed per episode); the runner keeps its
sub-envs busy with the plan's episodes in order, steps only the live ones, and returns exactly the planned episodes,
each tagged with its group in ``custom_data``. Each step makes one batched generation call for all live sub-envs.
RLlib's ``on_episode_*`` callbacks are not called on this path; RLlib's own ``sample()`` still works (for
evaluation runners, with the env drawing its tasks from its seed).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from gagpo_rllib.rl_module import ACTION_IDS, GEN_SEED

__all__ = ["GAGPOEnvRunner", "PlannedEpisode", "RolloutStats"]


@dataclass(frozen=True)
class PlannedEpisode:
    """One rollout of a group: which task instance to play and with which env seed."""

    group_id: int
    task_id: int
    member: int
    env_seed: int


@dataclass
class RolloutStats:
    """Where a runner's sampling time went, and how many tokens it generated."""

    generation_s: float = 0.0
    env_s: float = 0.0
    connector_s: float = 0.0
    generated_tokens: int = 0
    env_steps: int = 0
    generate_calls: int = 0


class GAGPOEnvRunner(SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` plus ``sample_groups(plan)``; needs ``gym_env_vectorize_mode='sync'``."""

    def sub_envs(self) -> list:
        if self.env is None:
            raise RuntimeError("this EnvRunner has no env (the local runner of a job with remote runners)")
        return list(self.env.unwrapped.envs)

    def num_tasks(self) -> int:
        """The number of task instances of the env's configured split (env protocol: ``env.num_tasks``)."""
        return int(self.sub_envs()[0].unwrapped.num_tasks)

    def sample_groups(
        self, plan: Sequence[PlannedEpisode], *, gen_seed: int, explore: bool = True
    ) -> tuple[list[SingleAgentEpisode], RolloutStats]:
        """Play every planned episode to its end; return them (in completion order) and the timing split."""
        envs = self.sub_envs()
        pending = deque(plan)
        slots: list[SingleAgentEpisode | None] = [None] * len(envs)
        done: list[SingleAgentEpisode] = []
        stats = RolloutStats()

        def start(i: int) -> None:
            item = pending.popleft()
            episode = SingleAgentEpisode(
                observation_space=self.env.single_observation_space,
                action_space=self.env.single_action_space,
            )
            episode.custom_data.update(group_id=item.group_id, task_id=item.task_id, member=item.member)
            t0 = time.perf_counter()
            obs, info = envs[i].reset(seed=item.env_seed, options={"task_id": item.task_id})
            stats.env_s += time.perf_counter() - t0
            episode.add_env_reset(observation=obs, infos=info)
            slots[i] = episode

        for i in range(len(envs)):
            if pending:
                start(i)
        call = 0
        while any(s is not None for s in slots):
            live = [i for i, s in enumerate(slots) if s is not None]
            episodes = [slots[i] for i in live]
            t0 = time.perf_counter()
            to_module = self._env_to_module(
                rl_module=self.module,
                batch={},
                episodes=episodes,
                explore=explore,
                shared_data={},
                metrics=self.metrics,
            )
            stats.connector_s += time.perf_counter() - t0
            to_module[GEN_SEED] = int(gen_seed) + call
            call += 1
            forward = self.module.forward_exploration if explore else self.module.forward_inference
            gen_before = self.module.generation_time_s
            out = forward(to_module)
            stats.generation_s += self.module.generation_time_s - gen_before
            stats.generate_calls += 1
            stats.generated_tokens += sum(len(ids) for ids in out[ACTION_IDS])
            t0 = time.perf_counter()
            to_env = self._module_to_env(
                rl_module=self.module,
                batch=out,
                episodes=episodes,
                explore=explore,
                shared_data={},
                metrics=self.metrics,
            )
            stats.connector_s += time.perf_counter() - t0
            actions = to_env.pop(Columns.ACTIONS)
            env_actions = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
            for j, i in enumerate(live):
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = envs[i].step(env_actions[j])
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
                    slots[i] = None
                    if pending:
                        start(i)
        self._done_episodes_for_metrics.extend(done)
        self._increase_sampled_metrics(stats.env_steps, len(done))
        return done, stats


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integer parts (the same parts always give the same seed)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)
