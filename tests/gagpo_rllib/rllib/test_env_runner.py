"""GAGPOEnvRunner: plays exactly the planned episodes, whatever their lengths, with few or many sub-envs; env
errors end an episode, not the runner."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path

import pytest

from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner, PlannedEpisode, episode_env_error
from gagpo_rllib.rllib.group_sampling import PlanQueue, whole_groups
from tests.gagpo_rllib.faulty_env import FaultyCorridorEnv, set_runner_faults
from tests.gagpo_rllib.toy_env import make_config


@pytest.fixture(scope="module")
def runner(tiny_policy_path: Path) -> GAGPOEnvRunner:
    config = make_config(tiny_policy_path, envs_per_runner=2)
    config.validate()
    return GAGPOEnvRunner(config=config)


def _plan(n_groups: int, k: int) -> list[PlannedEpisode]:
    return [
        PlannedEpisode(group_id=10 + g, task_id=g % 4, member=m, env_seed=100 * g + m)
        for g in range(n_groups)
        for m in range(k)
    ]


def test_plays_every_planned_episode_to_its_end(runner: GAGPOEnvRunner) -> None:
    plan = _plan(3, 4)  # 12 episodes on 2 sub-envs: the queue keeps both busy
    episodes, stats = runner.sample_groups(plan, gen_seed=0)
    assert len(episodes) == 12 and all(e.is_done for e in episodes)
    got = Counter((e.custom_data["group_id"], e.custom_data["member"]) for e in episodes)
    assert got == Counter((p.group_id, p.member) for p in plan)
    for e in episodes:
        assert {i["task_id"] for i in e.get_infos()} == {(e.custom_data["group_id"] - 10) % 4}
        assert e.custom_data["task_id"] == (e.custom_data["group_id"] - 10) % 4
    assert stats.env_steps == sum(len(e) for e in episodes)
    assert stats.generated_tokens > 0 and stats.generation_s > 0
    # At most 2 live episodes per generate call: at least ceil(steps / 2) calls.
    assert stats.generate_calls >= stats.env_steps / 2


def test_same_seed_same_episodes(runner: GAGPOEnvRunner) -> None:
    plan = _plan(2, 2)

    def actions(eps: list) -> list:
        return sorted(
            (e.custom_data["group_id"], e.custom_data["member"], tuple(e.get_actions())) for e in eps
        )

    a, _ = runner.sample_groups(plan, gen_seed=7)
    b, _ = runner.sample_groups(plan, gen_seed=7)
    assert actions(a) == actions(b)


def _played(episodes: list) -> list:
    return sorted(
        (
            e.custom_data["group_id"],
            e.custom_data["member"],
            tuple(e.get_actions()),
            tuple(e.get_rewards()),
            tuple(tuple(x) for x in e.get_extra_model_outputs("action_logp")),
        )
        for e in episodes
    )


def test_per_episode_generation_plays_the_lockstep_episodes(runner: GAGPOEnvRunner) -> None:
    """Episodes ask for answers as their own env steps return (env steps on a thread pool): the same episodes,
    log-probs included, as one batched call per turn."""
    plan = _plan(3, 3)
    lockstep, _ = runner.sample_groups(plan, gen_seed=5)
    per_episode, stats = runner.sample_groups(plan, gen_seed=5, per_episode=True)
    assert _played(per_episode) == _played(lockstep)
    assert stats.env_steps == sum(len(e) for e in per_episode) and stats.generate_calls > 0
    assert runner.module.backend.in_flight() == 0


def test_a_runner_takes_whole_groups_from_a_source_until_it_is_empty(runner: GAGPOEnvRunner) -> None:
    plan = _plan(4, 2)
    source = PlanQueue(plan[2:])
    episodes, _ = runner.sample_groups(plan[:2], gen_seed=5, per_episode=True, source=source)
    assert source.take() == [] and _played(episodes) == _played(runner.sample_groups(plan, gen_seed=5)[0])
    assert [[p.group_id for p in g] for g in whole_groups(plan)] == [[10, 10], [11, 11], [12, 12], [13, 13]]


def test_rllib_sample_loop_still_works(runner: GAGPOEnvRunner) -> None:
    """RLlib's own sample() (as used by evaluation workers) runs through the same connectors."""
    episodes = runner.sample(num_episodes=3, explore=False)
    assert len(episodes) >= 3
    for e in episodes:
        assert all(isinstance(a, str) for a in e.get_actions())
        assert all(a in ("go left", "go right") for a in e.get_actions())


def test_empty_plan_returns_nothing(runner: GAGPOEnvRunner) -> None:
    episodes, stats = runner.sample_groups([], gen_seed=0)
    assert episodes == [] and stats.env_steps == 0


@pytest.fixture(scope="module")
def faulty_runner(tiny_policy_path: Path) -> GAGPOEnvRunner:
    config = make_config(tiny_policy_path, envs_per_runner=2).environment(
        FaultyCorridorEnv, env_config={"max_steps": 4}
    )
    config.validate()
    return GAGPOEnvRunner(config=config)


@pytest.mark.parametrize("per_episode", [False, True])
def test_step_error_ends_that_episode_truncated_and_the_others_play_on(
    faulty_runner: GAGPOEnvRunner, caplog: pytest.LogCaptureFixture, per_episode: bool
) -> None:
    set_runner_faults(faulty_runner, fail_step_task=1)
    plan = _plan(3, 2)  # tasks 0, 1, 2
    with caplog.at_level(logging.WARNING, logger="gagpo_rllib.rllib.env_runner"):
        episodes, stats = faulty_runner.sample_groups(plan, gen_seed=0, per_episode=per_episode)
    set_runner_faults(faulty_runner)
    assert len(episodes) == 6 and all(e.is_done for e in episodes)
    failed = [e for e in episodes if episode_env_error(e) is not None]
    assert {e.custom_data["task_id"] for e in failed} == {1} and len(failed) == 2
    for e in failed:
        assert e.is_truncated and len(e) == 1 and "InjectedEnvError" in e.get_infos(-1)["env_error"]
    assert all(episode_env_error(e) is None for e in episodes if e.custom_data["task_id"] != 1)
    assert [(x.task_id, x.stage, x.step) for x in stats.env_errors] == [(1, "step", 0)] * 2
    assert sum("on task 1" in r.getMessage() for r in caplog.records) == 2


def test_reset_error_skips_that_episode_and_the_sub_env_plays_the_next(faulty_runner: GAGPOEnvRunner) -> None:
    set_runner_faults(faulty_runner, fail_reset_task=0)
    episodes, stats = faulty_runner.sample_groups(_plan(3, 2), gen_seed=0)
    set_runner_faults(faulty_runner)
    assert sorted(e.custom_data["task_id"] for e in episodes) == [1, 1, 2, 2]
    assert all(e.is_done and episode_env_error(e) is None for e in episodes)
    assert [(x.task_id, x.stage) for x in stats.env_errors] == [(0, "reset")] * 2


def test_env_failing_on_every_step_returns_each_episode_once(faulty_runner: GAGPOEnvRunner) -> None:
    set_runner_faults(faulty_runner, fail_always=True)
    episodes, stats = faulty_runner.sample_groups(_plan(2, 3), gen_seed=0)
    set_runner_faults(faulty_runner)
    assert len(episodes) == 6 and all(episode_env_error(e) for e in episodes) and len(stats.env_errors) == 6


def test_an_episode_samples_the_same_whatever_else_the_runner_plays(runner: GAGPOEnvRunner) -> None:
    """Row seeds come from the planned episode, not from the batch or the runner."""
    plan = [dataclasses.replace(p, gen_seed=1000 + i) for i, p in enumerate(_plan(3, 2))]
    alone, _ = runner.sample_groups(plan[3:4])
    together, _ = runner.sample_groups(plan)
    (same,) = [
        e for e in together if e.custom_data["group_id"] == plan[3].group_id and e.custom_data["member"] == 1
    ]
    assert alone[0].get_actions() == same.get_actions()
