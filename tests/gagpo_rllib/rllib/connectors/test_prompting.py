"""Prompt building: templates, the history window, the token budget and loading an env's templates."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gagpo_rllib.rllib.connectors.rollout import PromptBuilder, load_env_templates

FIRST = "Task: {task}\nStep {step}.\nYou see: {observation}\nActions:\n{admissible_actions}\n"
LATER = (
    "Task: {task}\nStep {step}. Last {history_length} steps:\n{history}\nYou see: {observation}\n"
    "Actions:\n{admissible_actions}\n"
)
HISTORY = [("hall", "go north"), ("kitchen", "take key"), ("kitchen {with braces}", "go south")]


@pytest.fixture(scope="module")
def tok(tiny_policy_path: Path):
    return AutoTokenizer.from_pretrained(tiny_policy_path)


def _build(builder: PromptBuilder, step: int = 3, history=HISTORY, observation: str = "hall") -> str:
    return builder.build(
        task="find the key",
        observation=observation,
        admissible_actions=["go north", "look"],
        history=history[:step],
        step=step,
    )


def test_first_step_uses_the_first_template(tok) -> None:
    prompt = _build(PromptBuilder(tok, template=LATER, first_template=FIRST), step=0)
    body = FIRST.format(task="find the key", step=0, observation="hall", admissible_actions="go north\nlook")
    assert prompt == tok.apply_chat_template(
        [{"role": "user", "content": body}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")


def test_later_steps_show_the_last_h_pairs(tok) -> None:
    prompt = _build(PromptBuilder(tok, template=LATER, first_template=FIRST, history_length=2))
    assert "Last 2 steps" in prompt
    assert "[Observation 1: hall]" not in prompt
    assert "[Observation 2: kitchen]\n[Action 2: take key]" in prompt
    assert "[Observation 3: kitchen {with braces}]\n[Action 3: go south]" in prompt
    assert "go north\nlook" in prompt
    none = _build(PromptBuilder(tok, template=LATER, first_template=FIRST, history_length=0))
    assert "Last 0 steps" in none and "[Observation" not in none


def test_budget_drops_the_oldest_history_first(tok) -> None:
    full = PromptBuilder(tok, template=LATER, first_template=FIRST, history_length=2)
    n_full = len(tok(_build(full), add_special_tokens=False)["input_ids"])
    tight = PromptBuilder(
        tok, template=LATER, first_template=FIRST, history_length=2, max_prompt_tokens=n_full - 1
    )
    prompt = _build(tight)
    assert len(tok(prompt, add_special_tokens=False)["input_ids"]) <= n_full - 1
    assert "[Action 2: take key]" not in prompt and "[Action 3: go south]" in prompt
    assert tight.stats["history_dropped"] == 1


def test_budget_cuts_the_observation_last(tok) -> None:
    long_obs = "You are in a very long corridor. " * 40
    builder = PromptBuilder(
        tok, template=LATER, first_template=FIRST, history_length=2, max_prompt_tokens=120
    )
    prompt = _build(builder, observation=long_obs)
    assert len(tok(prompt, add_special_tokens=False)["input_ids"]) <= 120
    assert "You are in a very long corridor." in prompt and "[Observation" not in prompt
    assert builder.stats["observation_cut"] == 1
    tiny = PromptBuilder(tok, template=LATER, first_template=FIRST, max_prompt_tokens=5)
    _build(tiny)
    assert tiny.stats["over_budget"] == 1


def test_bad_templates_and_arguments_name_the_field(tok) -> None:
    with pytest.raises(ValueError, match="first_template.*history"):
        PromptBuilder(tok, template=LATER, first_template=FIRST + "{history}")
    with pytest.raises(ValueError, match="template.*goal"):
        PromptBuilder(tok, template=LATER + "{goal}", first_template=FIRST)
    with pytest.raises(ValueError, match="history_length"):
        PromptBuilder(tok, template=LATER, first_template=FIRST, history_length=-1)


def test_load_env_templates_from_the_env_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "fake_env_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "env.py").write_text("class FakeEnv:\n    pass\n")
    (pkg / "prompts.py").write_text(f"FIRST_PROMPT_TEMPLATE = {FIRST!r}\nPROMPT_TEMPLATE = {LATER!r}\n")
    bad = tmp_path / "bad_env_pkg"
    bad.mkdir()
    (bad / "__init__.py").write_text("")
    (bad / "env.py").write_text("class BadEnv:\n    pass\n")
    (bad / "prompts.py").write_text(textwrap.dedent("PROMPT_TEMPLATE = 'x'\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    from bad_env_pkg.env import BadEnv
    from fake_env_pkg.env import FakeEnv

    assert load_env_templates(FakeEnv) == (FIRST, LATER)
    with pytest.raises(ValueError, match="FIRST_PROMPT_TEMPLATE"):
        load_env_templates(BadEnv)
    with pytest.raises(ValueError, match="no prompts module"):
        load_env_templates(PromptBuilder)
    for name in (
        "fake_env_pkg",
        "fake_env_pkg.env",
        "fake_env_pkg.prompts",
        "bad_env_pkg",
        "bad_env_pkg.env",
    ):
        sys.modules.pop(name, None)
    sys.modules.pop("bad_env_pkg.prompts", None)
