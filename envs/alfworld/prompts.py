"""Prompt templates for ALFWorld (str.format strings; the trainer renders {history} and {admissible_actions})."""

from __future__ import annotations

__all__ = ["FIRST_PROMPT_TEMPLATE", "PROMPT_TEMPLATE"]

_ANSWER_FORMAT = (
    "Think about the situation step by step inside <think> </think> tags, then give exactly one of the "
    "admissible actions above, copied verbatim, inside <action> </action> tags."
)

FIRST_PROMPT_TEMPLATE = (
    "You are a household robot acting in a text-based home (ALFWorld).\n"
    "Your task is to: {task}\n"
    "You have taken {step} steps so far.\n"
    "Current observation:\n{observation}\n"
    "Admissible actions:\n{admissible_actions}\n\n" + _ANSWER_FORMAT
)

PROMPT_TEMPLATE = (
    "You are a household robot acting in a text-based home (ALFWorld).\n"
    "Your task is to: {task}\n"
    "You have taken {step} steps so far. Your last {history_length} observations and actions were:\n"
    "{history}\n"
    "Current observation (step {step}):\n{observation}\n"
    "Admissible actions:\n{admissible_actions}\n\n" + _ANSWER_FORMAT
)
