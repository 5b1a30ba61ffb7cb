"""The warning metrics for updates without reward signal: groups that learn only from invalid-action penalties,
or from nothing (all advantages zero)."""

from __future__ import annotations

import logging

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.spaces import TextSpace
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages
from gagpo_rllib.rllib.groups import episode_rows, reward_signal_shares


def _episode(group: int, rewards: list[float], invalid: list[bool], won: bool = False) -> SingleAgentEpisode:
    ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    ep.add_env_reset(observation="s0", infos={"state_key": "s0", "won": False})
    for t, (r, bad) in enumerate(zip(rewards, invalid, strict=True)):
        last = t == len(rewards) - 1
        ep.add_env_step(
            observation=f"s{t + 1}",
            action="x",
            reward=r,
            infos={"state_key": f"s{t + 1}", "won": won and last},
            terminated=last,
            extra_model_outputs={
                Columns.INVALID: bad,
                Columns.INVALID_REASON: "no_action_tag" if bad else "",
                Columns.PROMPT_IDS: [1, 2],
                Columns.ACTION_IDS: [3],
                Columns.ACTION_LOGP: [-0.5],
            },
        )
    ep.custom_data["group_id"] = group
    return ep


def test_shares_by_kind_of_group() -> None:
    episodes = [
        # group 0: every step invalid, nothing won -> penalties only, all invalid
        _episode(0, [0.0, 0.0], [True, True]),
        _episode(0, [0.0, 0.0, 0.0], [True, True, True]),
        # group 1: no reward, one invalid step -> penalties only, not all invalid
        _episode(1, [0.0, 0.0], [False, True]),
        _episode(1, [0.0], [False]),
        # group 2: no reward, all valid -> zero advantages
        _episode(2, [0.0], [False]),
        _episode(2, [0.0, 0.0], [False, False]),
        # group 3: one success -> signal
        _episode(3, [0.0, 10.0], [True, False], won=True),
        _episode(3, [0.0], [True]),
    ]
    shares = reward_signal_shares(episodes)
    assert shares == {
        "groups_penalty_only_share": 0.5,
        "groups_zero_advantage_share": 0.25,
        "groups_all_invalid_share": 0.25,
        "groups_no_reward_signal_share": 0.75,
    }
    assert reward_signal_shares([])["groups_no_reward_signal_share"] == 0.0


def test_a_penalty_only_group_gets_order_one_advantages() -> None:
    """Why the metric exists: equal penalties at different times become advantages of order 1."""
    episodes = [_episode(0, [0.0] * 3, [True] * 3), _episode(0, [0.0] * 5, [True] * 5)]
    rows = episode_rows(episodes, invalid_penalty=0.1)
    adv = compute_advantages(rows.columns(), estimator="gagpo", gamma=0.95, lam=0.95, norm="mean_std")
    assert np.abs(np.asarray(adv)).max() > 0.5
    assert reward_signal_shares(episodes)["groups_penalty_only_share"] == 1.0


def test_an_update_without_signal_is_warned_about(tiny_maze_config, caplog) -> None:
    """Free-form answers from the random-init policy are all invalid: the iteration warns and logs the shares."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        algo = tiny_maze_config(constrained_decoding=False, max_steps=2).build_algo()
        try:
            with caplog.at_level(logging.WARNING, logger="gagpo_rllib.rllib.algorithm"):
                result = algo.train()
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    g = result["gagpo"]
    assert g["invalid_action_share"] == 1.0
    assert g["groups_penalty_only_share"] == 1.0 and g["groups_all_invalid_share"] == 1.0
    assert g["groups_no_reward_signal_share"] == 1.0
    assert any("no group got any env reward" in r.getMessage() for r in caplog.records)
