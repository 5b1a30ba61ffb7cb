"""GAGPO on Ray: grouped sampling over 2 EnvRunners, advantages, one training iteration, metrics."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
import ray
import ray.cloudpickle

import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.rllib.algorithm import GAGPO
from tests.gagpo_rllib.advantage_check import assert_connector_advantages_are_the_engines
from tests.gagpo_rllib.toy_env import make_config

K, N = 3, 2
ROOT = Path(__file__).resolve().parents[3]


def documented_metrics() -> list[str]:
    """The metric names of docs/metrics.md's tables (``<...>`` stands for any one name part)."""
    names = []
    text = (ROOT / "docs" / "metrics.md").read_text().split("## Renamed")[0]
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = re.findall(r"`([^`]+)`", line.split("|")[1])
            prefix = cells[0].rsplit("/", 1)[0]
            names += [c if "/" in c else f"{prefix}/{c}" for c in cells]
    return names


def _flat(tree: dict, prefix: str = "") -> list[str]:
    return [
        name
        for key, value in tree.items()
        for name in (_flat(value, f"{prefix}{key}/") if isinstance(value, dict) else [f"{prefix}{key}"])
    ]


@pytest.fixture(scope="module")
def algo(tiny_policy_path: Path):
    ray.cloudpickle.register_pickle_by_value(
        toy_env
    )  # the EnvRunner processes cannot import the tests folder
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = make_config(tiny_policy_path, num_env_runners=2, group_size=K, groups_per_iteration=N)
    algo = config.build_algo()
    yield algo
    algo.stop()
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(toy_env)


def test_two_runners_play_exact_groups_with_matching_advantages(algo: GAGPO) -> None:
    assert algo.env_runner_group.num_remote_env_runners() == 2
    plan = algo.iteration_plan(0)
    episodes, stats, _ = algo.sample_groups(plan, 0)
    assert len(episodes) == N * K and len(stats) == 2 and all(s.env_steps > 0 for s in stats)
    groups = defaultdict(list)
    for ep in episodes:
        assert ep.is_done
        groups[ep.custom_data["group_id"]].append(ep)
    planned = {p.group_id: p.task_id for p in plan}
    assert set(groups) == set(planned)
    for gid, members in groups.items():
        assert sorted(e.custom_data["member"] for e in members) == list(range(K))
        # Every step of every member played the planned task instance (the env says so in its info).
        assert {i["task_id"] for e in members for i in e.get_infos()} == {planned[gid]}

    assert_connector_advantages_are_the_engines(algo, episodes)

    # Same weights, same seeds: the same episodes again.
    again, _, _ = algo.sample_groups(plan, 0)

    def key(eps: list) -> list:
        return sorted(
            (e.custom_data["group_id"], e.custom_data["member"], tuple(e.get_actions())) for e in eps
        )

    assert key(again) == key(episodes)


def test_train_iteration_reports_metrics(algo: GAGPO) -> None:
    result = algo.train()
    g = result["gagpo"]
    assert 0.0 <= g["success_rate"] <= 1.0 and g["num_episodes"] == N * K
    assert g["episode_return_mean"] == pytest.approx(10.0 * g["success_rate"])
    for key in (
        "invalid_action_share",
        "episode_len_mean",
        "time_generation_s",
        "time_env_s",
        "time_learner_s",
        "generated_tokens_per_s",
    ):
        assert key in g
    assert g["generated_tokens_per_s"] > 0
    learner = result["learners"]
    assert learner["default_policy"]["first_minibatch_ratio_max_dev"] < 1e-4
    for key in ("kl", "entropy", "clip_fraction", "ratio_mean", "gradients_default_optimizer_global_norm"):
        assert key in learner["default_policy"]
    for key in ("singleton_share", "state_group_size_mean", "adv_iqr", "adv_std"):
        assert key in learner["gagpo"]
    assert result["env_runners"]["num_episodes"] == N * K
    # Every GAGPO metric is documented, and no name means two things (driver and learner-connector names differ).
    patterns = [re.sub(r"<[^>]+>", "[^/]+", re.escape(n)) for n in documented_metrics()]
    ours = _flat({"gagpo": g, "learners": {"gagpo": learner["gagpo"]}})
    assert [n for n in ours if not any(re.fullmatch(p, n) for p in patterns)] == []
    assert not set(g) & set(learner["gagpo"])


def test_checkpoint_restores_the_policy(algo: GAGPO, tmp_path: Path) -> None:
    import torch

    learner = algo.learner_group._learner
    model = learner.module["default_policy"].model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    algo.save_to_path(tmp_path / "ckpt")
    algo.train()
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    algo.restore_from_path(tmp_path / "ckpt")
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, saved[k])
    # The runners sample with the restored weights again.
    states = algo.env_runner_group.foreach_env_runner(
        lambda r: {k: v.clone() for k, v in r.module.model.state_dict().items()}, local_env_runner=False
    )
    for state in states:
        for k, v in state.items():
            torch.testing.assert_close(v, saved[k])
