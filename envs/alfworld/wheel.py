"""Paths to the data files shipped inside the alfworld wheel (PDDL domain, grammar, scene layouts).

They are located with ``importlib.util.find_spec`` so that looking them up does not import ``alfworld``, whose
import creates ``$ALFWORLD_DATA`` on disk as a side effect.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

__all__ = ["alfworld_root", "domain_path", "grammar_path", "layouts_dir", "read_domain", "read_grammar"]


@cache
def alfworld_root() -> Path:
    """Directory of the installed alfworld package."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the alfworld package is not installed: pip install 'alfworld==0.4.2' (or the project's [alfworld] extra)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def domain_path() -> Path:
    return alfworld_root() / "data" / "alfred.pddl"


def grammar_path() -> Path:
    return alfworld_root() / "data" / "alfred.twl2"


def layouts_dir() -> Path:
    return alfworld_root() / "gen" / "layouts"


@cache
def read_domain() -> str:
    return domain_path().read_text()


@cache
def read_grammar() -> str:
    return grammar_path().read_text()
