"""The EnvRunner's connectors around each model call: the prompt in (env-to-module), the action and the state key
out (module-to-env).

**The prompt** (``PromptConnector``, ``PromptBuilder``): each live episode's chat prompt of its next turn holds the task, the last H (observation, action) pairs, the current observation and the admissible
actions, filled into the environment's own templates (``envs/<name>/prompts.py``) and wrapped in the tokenizer's
chat template by ``PromptBuilder``. The action shown in the history is the one the environment received; an
invalid answer shows as a short marker with its reason (``invalid_marker``), never as the raw text, which a model
would otherwise copy. The supervised warm start (``rllib sft``) builds its prompts with the same ``PromptBuilder``.

**The action** (``ActionParserConnector``, ``parse_action``). Free mode: the answer must hold one
``<action>...</action>`` (after an optional ``<think>...</think>``). Constrained mode: the answer is the action itself
and must be one of the admissible actions (decoding that stops at the token limit can leave a prefix). An answer
that fails is an invalid step: the environment still receives it (as an unrecognised command), the step is flagged
``invalid`` and the learner subtracts the invalid-action penalty. Parsing never raises on any string.

**The state key** (``StateKeyConnector``): which steps count as the same state, a choice of the user, computed once
per step, after the action is parsed and before the env steps, so the key of s_t can use s_t's info and the episode
so far. GAGPO's and GiGPO's step-level groups are the steps of a group with equal state keys. Choices
(``GAGPOConfig.gagpo(state_key=...)``):

    "env"          the env's ``info["state_key"]`` (default; ALFWorld and the maze: the observation text; WebShop:
                   the page text plus the chosen item options)
    "normalized"   the env key as text, case-folded, every run of whitespace folded to one space, ends trimmed.
                   Digits are kept: "drawer 3" and "drawer 4" name different objects, so they stay different states
                   (use ``similarity_threshold`` to merge near-identical texts)
    "history"      the tuple (env key, last H actions the env received), H = ``state_key_history``: the same
                   observation reached by different recent moves is a different state
    "pkg.module:function"   ``function(info, episode)`` (or ``function(info)``) returning any hashable key

The key becomes the step's extra model output ``Columns.STATE_KEY``, which the learner's grouped-advantage connector
hands to ``compute_advantages`` unchanged.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import string
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from transformers import PreTrainedTokenizerBase

from envs.protocol import PROMPT_INFO_KEYS, STATE_KEY, check_info
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.rl_module import object_array

__all__ = [
    "ActionParserConnector",
    "HistoryKey",
    "ParsedAction",
    "PromptBuilder",
    "PromptConnector",
    "StateKeyConnector",
    "FIELD",
    "STATE_KEY_CHOICES",
    "env_key",
    "episode_info",
    "episode_state_keys",
    "invalid_marker",
    "load_env_templates",
    "normalize_text",
    "normalized_key",
    "parse_action",
    "recent_history",
    "render_history",
    "resolve_state_key",
    "single_module",
    "state_key_of",
]

_REQUIRED_INFO = ("task", "admissible_actions")


def single_module(rl_module: RLModule) -> RLModule:
    """The policy module, whether RLlib hands over the module itself or its MultiRLModule wrapper."""
    if isinstance(rl_module, MultiRLModule):
        return rl_module[DEFAULT_MODULE_ID]
    return rl_module


def episode_info(episode: SingleAgentEpisode, index: int = -1) -> dict[str, Any]:
    """The env info at observation ``index`` with the keys a prompt needs checked (``envs.protocol``)."""
    return check_info(episode.get_infos(index), PROMPT_INFO_KEYS)


class PromptConnector(ConnectorV2):
    """Builds ``{"prompts": [...], "admissible": [...]}`` with one entry per episode, in episode order."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        first_template: str,
        template: str,
        history_length: int = 2,
        max_prompt_tokens: int | None = None,
        system_prompt: str | None = None,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.first_template = first_template
        self.template = template
        self.history_length = int(history_length)
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self._builder: PromptBuilder | None = None

    def _get_builder(self, rl_module: RLModule) -> PromptBuilder:
        if self._builder is None:
            self._builder = PromptBuilder(
                single_module(rl_module).tokenizer,
                template=self.template,
                first_template=self.first_template,
                history_length=self.history_length,
                max_prompt_tokens=self.max_prompt_tokens,
                system_prompt=self.system_prompt,
            )
        return self._builder

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        builder = self._get_builder(rl_module)
        prompts, admissible = [], []
        for episode in episodes:
            info = episode_info(episode)
            actions = [str(a) for a in info["admissible_actions"]]
            prompts.append(
                builder.build(
                    task=str(info["task"]),
                    observation=str(episode.get_observations(-1)),
                    admissible_actions=actions,
                    history=recent_history(episode, self.history_length),
                    step=len(episode),
                )
            )
            admissible.append(actions)
        batch[Columns.PROMPTS] = prompts
        batch[Columns.ADMISSIBLE] = admissible
        return batch


def recent_history(episode: SingleAgentEpisode, length: int) -> list[tuple[str, str]]:
    """The last ``length`` (observation, action) pairs before the current observation.

    The action is the one the env received; an invalid answer is shown as ``invalid_marker(reason)``.
    """
    steps = len(episode)
    if steps == 0 or length <= 0:
        return []
    start = max(0, steps - length)
    window = slice(start, steps)
    observations = episode.get_observations(window)
    actions = [str(a) for a in episode.get_extra_model_outputs(Columns.ENV_ACTION, window)]
    if Columns.INVALID in episode.extra_model_outputs:
        invalid = episode.get_extra_model_outputs(Columns.INVALID, window)
        reasons = (
            episode.get_extra_model_outputs(Columns.INVALID_REASON, window)
            if Columns.INVALID_REASON in episode.extra_model_outputs
            else [""] * len(actions)
        )
        actions = [
            invalid_marker(str(r)) if bool(bad) else a
            for a, bad, r in zip(actions, invalid, reasons, strict=True)
        ]
    return [(str(o), a) for o, a in zip(observations, actions, strict=True)]


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


class ActionParserConnector(ConnectorV2):
    """Adds ``ACTIONS_FOR_ENV`` (str per episode), ``env_action``, ``invalid`` and ``invalid_reason``."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        constrained: bool = False,
        lowercase: bool = True,
        max_action_chars: int = 200,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.constrained = bool(constrained)
        self.lowercase = bool(lowercase)
        self.max_action_chars = int(max_action_chars)

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        texts = batch[RLlibColumns.ACTIONS]
        if len(texts) != len(episodes):
            raise ValueError(f"module output has {len(texts)} actions for {len(episodes)} episodes")
        env_actions, invalid, reasons = [], [], []
        for text, episode in zip(texts, episodes, strict=True):
            admissible = None
            # RLlib's own sample() loop may pass a fresh, not yet reset episode (its action is then discarded).
            if self.constrained and episode.is_reset:
                admissible = [str(a) for a in episode_info(episode)["admissible_actions"]]
            parsed = parse_action(
                text,
                constrained=self.constrained,
                lowercase=self.lowercase,
                max_action_chars=self.max_action_chars,
                admissible=admissible,
            )
            env_actions.append(parsed.action)
            invalid.append(not parsed.valid)
            reasons.append(parsed.reason)
        batch[RLlibColumns.ACTIONS_FOR_ENV] = object_array(env_actions)
        batch[Columns.ENV_ACTION] = object_array(env_actions)
        batch[Columns.INVALID] = np.asarray(invalid, dtype=bool)
        batch[Columns.INVALID_REASON] = object_array(reasons)
        return batch


class StateKeyConnector(ConnectorV2):
    """Adds ``state_key`` (one key per episode, in episode order) to the module-to-env batch."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        state_key: str = "env",
        history: int = 2,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.spec = state_key
        self.key_fn = resolve_state_key(state_key, history=history)

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        # RLlib's own sample() loop may pass a fresh, not yet reset episode (its action is then discarded).
        batch[Columns.STATE_KEY] = object_array(
            state_key_of(self.key_fn, episode.get_infos(-1), episode, self.spec) if episode.is_reset else None
            for episode in episodes
        )
        return batch


FIELD = "GAGPOConfig.state_key"
STATE_KEY_CHOICES = ("env", "normalized", "history")

StateKeyFn = Callable[[Mapping[str, Any], Any], Hashable]


def normalize_text(text: Any) -> str:
    """Case-folded text with whitespace runs folded to one space; digits and punctuation kept."""
    return " ".join(str(text).casefold().split())


def env_key(info: Mapping[str, Any], episode: Any = None) -> Hashable:
    """The env's own key (env protocol: every info carries ``state_key``)."""
    return check_info(info, (STATE_KEY,))[STATE_KEY]


def normalized_key(info: Mapping[str, Any], episode: Any = None) -> str:
    """The env key, normalised with ``normalize_text``."""
    return normalize_text(env_key(info))


class HistoryKey:
    """(env key, the last ``length`` actions the env received) for the step whose info is ``info``."""

    def __init__(self, length: int):
        # GAGPOConfig.validate() checks the length (state_key_history or history_length).
        self.length = length

    def __call__(self, info: Mapping[str, Any], episode: Any = None) -> tuple:
        if episode is None:
            raise ValueError(f"{FIELD} 'history' needs the episode (its past actions)")
        steps = len(episode)
        if steps == 0 or self.length == 0:
            return (env_key(info),)
        actions = episode.get_extra_model_outputs(
            Columns.ENV_ACTION, slice(max(0, steps - self.length), steps)
        )
        return (env_key(info), *(str(a) for a in actions))


def _import_function(spec: str) -> Callable:
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(
            f"{FIELD} must be one of {STATE_KEY_CHOICES} or 'package.module:function', got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{FIELD} {spec!r}: cannot import module {module_name!r}: {err}") from err
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise ValueError(f"{FIELD} {spec!r}: module {module_name!r} has no callable {name!r}")
    return fn


def _takes_episode(fn: Callable, spec: str) -> bool:
    """Whether ``fn`` accepts (info, episode) or only (info)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    for args in ((None, None), (None,)):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return len(args) == 2
    raise ValueError(f"{FIELD} {spec!r}: the function must take (info, episode) or (info), got {sig}")


def resolve_state_key(spec: Any, *, history: int = 2) -> StateKeyFn:
    """The key function of a ``state_key`` value; raises ValueError naming the field for a bad one."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"{FIELD} must be one of {STATE_KEY_CHOICES} or 'package.module:function', got {spec!r}"
        )
    if spec == "env":
        return env_key
    if spec == "normalized":
        return normalized_key
    if spec == "history":
        return HistoryKey(history)
    if ":" not in spec:
        raise ValueError(
            f"{FIELD} must be one of {STATE_KEY_CHOICES} or 'package.module:function', got {spec!r}"
        )
    fn = _import_function(spec)
    if _takes_episode(fn, spec):
        return fn

    def info_only(info: Mapping[str, Any], episode: Any = None) -> Hashable:
        return fn(info)

    info_only.__name__ = getattr(fn, "__name__", spec)
    return info_only


def state_key_of(fn: StateKeyFn, info: Mapping[str, Any], episode: Any, spec: str = "") -> Hashable:
    """``fn(info, episode)``, checked: a None or non-hashable key raises ValueError naming the field."""
    key = fn(info, episode)
    label = f"{FIELD} {spec!r}" if spec else FIELD
    if key is None:
        raise ValueError(f"{label} returned None for a step; a key must be a hashable value")
    try:
        hash(key)
    except TypeError:
        raise ValueError(
            f"{label} returned a non-hashable {type(key).__name__} ({key!r:.80}); return a str, int or tuple"
        ) from None
    return key


def episode_state_keys(fn: StateKeyFn, episode: Any, spec: str = "") -> list[Hashable]:
    """The key of every step of a finished episode, each computed on the episode as it was at that step.

    The EnvRunner computes the same keys live; this recomputes them offline, e.g. to compare key choices on one
    set of rollouts (``benchmarks/grouping_diagnostics.py``).
    """
    infos = list(episode.get_infos())
    return [state_key_of(fn, infos[t], episode[:t], spec) for t in range(len(episode))]


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
