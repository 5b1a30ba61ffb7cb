"""Grouped sampling on two real remote EnvRunners that get SIGKILLed, and on envs that raise.

Real Ray actors and real kills (``os.kill(pid, SIGKILL)`` of a runner's process): RLlib restarts the actor, and
``gagpo_rllib.rllib.group_sampling`` re-plays the lost group members on the runners healthy (or restored) now. N=3 groups
of K=2 over 2 runners: the plan's contiguous split puts group 1 on both runners.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import ray
import ray.cloudpickle

import tests.gagpo_rllib.faulty_env as faulty_env
import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.rllib.algorithm import GAGPO
from gagpo_rllib.rllib.group_sampling import GroupSample, sample_whole_groups, task_plan
from tests.gagpo_rllib.advantage_check import assert_connector_advantages_are_the_engines
from tests.gagpo_rllib.faulty_env import FaultyCorridorEnv, set_runner_faults
from tests.gagpo_rllib.toy_env import make_config

K, N, ATTEMPTS = 2, 3, 3


@pytest.fixture(scope="module")
def algo(tiny_policy_path: Path):
    for module in (toy_env, faulty_env):
        ray.cloudpickle.register_pickle_by_value(module)  # the EnvRunner processes cannot import tests/
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        make_config(tiny_policy_path, num_env_runners=2, group_size=K, groups_per_iteration=N)
        .environment(FaultyCorridorEnv, env_config={"max_steps": 4})
        .fault_tolerance(
            delay_between_env_runner_restarts_s=0.5,
            max_group_attempts=ATTEMPTS,
            group_sampling_timeout_s=120.0,
        )
    )
    algo = config.build_algo()
    yield algo
    algo.stop()
    ray.shutdown()
    for module in (toy_env, faulty_env):
        ray.cloudpickle.unregister_pickle_by_value(module)


@pytest.fixture
def recorded(algo: GAGPO):
    """Every GroupSample that training_step gets (the algorithm's own sampling, observed)."""
    samples: list[GroupSample] = []
    original = algo.sample_whole_groups

    def record(*args, **kwargs) -> GroupSample:
        samples.append(original(*args, **kwargs))
        return samples[-1]

    algo.sample_whole_groups = record
    yield samples
    del algo.sample_whole_groups


def pids(algo: GAGPO) -> dict[int, int]:
    answers = algo.env_runner_group.foreach_env_runner(
        lambda r: (r.worker_index, os.getpid()), local_env_runner=False
    )
    return dict(answers)


def set_faults(algo: GAGPO, worker_ids: list[int] | None = None, **faults) -> None:
    algo.env_runner_group.foreach_env_runner(
        lambda r: set_runner_faults(r, **faults), local_env_runner=False, remote_worker_ids=worker_ids
    )


def wait_until_healthy(algo: GAGPO, n: int, timeout_s: float = 90.0) -> None:
    end = time.monotonic() + timeout_s
    while len(algo.env_runner_group.healthy_env_runner_ids()) < n:
        assert time.monotonic() < end, "the killed EnvRunner was not restored"
        algo.restore_env_runners(algo.env_runner_group)
        time.sleep(0.5)


def kill_when_sampling(pid: int, marker: Path, timeout_s: float = 60.0) -> threading.Thread:
    """SIGKILL ``pid`` as soon as its env touched ``marker`` (i.e. while it is sampling)."""

    def run() -> None:
        end = time.monotonic() + timeout_s
        while not marker.exists() and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _runners_of(sample) -> dict[int, set[int]]:
    runners_of = defaultdict(set)
    for ep in sample.episodes:
        runners_of[ep.custom_data["group_id"]].add(ep.custom_data["worker_index"])
    return runners_of


def test_split_group_pools_both_runners_members_in_its_advantages(algo: GAGPO) -> None:
    """Lock-step shares are contiguous, so a group may span runners; the queue of the per-episode schedule hands
    out whole groups."""
    plan = algo.iteration_plan(0)
    queued = algo.sample_whole_groups(plan, 0)
    assert queued.groups_complete == N and all(len(r) == 1 for r in _runners_of(queued).values())
    sample = sample_whole_groups(algo, plan, 0, schedule="lockstep")
    assert len(sample.episodes) == N * K and sample.groups_complete == N and sample.runner_failures == 0
    runners_of = _runners_of(sample)
    split = [g for g, r in runners_of.items() if r == {1, 2}]
    assert split == [plan[K].group_id]  # group 1: member 0 on runner 1, member 1 on runner 2
    split_members = [ep for ep in sample.episodes if ep.custom_data["group_id"] == split[0]]
    assert sorted(ep.custom_data["member"] for ep in split_members) == list(range(K))

    assert_connector_advantages_are_the_engines(algo, sample.episodes)


def test_env_failing_on_one_task_drops_that_group_after_its_attempts(algo: GAGPO) -> None:
    wait_until_healthy(algo, 2)
    plan = algo.iteration_plan(algo.iteration)
    step_task, reset_task = plan[0].task_id, plan[K].task_id
    assert len({p.task_id for p in plan}) == N
    set_faults(algo, fail_step_task=step_task, fail_reset_task=reset_task)
    before = pids(algo)
    result = algo.train()
    g = result["gagpo"]
    assert g["groups_dropped"] == 2 and g["groups_complete"] == N - 2
    assert g["env_errors"] == 2 * K * ATTEMPTS  # every member of both groups, in each attempt
    assert g["num_episodes"] == K and g["update_skipped"] == 0.0
    assert "policy_loss" in result["learners"]["default_policy"]  # the remaining group trained
    assert pids(algo) == before  # the env errors killed no runner
    set_faults(algo)


def test_env_failing_always_gives_a_clear_error_after_the_attempts(algo: GAGPO) -> None:
    wait_until_healthy(algo, 2)
    set_faults(algo, fail_always=True)
    before = pids(algo)
    start = time.monotonic()
    with pytest.raises(Exception, match=rf"every episode ended with an env error in {ATTEMPTS} attempt"):
        algo.train()
    assert time.monotonic() - start < 60
    assert pids(algo) == before
    set_faults(algo)


def test_runner_killed_while_sampling_survivor_replays_and_iteration_trains_whole_groups(
    algo: GAGPO, recorded: list, tmp_path: Path
) -> None:
    marker = tmp_path / "sampling"
    set_faults(algo, [2], step_sleep_s=0.2, step_marker=str(marker))
    before = pids(algo)
    iteration = algo.iteration
    killer = kill_when_sampling(before[2], marker)
    result = algo.train()
    killer.join()
    g = result["gagpo"]
    assert g["runner_failures"] == 1  # the kill landed while runner 2 sampled
    assert g["groups_complete"] == N and g["groups_dropped"] == 0 and g["groups_replayed"] >= 1
    assert g["num_episodes"] == N * K and g["groups_complete"] == N and g["update_skipped"] == 0.0
    assert result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] < 1e-4  # trained on-policy
    (sample,) = recorded
    replayed = [ep for ep in sample.episodes if ep.custom_data["attempt"] > 0]
    assert replayed and {ep.custom_data["worker_index"] for ep in replayed} == {1}  # the survivor played them
    assert sorted((e.custom_data["group_id"], e.custom_data["member"]) for e in sample.episodes) == sorted(
        (p.group_id, p.member) for p in algo.iteration_plan(iteration)
    )

    # RLlib restores runner 2 (a new process, without the faults); the next iteration samples on both runners
    # and plays the plan an uninterrupted run plays.
    wait_until_healthy(algo, 2)
    after = pids(algo)
    assert after[1] == before[1] and after[2] != before[2]
    second = algo.train()
    assert second["gagpo"]["runner_failures"] == 0 and second["gagpo"]["num_episodes"] == N * K
    # The one runner lost was restored once: in the first iteration or by the restore between them.
    assert g["env_runners_restored"] + second["gagpo"]["env_runners_restored"] == 1
    sample = recorded[-1]
    assert {ep.custom_data["worker_index"] for ep in sample.episodes} == {1, 2}
    uninterrupted = task_plan(
        algo.num_tasks(), groups=N, group_size=K, seed=algo.config.seed, iteration=iteration + 1
    )
    assert sorted((e.custom_data["group_id"], e.custom_data["task_id"]) for e in sample.episodes) == sorted(
        (p.group_id, p.task_id) for p in uninterrupted
    )


def test_all_runners_killed_between_iterations_the_run_continues(algo: GAGPO) -> None:
    before = pids(algo)
    for pid in before.values():
        os.kill(pid, signal.SIGKILL)
    result = algo.train()  # no exception reaches the caller: the round waits for RLlib's restore
    g = result["gagpo"]
    assert g["runner_failures"] >= 1
    assert g["num_episodes"] == N * K and g["groups_complete"] == N and g["update_skipped"] == 0.0
    # The replacements sampled with the learner's weights (re-synced before they played): ratio 1.
    assert result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] < 1e-4
    wait_until_healthy(algo, 2)
    assert not set(pids(algo).values()) & set(before.values())
    # Both runners were restored, counted where each came back: this iteration or the next one's result.
    restored = g["env_runners_restored"] + algo.train()["gagpo"]["env_runners_restored"]
    assert g["env_runners_restored"] >= 1 and restored == 2


def test_no_healthy_remote_runner_the_local_runner_plays_when_it_has_an_env(
    algo: GAGPO, recorded: list
) -> None:
    """As with ``create_env_on_local_worker=True``: the local runner plays instead of waiting for a restore."""
    wait_until_healthy(algo, 2)
    local = algo.env_runner_group.local_env_runner
    local.make_env()
    try:
        for pid in pids(algo).values():
            os.kill(pid, signal.SIGKILL)
        result = algo.train()
    finally:
        local.env.close()
        local.env = None
    assert result["gagpo"]["num_episodes"] == N * K and result["gagpo"]["update_skipped"] == 0.0
    (sample,) = recorded
    replayed = [ep for ep in sample.episodes if ep.custom_data["attempt"] > 0]
    assert replayed and {ep.custom_data["worker_index"] for ep in replayed} == {0}  # the local runner
    assert result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] < 1e-4
