"""``TokensPrompt``: a typed dict of prompt token ids, as in vLLM 0.33 (inputs/llm.py:111)."""

from typing import NotRequired, TypedDict


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]


__all__ = ["TokensPrompt"]
