"""Per-step prompts: the environment's template filled with the task, recent history and admissible actions."""

from __future__ import annotations

import importlib
import logging
import string
from collections import Counter
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

__all__ = ["PromptBuilder", "invalid_marker", "load_env_templates", "render_history"]

logger = logging.getLogger(__name__)

# step: steps taken so far; current_step: the 1-based number of the current observation (history pairs are
# numbered 1..step, so the current one is step + 1).
LATER_FIELDS = frozenset(
    {"task", "step", "current_step", "history_length", "history", "observation", "admissible_actions"}
)
FIRST_FIELDS = LATER_FIELDS - {"history", "history_length"}
_OBS_CUT_MARK = " ..."


def _template_fields(template: str, name: str) -> set[str]:
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as err:
        raise ValueError(f"{name}: not a valid str.format template: {err}") from err


def _check_template(template: str, name: str, allowed: frozenset[str]) -> None:
    fields = _template_fields(template, name)
    unknown = sorted(f for f in fields if f not in allowed)
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def invalid_marker(reason: str) -> str:
    """What the history shows for an invalid answer: a short marker, never the raw text (a model copies it)."""
    return f"(invalid answer: {reason or 'unknown'})"


def render_history(history: Sequence[tuple[str, str]], first_step: int) -> str:
    """Number the (observation, action) pairs with their 1-based step numbers, starting at ``first_step``."""
    lines = []
    for i, (obs, act) in enumerate(history):
        n = first_step + i
        lines.append(f"[Observation {n}: {obs}]\n[Action {n}: {act}]")
    return "\n".join(lines)


class PromptBuilder:
    """Builds the chat-templated prompt of one step; drops the oldest history first to fit max_prompt_tokens.

    ``stats`` counts the fallbacks taken to fit the budget (history dropped, observation cut, still over budget).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        template: str,
        first_template: str,
        history_length: int = 2,
        max_prompt_tokens: int | None = None,
        system_prompt: str | None = None,
    ):
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer.chat_template: the tokenizer has no chat template")
        _check_template(template, "template", LATER_FIELDS)
        _check_template(first_template, "first_template", FIRST_FIELDS)
        self.tokenizer = tokenizer
        self.template = template
        self.first_template = first_template
        self.history_length = int(history_length)
        self.max_prompt_tokens = max_prompt_tokens
        # None: the chat template's own default (some inject one); a str: this system message instead.
        self.system_prompt = system_prompt
        self.stats: Counter[str] = Counter()

    def _fill(
        self, *, task: str, observation: str, admissible: str, history: Sequence[tuple[str, str]], step: int
    ) -> str:
        if step == 0:
            body = self.first_template.format(
                task=task, step=step, current_step=1, observation=observation, admissible_actions=admissible
            )
        else:
            body = self.template.format(
                task=task,
                step=step,
                current_step=step + 1,
                history_length=len(history),
                history=render_history(history, step - len(history) + 1),
                observation=observation,
                admissible_actions=admissible,
            )
        messages = [{"role": "user", "content": body}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _n_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def build(
        self,
        *,
        task: str,
        observation: str,
        admissible_actions: list[str],
        history: Sequence[tuple[str, str]],
        step: int,
    ) -> str:
        """The prompt for step ``step`` (steps taken so far); ``history`` holds all past (observation, action)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        admissible = "\n".join(admissible_actions)
        window = list(history[-self.history_length :]) if self.history_length else []
        prompt = self._fill(
            task=task, observation=observation, admissible=admissible, history=window, step=step
        )
        if self.max_prompt_tokens is None or self._n_tokens(prompt) <= self.max_prompt_tokens:
            return prompt
        while window:
            window = window[1:]
            self.stats["history_dropped"] += 1
            prompt = self._fill(
                task=task, observation=observation, admissible=admissible, history=window, step=step
            )
            if self._n_tokens(prompt) <= self.max_prompt_tokens:
                return prompt
        return self._cut_observation(task=task, observation=observation, admissible=admissible, step=step)

    def _cut_observation(self, *, task: str, observation: str, admissible: str, step: int) -> str:
        """Keep the longest head of the observation that fits (binary search over characters)."""
        lo, hi = 0, len(observation)
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = self._fill(
                task=task,
                observation=observation[:mid] + _OBS_CUT_MARK,
                admissible=admissible,
                history=[],
                step=step,
            )
            if self._n_tokens(cand) <= self.max_prompt_tokens:
                best, lo = cand, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            self.stats["observation_cut"] += 1
            return best
        self.stats["over_budget"] += 1
        logger.warning(
            "PromptBuilder: prompt exceeds max_prompt_tokens=%d even without history and observation",
            self.max_prompt_tokens,
        )
        return self._fill(task=task, observation=_OBS_CUT_MARK, admissible=admissible, history=[], step=step)


def load_env_templates(env_cls: type, *, constrained: bool = False) -> tuple[str, str]:
    """(FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE) from the ``prompts`` module of the env class's package.

    With ``constrained`` the module's CONSTRAINED_FIRST_PROMPT_TEMPLATE / CONSTRAINED_PROMPT_TEMPLATE when it
    defines them: under constrained decoding the answer is the bare action, so a template asking for tags would
    ask for what decoding forbids.
    """
    module = env_cls.__module__
    candidates = (
        [f"{module.rsplit('.', 1)[0]}.prompts", f"{module}.prompts"]
        if "." in module
        else [f"{module}.prompts"]
    )
    for name in candidates:
        try:
            prompts = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and name.startswith(err.name):
                continue
            raise
        try:
            first, later = prompts.FIRST_PROMPT_TEMPLATE, prompts.PROMPT_TEMPLATE
            if constrained:
                first = getattr(prompts, "CONSTRAINED_FIRST_PROMPT_TEMPLATE", first)
                later = getattr(prompts, "CONSTRAINED_PROMPT_TEMPLATE", later)
        except AttributeError as err:
            raise ValueError(
                f"{name}: must define FIRST_PROMPT_TEMPLATE and PROMPT_TEMPLATE ({err})"
            ) from err
        _check_template(first, f"{name}.FIRST_PROMPT_TEMPLATE", FIRST_FIELDS)
        _check_template(later, f"{name}.PROMPT_TEMPLATE", LATER_FIELDS)
        return first, later
    raise ValueError(f"{env_cls.__name__}: no prompts module found (looked for {', '.join(candidates)})")
