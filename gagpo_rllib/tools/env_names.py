"""The command line's env names (``--env maze``): the one place that maps a short name to a bundled env class.

The library itself never names a specific env; it reads what it needs from the class through ``envs.protocol``.
"""

from __future__ import annotations

import importlib

from envs.protocol import check_env_class

__all__ = ["ENV_ALIASES", "resolve_env"]

ENV_ALIASES = {
    "maze": "envs.maze:MazeEnv",
    "alfworld": "envs.alfworld:AlfworldEnv",
    "webshop": "envs.webshop:WebShopEnv",
}


def resolve_env(name: str) -> type:
    """An env class from an alias (maze, alfworld, webshop) or ``package.module:ClassName``, its protocol
    attributes checked."""
    spec = ENV_ALIASES.get(name, name)
    module_name, sep, class_name = spec.partition(":")
    if not sep or not class_name:
        raise ValueError(
            f"--env must be one of {sorted(ENV_ALIASES)} or 'package.module:ClassName', got {name!r}"
        )
    try:
        env = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--env {name!r}: cannot import {spec}: {err}") from err
    check_env_class(env)
    return env
