"""Env-to-module: one chat prompt per live episode with the task, the last H steps, the observation, the actions."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from transformers import AutoTokenizer

from envs.spaces import TextSpace
from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.connectors.rollout import PromptConnector, recent_history

FIRST = "FIRST task={task} step={step} obs={observation} acts=[{admissible_actions}]"
LATER = "LATER task={task} step={step} H={history_length} hist=[{history}] obs={observation} acts=[{admissible_actions}]"


def _info(step: int) -> dict:
    return {"task": "find the key", "admissible_actions": [f"a{step}", f"b{step}"], "state_key": str(step)}


def _episode(steps: int) -> SingleAgentEpisode:
    ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    ep.add_env_reset(observation="obs0", infos=_info(0))
    for t in range(1, steps + 1):
        ep.add_env_step(
            observation=f"obs{t}",
            action=f"<action>act{t - 1}</action>",
            reward=0.0,
            infos=_info(t),
            extra_model_outputs={Columns.ENV_ACTION: f"act{t - 1}"},
        )
    return ep


@pytest.fixture(scope="module")
def module(tiny_policy_path: Path) -> SimpleNamespace:
    return SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(tiny_policy_path))


def test_history_is_the_last_h_env_actions() -> None:
    ep = _episode(4)
    assert recent_history(ep, 2) == [("obs2", "act2"), ("obs3", "act3")]
    assert recent_history(ep, 10) == [(f"obs{t}", f"act{t}") for t in range(4)]
    assert recent_history(ep, 0) == []
    assert recent_history(_episode(0), 2) == []


def test_prompts_per_episode(module: SimpleNamespace) -> None:
    conn = PromptConnector(first_template=FIRST, template=LATER, history_length=2)
    episodes = [_episode(0), _episode(3)]
    batch = conn(rl_module=module, batch={}, episodes=episodes)
    first, later = batch[Columns.PROMPTS]
    assert first.startswith("<|im_start|>user\n") and first.endswith("<|im_start|>assistant\n")
    assert "FIRST task=find the key step=0 obs=obs0" in first and "a0\nb0" in first
    assert "LATER" in later and "step=3" in later and "obs=obs3" in later and "a3\nb3" in later
    # Only the last two (observation, action) pairs are shown, with the action the env received.
    assert "act1" in later and "act2" in later and "obs1" in later
    assert "act0" not in later and "obs0" not in later and "<action>" not in later
    assert batch[Columns.ADMISSIBLE] == [["a0", "b0"], ["a3", "b3"]]


def test_missing_info_key_names_it(module: SimpleNamespace) -> None:
    ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    ep.add_env_reset(observation="o", infos={"task": "t"})
    conn = PromptConnector(first_template=FIRST, template=LATER)
    with pytest.raises(KeyError, match="admissible_actions"):
        conn(rl_module=module, batch={}, episodes=[ep])
