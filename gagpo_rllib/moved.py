"""Where the modules of earlier versions live now: checkpoints pickle classes under the path they had when written.

``install()`` (run by ``import gagpo_rllib``, so before any pickle names a submodule) adds an import hook that
answers an old module path with today's module, or, where one module became several, with a module that looks a
name up in each of them. Nothing here imports the package's modules until an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Any

__all__ = ["MOVED", "install", "resolve"]

_P, _R, _T = "gagpo_rllib.policy.", "gagpo_rllib.rllib.", "gagpo_rllib.tools."
_ROLLOUT = (_R + "connectors.rollout",)
# old module path (none exists today) -> today's modules holding its names, looked up in order
MOVED: dict[str, tuple[str, ...]] = {
    **{
        f"gagpo_rllib.{m}": ("gagpo_rllib.method." + m,)
        for m in ("advantages", "loss", "similarity", "stats")
    },
    **{
        f"gagpo_rllib.{m}": (_P + m,) for m in ("critic", "distributed", "fsdp", "logprobs", "lora", "models")
    },
    **{f"gagpo_rllib.{m}": (_P + m,) for m in ("rl_module", "weight_buckets")},
    **{f"gagpo_rllib.{m}": (_R + m,) for m in ("critic_learner", "engine_sleep", "env_runner", "evaluation")},
    **{
        f"gagpo_rllib.{m}": (_R + m,) for m in ("group_sampling", "learner", "paper_setup", "rllib_internals")
    },
    **{f"gagpo_rllib.{m}": (_R + m,) for m in ("threads", "weight_sync")},
    **{f"gagpo_rllib.{m}": (_T + m,) for m in ("cli", "demonstrations", "export", "plots", "ray_metrics")},
    **{f"gagpo_rllib.{m}": (_T + m,) for m in ("sft", "train")},
    "gagpo_rllib.algorithm": (_R + "algorithm", _R + "config"),
    "gagpo_rllib.generation": (_P + "generation",),
    **{f"gagpo_rllib.generation.{m}": (_P + "generation." + m,) for m in ("base", "hf", "vllm")},
    "gagpo_rllib.generation.constraints": (_P + "generation.base",),
    _P + "generation.constraints": (_P + "generation.base",),
    "gagpo_rllib.connectors": (_R + "connectors",),
    "gagpo_rllib.connectors.critic_advantages": (_R + "connectors.critic_advantages",),
    "gagpo_rllib.connectors.grouped_advantages": (_R + "connectors.grouped_advantages", _R + "groups"),
    **{f"gagpo_rllib.{m}": _ROLLOUT for m in ("actions", "prompting", "state_keys")},
    **{f"gagpo_rllib.connectors.{m}": _ROLLOUT for m in ("env_to_module", "module_to_env", "state_keys")},
    **{f"{_R}connectors.{m}": _ROLLOUT for m in ("env_to_module", "module_to_env", "state_keys")},
    **{_P + m: _ROLLOUT for m in ("actions", "prompting")},
    _R + "state_keys": _ROLLOUT,
    **{f"gagpo_rllib.{m}": (_P + "logprobs",) for m in ("reference_cache", "unique_rows")},
    **{_P + m: (_P + "logprobs",) for m in ("reference_cache", "unique_rows")},
    "gagpo_rllib.dynamic_sampling": (_R + "groups",),
    _R + "dynamic_sampling": (_R + "groups",),
    "gagpo_rllib.sharding": (_R + "groups", _R + "placement"),
    _R + "sharding": (_R + "groups", _R + "placement"),
    _R + "plans": (_R + "group_sampling",),
}


_MISSING = object()


def resolve(module: str, name: str) -> Any:
    """``module.name`` (``name`` may be qualified: ``Class.method``) under an old or a current module path;
    AttributeError / ImportError when none has it."""
    for candidate in MOVED.get(module, (module,)):
        found: Any = importlib.import_module(candidate)
        for part in name.split("."):  # a qualified name: a method or a nested class
            found = getattr(found, part, _MISSING)
            if found is _MISSING:
                break
        else:
            return found
    raise AttributeError(f"{module}.{name}: no such name here (moved to {MOVED.get(module, (module,))})")


class _Moved(types.ModuleType):
    """An old module path: each attribute is looked up in today's modules."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(self.__name__, name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        targets = MOVED[spec.name]
        if len(targets) == 1:
            return importlib.import_module(targets[0])
        return _Moved(spec.name)

    def exec_module(self, module) -> None:
        return None


def install() -> None:
    """Add the hook once (idempotent), first in line: it answers the old paths only, and must answer them before a
    normal finder loads a second copy of a module under an old package alias."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
