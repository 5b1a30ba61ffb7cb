"""Turning a model's answer into an environment action; malformed answers become flagged invalid steps."""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["ParsedAction", "parse_action"]

logger = logging.getLogger(__name__)

_ACTION_TAG = re.compile(r"<(/?)action>", re.IGNORECASE)
_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedAction:
    """The command sent to the environment; ``reason`` is "" when valid, else why the step is invalid."""

    action: str
    valid: bool
    reason: str


def _invalid(text: str, reason: str, max_chars: int) -> ParsedAction:
    return ParsedAction(action=text[:max_chars], valid=False, reason=reason)


def _free(text: str, lowercase: bool, max_chars: int) -> ParsedAction:
    if not text.strip():
        return _invalid(text, "empty_output", max_chars)
    tags = list(_ACTION_TAG.finditer(text))
    opens = [m for m in tags if not m.group(1)]
    closes = [m for m in tags if m.group(1)]
    if not tags:
        return _invalid(text, "no_action_tag", max_chars)
    if len(opens) > 1 or len(closes) > 1:
        return _invalid(text, "multiple_action_tags", max_chars)
    if len(opens) != 1 or len(closes) != 1 or closes[0].start() < opens[0].end():
        return _invalid(text, "unclosed_action_tag", max_chars)
    start, end = opens[0].end(), closes[0].start()
    thinks = list(_THINK_TAG.finditer(text))
    if thinks:
        kinds = [bool(m.group(1)) for m in thinks]
        if kinds != [False, True]:
            return _invalid(text, "malformed_think", max_chars)
        if thinks[1].end() > opens[0].start():
            return _invalid(text, "action_inside_think", max_chars)
    content = " ".join(text[start:end].split())
    if not content:
        return _invalid(text, "empty_action", max_chars)
    if "<" in content and _THINK_TAG.search(content):
        return _invalid(text, "nested_tags", max_chars)
    if len(content) > max_chars:
        return _invalid(text, "action_too_long", max_chars)
    return ParsedAction(action=content.lower() if lowercase else content, valid=True, reason="")


def _constrained(text: str, admissible: Collection[str] | None, max_chars: int) -> ParsedAction:
    action = text.strip()
    if not action:
        return _invalid(text, "empty_output", max_chars)
    if admissible is not None and action not in admissible:
        return _invalid(text, "not_admissible", max_chars)
    return ParsedAction(action=action, valid=True, reason="")


def parse_action(
    text: str,
    *,
    constrained: bool = False,
    lowercase: bool = True,
    max_action_chars: int = 200,
    admissible: Collection[str] | None = None,
) -> ParsedAction:
    """Extract the action from "<think>...</think><action>...</action>"; never raises on any str.

    Free mode: valid iff exactly one non-empty <action>...</action> (after an optional closed <think> block);
    the action is its whitespace-normalised, optionally lower-cased content. Constrained mode: the text is the
    action as sampled (case kept, since it is one of the admissible strings); with ``admissible`` given it must be
    one of them. An invalid answer's ``action`` is the raw text cut to ``max_action_chars``.
    """
    if not isinstance(text, str):
        return ParsedAction(action="", valid=False, reason="not_a_string")
    try:
        if constrained:
            return _constrained(text, admissible, max_action_chars)
        return _free(text, lowercase, max_action_chars)
    except Exception:  # a parser bug must never crash a rollout; the step is flagged instead
        logger.exception("parse_action: unexpected failure, step flagged invalid")
        return _invalid(text, "parse_error", max_action_chars)
