"""Prompt templates of the maze environment: short and regular, so a tiny word-level policy can learn them.

Fields (filled by the trainer): {task}, {step}, {history_length}, {history}, {observation},
{admissible_actions} (one per line). The first step's template has no history.
"""

__all__ = ["FIRST_PROMPT_TEMPLATE", "PROMPT_TEMPLATE"]

FIRST_PROMPT_TEMPLATE = (
    "Task: {task}. Step {step}.\n"
    "{observation}\n"
    "Actions:\n{admissible_actions}\n"
    "Answer <think>...</think><action>...</action>."
)

PROMPT_TEMPLATE = (
    "Task: {task}. Step {step}.\n"
    "Last {history_length} moves:\n{history}\n"
    "{observation}\n"
    "Actions:\n{admissible_actions}\n"
    "Answer <think>...</think><action>...</action>."
)
