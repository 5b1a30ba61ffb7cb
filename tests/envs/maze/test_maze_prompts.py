"""The maze prompt templates: the protocol's fields, and short enough for a tiny policy."""

from __future__ import annotations

import string

from envs.maze import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, MazeEnv

LATER_FIELDS = {"task", "step", "history_length", "history", "observation", "admissible_actions"}


def fields_of(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_templates_use_the_protocol_fields() -> None:
    assert fields_of(PROMPT_TEMPLATE) == LATER_FIELDS
    assert fields_of(FIRST_PROMPT_TEMPLATE) == LATER_FIELDS - {"history", "history_length"}


def test_rendered_prompts_are_short() -> None:
    """With two history pairs the prompt stays within about 40 words (tags counted as one word each)."""
    env = MazeEnv()
    obs, info = env.reset(options={"task_id": 0})
    history = []
    lengths = []
    for step in range(4):
        fields = {
            "task": info["task"],
            "step": step,
            "observation": obs,
            "admissible_actions": "\n".join(info["admissible_actions"]),
            "history_length": len(history[-2:]),
            "history": "\n".join(f"{o} {a}" for o, a in history[-2:]),
        }
        template = FIRST_PROMPT_TEMPLATE if step == 0 else PROMPT_TEMPLATE
        prompt = template.format(**fields)
        assert obs in prompt and info["task"] in prompt
        assert all(a in prompt for a in info["admissible_actions"])
        lengths.append(len(prompt.replace("><", "> <").split()))
        action = info["admissible_actions"][0]
        history.append((obs, action))
        obs, _, _, _, info = env.step(action)
    assert 15 <= lengths[0] <= 30
    assert max(lengths) <= 45
