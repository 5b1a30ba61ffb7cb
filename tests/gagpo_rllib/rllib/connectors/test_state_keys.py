"""State keys as a choice: each choice's groups on a constructed batch, the keys an EnvRunner stores reaching the
advantage rows unchanged, and every bad ``state_key`` value raising an error that names the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from gagpo_rllib import GAGPOConfig
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages
from gagpo_rllib.rllib.connectors.rollout import (
    HistoryKey,
    StateKeyConnector,
    episode_state_keys,
    normalize_text,
    resolve_state_key,
)
from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner, PlannedEpisode
from gagpo_rllib.rllib.groups import episode_rows
from tests.gagpo_rllib.toy_env import make_config

# Two episodes of one group. Env keys differ in case and spacing only at step 1; both reach "On the drawer 3" but
# after different moves; "drawer 4" names another object.
EPISODES = [
    (["You see a Drawer 3.", "On the drawer 3.", "On the drawer 3."], ["go to drawer 3", "look"]),
    (["you see a  drawer 3. ", "On the drawer 3.", "On the drawer 4."], ["look", "look"]),
]


def room_of(info: dict, episode) -> str:
    """A user key function: the text after the last 'the ', whatever came before."""
    return info["state_key"].rsplit("the ", 1)[-1]


def not_hashable(info: dict) -> list:
    return [info["state_key"]]


def play(state_key: str, history: int = 1) -> list:
    """Steps the constructed episodes through the connector as the EnvRunner does; returns the stored keys."""
    connector = StateKeyConnector(state_key=state_key, history=history)
    episodes = []
    for g, (states, actions) in enumerate(EPISODES):
        ep = SingleAgentEpisode()
        ep.custom_data["group_id"] = 0
        ep.add_env_reset(observation=states[0], infos={"state_key": states[0]})
        for t, action in enumerate(actions):
            out = connector(rl_module=None, batch={Columns.ENV_ACTION: [action]}, episodes=[ep])
            last = t == len(actions) - 1
            ep.add_env_step(
                observation=states[t + 1],
                action=action,
                reward=10.0 * (last and g == 0),
                infos={"state_key": states[t + 1]},
                terminated=last,
                extra_model_outputs={
                    Columns.STATE_KEY: out[Columns.STATE_KEY][0],
                    Columns.ENV_ACTION: action,
                    Columns.INVALID: False,
                    Columns.PROMPT_IDS: [1],
                    Columns.ACTION_IDS: [2],
                    Columns.ACTION_LOGP: [-0.5],
                },
            )
        episodes.append(ep)
    return episode_rows(episodes, invalid_penalty=0.1).state_key


def partition(keys: list) -> list[int]:
    """Dense codes in order of first appearance: equal keys, equal codes."""
    codes: dict = {}
    return [codes.setdefault(k, len(codes)) for k in keys]


def test_env_keys_are_the_env_strings() -> None:
    keys = play("env")
    assert keys == ["You see a Drawer 3.", "On the drawer 3.", "you see a  drawer 3. ", "On the drawer 3."]
    assert partition(keys) == [0, 1, 2, 1]


def test_normalized_keys_fold_case_and_spaces_but_keep_digits() -> None:
    keys = play("normalized")
    assert keys == ["you see a drawer 3.", "on the drawer 3.", "you see a drawer 3.", "on the drawer 3."]
    assert partition(keys) == [0, 1, 0, 1]
    assert normalize_text("On the  Drawer 3") != normalize_text("on the drawer 4")


def test_history_keys_split_states_reached_by_different_moves() -> None:
    keys = play("history", history=1)
    assert keys == [
        ("You see a Drawer 3.",),
        ("On the drawer 3.", "go to drawer 3"),
        ("you see a  drawer 3. ",),
        ("On the drawer 3.", "look"),
    ]
    assert partition(keys) == [0, 1, 2, 3]
    assert partition(play("history", history=0)) == [0, 1, 2, 1]


def test_user_function_keys() -> None:
    keys = play(f"{__name__}:room_of")
    assert keys == ["You see a Drawer 3.", "drawer 3.", "you see a  drawer 3. ", "drawer 3."]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("exact", "must be one of"),
        ("", "must be one of"),
        (3, "must be one of"),
        ("no_such_package.keys:fn", "cannot import module 'no_such_package.keys'"),
        ("gagpo_rllib.rllib.connectors.rollout:no_such_function", "has no callable 'no_such_function'"),
        ("gagpo_rllib.rllib.connectors.rollout:", "package.module:function"),
        ("gagpo_rllib.rllib.connectors.rollout:FIELD", "has no callable 'FIELD'"),
    ],
)
def test_bad_state_key_raises_naming_the_field(spec, message) -> None:
    with pytest.raises(ValueError, match=message) as err:
        resolve_state_key(spec)
    assert "GAGPOConfig.state_key" in str(err.value)
    config = GAGPOConfig().llm(model_path="some/model").gagpo(state_key=spec)
    with pytest.raises(ValueError, match="GAGPOConfig.state_key"):
        config.validate_gagpo()


def test_non_hashable_key_raises_naming_the_field_when_computed() -> None:
    resolve_state_key(f"{__name__}:not_hashable")  # importable and callable: accepted by the config
    with pytest.raises(ValueError, match=r"GAGPOConfig.state_key .*not_hashable.* non-hashable list"):
        play(f"{__name__}:not_hashable")
    with pytest.raises(ValueError, match="state_key_history"):
        GAGPOConfig().llm(model_path="m").gagpo(state_key="history", state_key_history=-1).validate_gagpo()


def test_env_runner_stores_the_keys_and_the_learner_rows_get_them_unchanged(tiny_policy_path: Path) -> None:
    config = make_config(tiny_policy_path, envs_per_runner=2, state_key="history", state_key_history=2)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    plan = [PlannedEpisode(group_id=0, task_id=1, member=m, env_seed=m) for m in range(2)]
    episodes, _ = runner.sample_groups(plan, gen_seed=0)
    rows = episode_rows(episodes, invalid_penalty=0.1)
    expected = []
    for ep in episodes:
        infos, actions = ep.get_infos(), list(ep.get_extra_model_outputs(Columns.ENV_ACTION))
        for t in range(len(ep)):
            expected.append((infos[t]["state_key"], *actions[max(0, t - 2) : t]))
    assert rows.state_key == expected
    assert all(isinstance(k, tuple) for k in rows.state_key)
    assert np.isfinite(compute_advantages(rows.columns())).all()


def test_offline_keys_of_finished_episodes_equal_the_live_ones(tiny_policy_path: Path) -> None:
    config = make_config(tiny_policy_path, envs_per_runner=2, state_key="history", state_key_history=1)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    episodes, _ = runner.sample_groups([PlannedEpisode(0, 2, m, m) for m in range(2)], gen_seed=1)
    live = episode_rows(episodes, invalid_penalty=0.1).state_key
    offline = [k for ep in episodes for k in episode_state_keys(HistoryKey(1), ep)]
    assert offline == live and len({len(k) for k in live}) == 2  # first steps have no past action
