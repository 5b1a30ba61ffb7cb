"""Dynamic sampling: uniform groups replaced up to the bound, whole groups, the same plan for the same seed.

The loop is checked with scripted outcomes (which task instances end uniform is then known), and end to end on
the maze with the real local EnvRunner, tiny policy and learner.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest
import ray

from gagpo_rllib.rllib.group_sampling import EXTRA_GROUP_ID_BASE, GroupSample, extra_plan, task_plan
from gagpo_rllib.rllib.groups import episode_rows, fill_informative_groups, uniform_groups

K = 3


def _play_scripted(plan, uniform_tasks: set[int], lost: set[int] = frozenset()):
    """Whole groups of ``plan`` (minus the ``lost`` group ids); a group of a task in ``uniform_tasks`` is uniform."""
    episodes = [
        SimpleNamespace(custom_data={"group_id": p.group_id, "member": p.member, "task": p.task_id})
        for p in plan
        if p.group_id not in lost
    ]
    groups = {p.group_id for p in plan}
    return GroupSample(
        episodes=episodes,
        stats=[],
        runner_metrics=[],
        groups_planned=len(groups),
        groups_complete=len(groups - set(lost)),
        groups_replayed=0,
        groups_dropped=sorted(set(lost) & groups),
        env_errors=0,
        runner_failures=0,
        attempts=1,
    )


def _run(first_plan, uniform_tasks, *, target, bound, seed=0, iteration=3, num_tasks=10, lost=frozenset()):
    def uniform_of(episodes):
        return {e.custom_data["group_id"] for e in episodes if e.custom_data["task"] in uniform_tasks}

    def plan_round(r, groups, offset):
        return extra_plan(
            num_tasks,
            groups=groups,
            group_size=K,
            seed=seed,
            iteration=iteration,
            round_index=r,
            first_group_id=EXTRA_GROUP_ID_BASE + iteration * bound + offset,
        )

    return fill_informative_groups(
        _play_scripted(first_plan, uniform_tasks, lost),
        target_groups=target,
        max_extra_groups=bound,
        group_size=K,
        uniform_of=uniform_of,
        plan_round=plan_round,
        play=lambda plan: _play_scripted(plan, uniform_tasks),
    )


def test_uniform_groups_are_replaced_by_informative_ones() -> None:
    plan = task_plan(10, groups=4, group_size=K, seed=0, iteration=3)
    first_tasks = [p.task_id for p in plan[::K]]
    uniform = set(first_tasks[:2])  # two of the four planned groups carry no signal
    out = _run(plan, uniform, target=4, bound=40)
    kept = Counter(e.custom_data["group_id"] for e in out.batch)
    assert len(kept) == 4 == out.informative_groups and set(kept.values()) == {K}  # whole groups
    assert not {e.custom_data["task"] for e in out.batch} & uniform
    # The two informative planned groups stay, in front; the rest are extra groups.
    assert [g for g in kept][:2] == [p.group_id for p in plan[::K] if p.task_id not in uniform]
    assert all(g >= EXTRA_GROUP_ID_BASE for g in list(kept)[2:])
    assert out.extra_episodes == out.extra_groups * K and out.extra_groups >= 2
    assert out.groups_sampled == 4 + out.extra_groups
    task_of = {e.custom_data["group_id"]: e.custom_data["task"] for e in out.sample.episodes}
    assert out.uniform_groups == sum(t in uniform for t in task_of.values()) >= 2
    m = out.metrics()
    assert m["dynamic_extra_episodes"] == out.extra_groups * K and m["dynamic_shortfall_groups"] == 0.0
    assert m["uniform_group_share"] == pytest.approx(out.uniform_groups / out.groups_sampled)


def test_the_bound_caps_extra_sampling_and_the_batch_shrinks() -> None:
    plan = task_plan(10, groups=4, group_size=K, seed=0, iteration=3)
    out = _run(plan, set(range(10)), target=4, bound=5)  # every task uniform: nothing can be found
    assert out.extra_groups == 5 and out.extra_episodes == 5 * K
    assert out.batch == [] and out.informative_groups == 0 and out.groups_sampled == 9
    assert out.metrics()["uniform_group_share"] == 1.0 and out.metrics()["dynamic_shortfall_groups"] == 4.0
    none = _run(plan, set(range(10)), target=4, bound=0)
    assert none.extra_groups == 0 and none.rounds == 0 and none.groups_sampled == 4


def test_no_extra_round_when_every_group_is_informative() -> None:
    plan = task_plan(10, groups=4, group_size=K, seed=0, iteration=3)
    out = _run(plan, set(), target=4, bound=8)
    assert out.extra_groups == 0 and out.rounds == 0 and len(out.batch) == 4 * K


def test_a_dropped_group_is_replaced_like_a_uniform_one() -> None:
    plan = task_plan(10, groups=4, group_size=K, seed=0, iteration=3)
    out = _run(plan, set(), target=4, bound=8, lost={plan[0].group_id})
    assert out.informative_groups == 4 and out.extra_groups == 1
    assert plan[0].group_id not in {e.custom_data["group_id"] for e in out.batch}


def test_config_validation_names_the_fields(tiny_maze_config) -> None:
    with pytest.raises(ValueError, match="GAGPOConfig.dynamic_sampling must be a bool"):
        tiny_maze_config(dynamic_sampling=1).validate()
    with pytest.raises(ValueError, match="GAGPOConfig.dynamic_sampling_max_extra_groups"):
        tiny_maze_config(dynamic_sampling=True, dynamic_sampling_max_extra_groups=-1).validate()
    assert tiny_maze_config().max_extra_groups == 0  # off by default
    assert tiny_maze_config(dynamic_sampling=True, groups_per_iteration=3).max_extra_groups == 3
    assert tiny_maze_config(dynamic_sampling=True, dynamic_sampling_max_extra_groups=5).max_extra_groups == 5


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _train(config, iterations: int):
    algo = config.build_algo()
    try:
        results, batches = [], []
        original = algo.sample_dynamic

        def recording(first, iteration):
            out = original(first, iteration)
            batches.append(out)
            return out

        algo.sample_dynamic = recording
        for _ in range(iterations):
            results.append(algo.train())
        return results, batches
    finally:
        algo.stop()


def test_training_replaces_uniform_groups_on_the_maze(ray_cluster, tiny_maze_config) -> None:
    """Real rollouts: the batch holds whole informative groups only, metrics count the extra rollouts, and the
    same seed plays the same extra plan with the same outcomes."""
    config = tiny_maze_config(
        group_size=2,
        groups_per_iteration=2,
        max_steps=8,
        dynamic_sampling=True,
        dynamic_sampling_max_extra_groups=4,
    )
    results, batches = _train(config, 2)
    for result, out in zip(results, batches, strict=True):
        g = result["gagpo"]
        by_group = defaultdict(list)
        for ep in out.batch:
            by_group[ep.custom_data["group_id"]].append(ep)
        assert all(len(members) == 2 for members in by_group.values())
        rows = episode_rows(out.batch, config.invalid_penalty) if out.batch else None
        assert rows is None or not uniform_groups(rows)
        assert out.extra_groups <= 4 and (out.informative_groups == 2 or out.extra_groups == 4)
        assert g["dynamic_extra_episodes"] == 2 * out.extra_groups
        assert g["num_episodes"] == 2 * (2 + out.extra_groups)
        assert g["dynamic_informative_groups"] == len(by_group)
        assert g["update_skipped"] == float(not by_group)
    assert any(out.extra_groups for out in batches)  # the untrained policy fails whole groups
    again, again_batches = _train(config, 2)
    for a, b in zip(batches, again_batches, strict=True):
        assert a.extra_groups == b.extra_groups and a.uniform_groups == b.uniform_groups
        key = [
            (e.custom_data["group_id"], e.custom_data["member"], float(e.get_return()))
            for e in a.sample.episodes
        ]
        assert key == [
            (e.custom_data["group_id"], e.custom_data["member"], float(e.get_return()))
            for e in b.sample.episodes
        ]


def test_groups_of_one_are_all_uniform_so_the_bound_is_played(ray_cluster, tiny_maze_config) -> None:
    config = tiny_maze_config(
        group_size=1, groups_per_iteration=2, dynamic_sampling=True, dynamic_sampling_max_extra_groups=3
    )
    results, batches = _train(config, 1)
    g = results[0]["gagpo"]
    assert g["dynamic_extra_groups"] == 3 and g["dynamic_extra_episodes"] == 3 and g["num_episodes"] == 5
    assert g["uniform_group_share"] == 1.0 and g["update_skipped"] == 1.0 and batches[0].batch == []


def test_without_dynamic_sampling_the_uniform_share_is_still_reported(ray_cluster, tiny_maze_config) -> None:
    algo = tiny_maze_config(group_size=1, groups_per_iteration=2).build_algo()
    try:
        g = algo.train()["gagpo"]
    finally:
        algo.stop()
    assert g["uniform_group_share"] == 1.0 and g["num_episodes"] == 2
    assert "dynamic_extra_episodes" not in g
