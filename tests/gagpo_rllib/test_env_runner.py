"""GAGPOEnvRunner: plays exactly the planned episodes, whatever their lengths, with few or many sub-envs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gagpo_rllib.env_runner import GAGPOEnvRunner, PlannedEpisode
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
