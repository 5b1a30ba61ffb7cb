"""Which steps count as the same state: the state key, a choice of the user, computed once per step.

GAGPO's and GiGPO's step-level groups are the steps of a group with equal state keys. Choices
(``GAGPOConfig.gagpo(state_key=...)``):

    "env"          the env's ``info["state_key"]`` (default; ALFWorld and the maze: the observation text; WebShop:
                   the page text plus the chosen item options)
    "normalized"   the env key as text, case-folded, every run of whitespace folded to one space, ends trimmed.
                   Digits are kept: "drawer 3" and "drawer 4" name different objects, so they stay different states
                   (use ``similarity_threshold`` to merge near-identical texts)
    "history"      the tuple (env key, last H actions the env received), H = ``state_key_history``: the same
                   observation reached by different recent moves is a different state
    "pkg.module:function"   ``function(info, episode)`` (or ``function(info)``) returning any hashable key

The EnvRunner computes the key of s_t once, when the action a_t is chosen (``StateKeyConnector``), and stores it
with the step as the extra model output ``state_key``; the learner passes it to ``compute_advantages`` unchanged.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from envs.protocol import STATE_KEY, check_info
from gagpo_rllib.columns import Columns

__all__ = [
    "FIELD",
    "STATE_KEY_CHOICES",
    "HistoryKey",
    "env_key",
    "episode_state_keys",
    "normalize_text",
    "normalized_key",
    "resolve_state_key",
    "state_key_of",
]

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
