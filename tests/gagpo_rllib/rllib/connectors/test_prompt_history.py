"""Each env's real prompt after three steps, one of them an invalid answer: the history shows a short marker (not
the raw text a model would copy), and the step numbers of the history and the current observation agree.

The steps go through the real connectors (prompt building, action parsing) and the real environments.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from transformers import AutoTokenizer

from envs.spaces import TextSpace
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.rl_module import object_array
from gagpo_rllib.rllib.connectors.rollout import ActionParserConnector, PromptConnector, invalid_marker

# What a 135M chat model answered on ALFWorld: its own prompt, copied back (no <action> tag).
GARBAGE = "[Action 3: You are a household robot acting in a text-based home\nblue elephant 42 cabinet"


def _env(name: str):
    if name == "maze":
        from envs.maze import MazeEnv

        return MazeEnv({"split": "train", "num_tasks": 4})
    if name == "alfworld":
        pytest.importorskip("alfworld")
        from envs.alfworld import AlfworldEnv

        return AlfworldEnv({"split": "train"})
    from envs.webshop import WebShopEnv

    return WebShopEnv({"split": "train"})


def _answer(info: dict, env_name: str) -> str:
    actions = [a for a in info["admissible_actions"] if "<" not in a]
    if env_name == "webshop" and not actions:
        actions = ["search[shoes]"]
    return f"<think>Try this.</think><action>{actions[0]}</action>"


@pytest.fixture(scope="module")
def module(tiny_policy_path: Path) -> SimpleNamespace:
    return SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(tiny_policy_path))


@pytest.mark.parametrize("env_name", ["maze", "alfworld", "webshop"])
def test_three_step_history_with_an_invalid_answer(env_name: str, module: SimpleNamespace) -> None:
    env = _env(env_name)
    config = GAGPOConfig().environment(type(env))
    first, later = config.prompt_templates(constrained=False)
    prompts = PromptConnector(first_template=first, template=later, history_length=3)
    parser = ActionParserConnector(constrained=False)
    obs, info = env.reset(seed=0, options={"task_id": 0})
    episode = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    episode.add_env_reset(observation=obs, infos=info)
    sent = []
    for t in range(3):
        batch = prompts(rl_module=module, batch={}, episodes=[episode])
        assert f"tep {t + 1}" in batch[Columns.PROMPTS][0]
        raw = GARBAGE if t == 1 else _answer(episode.get_infos(-1), env_name)
        out = parser(rl_module=module, batch={RLlibColumns.ACTIONS: object_array([raw])}, episodes=[episode])
        action = out.pop(RLlibColumns.ACTIONS_FOR_ENV)[0]
        out.pop(RLlibColumns.ACTIONS)
        sent.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        assert not (terminated or truncated)
        episode.add_env_step(
            observation=obs,
            action=raw,
            reward=float(reward),
            infos=info,
            extra_model_outputs={k: v[0] for k, v in out.items()},
        )
    prompt = prompts(rl_module=module, batch={}, episodes=[episode])[Columns.PROMPTS][0]
    marker = invalid_marker("no_action_tag")
    # The invalid answer is a short marker; neither the raw text nor any piece of it comes back.
    assert f"[Action 2: {marker}]" in prompt
    assert "[Action 3: You are" not in prompt and GARBAGE.splitlines()[1] not in prompt
    assert f"[Action 1: {sent[0]}]" in prompt and f"[Action 3: {sent[2]}]" in prompt
    # Steps 1-3 in the history, the current observation is step 4 (the env's template, not a fixed label).
    assert re.findall(r"\[Observation (\d+):", prompt) == ["1", "2", "3"]
    outside = [line for line in prompt.splitlines() if not line.startswith(("[Observation", "[Action"))]
    current = re.findall(r"[Ss]tep (\d+)\b", "\n".join(outside))
    assert current and set(current) == {"4"}, current
    assert "step 3)" not in prompt and "(step 3" not in prompt
    # Free-form templates ask for the tags; the constrained ones do not.
    assert "<action>" in prompt
    c_first, c_later = config.prompt_templates(constrained=True)
    assert "<action>" not in c_first and "<action>" not in c_later


def test_system_prompt_replaces_the_template_default(module: SimpleNamespace) -> None:
    from envs.maze import MazeEnv

    env = MazeEnv({"split": "train", "num_tasks": 4})
    obs, info = env.reset(seed=0, options={"task_id": 0})
    episode = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    episode.add_env_reset(observation=obs, infos=info)
    first, later = GAGPOConfig().environment(MazeEnv).prompt_templates()
    plain = PromptConnector(first_template=first, template=later)(
        rl_module=module, batch={}, episodes=[episode]
    )
    own = PromptConnector(first_template=first, template=later, system_prompt="You solve mazes.")(
        rl_module=module, batch={}, episodes=[episode]
    )
    assert "You solve mazes." not in plain[Columns.PROMPTS][0]
    assert own[Columns.PROMPTS][0].startswith(
        "<|im_start|>system\nYou solve mazes.<|im_end|>\n<|im_start|>user\n"
    )
