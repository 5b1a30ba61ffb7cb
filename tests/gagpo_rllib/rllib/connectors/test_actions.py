"""Parsing model answers: well-formed answers give the action, anything else a flagged invalid step."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagpo_rllib.rllib.connectors.rollout import ParsedAction, parse_action


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("<think>the key is north</think><action>go north</action>", "go north"),
        ("<action>Take Key From Table</action>", "take key from table"),
        ("  <think>\nhmm\n</think>\n<action>  open   door \n</action>  ", "open door"),
        ("<ACTION>look</ACTION>", "look"),
        ("Sure. <action>click[buy now]</action>", "click[buy now]"),
    ],
)
def test_valid_answers(text: str, action: str) -> None:
    assert parse_action(text) == ParsedAction(action=action, valid=True, reason="")


def test_case_is_kept_on_request() -> None:
    assert parse_action("<action>Go North</action>", lowercase=False).action == "Go North"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty_output"),
        ("   \n\t", "empty_output"),
        ("go north", "no_action_tag"),
        ("<think>go north</think>", "no_action_tag"),
        ("<action>go north", "unclosed_action_tag"),
        ("go north</action>", "unclosed_action_tag"),
        ("</action>go<action>", "unclosed_action_tag"),
        ("<action>a</action><action>b</action>", "multiple_action_tags"),
        ("<action><action>go</action></action>", "multiple_action_tags"),
        ("<action>   </action>", "empty_action"),
        ("<think>x<action>go</action></think>", "action_inside_think"),
        ("<think>unclosed <action>go</action>", "malformed_think"),
        ("<action>go <think>x</think></action>", "action_inside_think"),
        ("<action>" + "n" * 300 + "</action>", "action_too_long"),
    ],
)
def test_invalid_answers_are_flagged(text: str, reason: str) -> None:
    parsed = parse_action(text)
    assert not parsed.valid and parsed.reason == reason
    assert parsed.action == text[:200]


def _adversarial(rng: random.Random) -> str:
    """A malformed answer: every branch produces text without exactly one well-formed action."""
    junk = "".join(
        rng.choice("ab <>/\n\t\u00e9\u65e5\U0001f600\u202e\x00{}") for _ in range(rng.randint(0, 40))
    )
    kind = rng.randrange(10)
    if kind == 0:
        return ""
    if kind == 1:
        return junk.replace("<", "").replace(">", "") * rng.randint(1, 50_000)  # huge, no tags
    if kind == 2:
        return f"<action>{junk}<action>{junk}</action>{junk}</action>"  # nested
    if kind == 3:
        return f"<think>{junk.replace('action', '')}<action>go</action>"  # unclosed think
    if kind == 4:
        return f"<action>{junk}" if "</action>" not in junk else "<action>"
    if kind == 5:
        return f"<action>{rng.choice(['', ' ', chr(10), chr(9) * 5])}</action>"
    if kind == 6:
        return f"<action>a</action>{junk}<action>b</action>"
    if kind == 7:
        return f"</action>{junk}<action>"
    if kind == 8:
        return "<action>" + "\u65e5" * rng.randint(201, 5000) + "</action>"
    return "".join(
        rng.choice(["<act", "ion>", "</", "think>", "<think>", "x"]) for _ in range(rng.randint(0, 8))
    )


def test_one_thousand_adversarial_outputs_are_invalid_without_exceptions() -> None:
    rng = random.Random(0)
    for _ in range(1000):
        text = _adversarial(rng)
        parsed = parse_action(text)
        assert not parsed.valid, repr(text[:120])
        assert parsed.reason and len(parsed.action) <= 200


def test_random_strings_never_raise_and_rarely_parse() -> None:
    rng = random.Random(1)
    alphabet = [chr(c) for c in range(32, 127)] + ["\u00e9", "\u65e5", "\ud800", "\U0001f600", "\n"]
    valid = 0
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        valid += parse_action(text).valid
    assert valid == 0


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans(), st.booleans())
def test_any_text_parses_without_raising(text: str, constrained: bool, lowercase: bool) -> None:
    parsed = parse_action(text, constrained=constrained, lowercase=lowercase)
    assert isinstance(parsed, ParsedAction)
    assert parsed.valid == (parsed.reason == "")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).filter(lambda s: s.strip() and "<" not in s and ">" not in s))
def test_any_tagged_text_round_trips(content: str) -> None:
    parsed = parse_action(
        f"<think>ok</think><action>{content}</action>", lowercase=False, max_action_chars=10**6
    )
    assert parsed.valid and parsed.action == " ".join(content.split())


def test_constrained_mode_takes_the_text_as_the_action() -> None:
    assert parse_action(" go north ", constrained=True) == ParsedAction("go north", True, "")
    assert parse_action("", constrained=True).reason == "empty_output"
    assert parse_action("fly", constrained=True, admissible=["go north"]).reason == "not_admissible"
    assert parse_action("go north", constrained=True, admissible=["go north"]).valid


def test_non_strings_are_flagged() -> None:
    assert parse_action(None).reason == "not_a_string"  # type: ignore[arg-type]
