"""The package's layout rule, read from the source (every import, at module level or inside a function):

    gagpo_rllib.method   imports nothing of ours but itself (framework-free: numpy, torch, pyarrow, scipy, rapidfuzz)
    gagpo_rllib.policy   of ours only method, policy and the top-level vocabulary gagpo_rllib.columns; of the envs
                         only envs.protocol
    gagpo_rllib.rllib    of the envs only envs.protocol (the RLlib glue names no specific env)
    gagpo_rllib.columns  nothing of ours (a vocabulary)
    envs.protocol        nothing of ours (the library imports it; it must not pull in an env or the trainer)
    envs                 nothing of gagpo_rllib
    gagpo_rllib.tools    anything (the commands may name the bundled envs)

A whole string literal that is a module path of ours (``importlib.import_module("envs.maze")``, a
``"envs.maze:MazeEnv"`` spec) counts as an import too.

Two vocabularies have one home each: an episode's outcome keys (``won``, ``task_type``, ``task_score``) are read
through ``envs.protocol`` (no such literal in ``gagpo_rllib``), and batch column names through
``gagpo_rllib.columns`` (no column-name literal used as a key outside it; ``method`` names its own table columns).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("gagpo_rllib", "envs")
# importer package -> what of ours it may import (module prefixes); the longest matching importer applies.
RULES: dict[str, tuple[str, ...]] = {
    "gagpo_rllib.method": ("gagpo_rllib.method",),
    "gagpo_rllib.policy": (
        "gagpo_rllib.method",
        "gagpo_rllib.policy",
        "gagpo_rllib.columns",
        "envs.protocol",
    ),
    "gagpo_rllib.rllib": ("gagpo_rllib", "envs.protocol"),
    "gagpo_rllib.columns": (),
    "envs.protocol": (),
    "envs": ("envs",),
}
MODULE_STRING = re.compile(r"(?:gagpo_rllib|envs)(?:\.\w+)+(?::\w+)?")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imported_modules(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in ``source`` of module ``module``: ``import a.b`` gives a.b,
    ``from a import b`` gives a.b (b may be a module or a name in a; either way the import reaches into a),
    relative imports resolved, and whole string literals that are module paths of ours."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_STRING.fullmatch(node.value)
        ):
            yield node.lineno, node.value.partition(":")[0]


def rule_for(module: str) -> tuple[str, tuple[str, ...]] | None:
    """(importer package, allowed prefixes) of the most specific rule covering ``module``; None: unrestricted."""
    matches = [p for p in RULES if _under(module, p)]
    if not matches:
        return None
    importer = max(matches, key=len)
    return importer, RULES[importer]


def violations(source: str, module: str, *, is_package: bool = False, where: str = "") -> list[str]:
    """One line per import of ``source`` (module ``module``) that the layout rule forbids."""
    rule = rule_for(module)
    if rule is None:
        return []
    importer, allowed = rule
    out = []
    for line, name in imported_modules(source, module, is_package=is_package):
        ours = any(_under(name, p) for p in OURS)
        if ours and not _under(name, module) and not any(_under(name, p) for p in allowed):
            out.append(
                f"{where or module}:{line}: imports {name} ({importer} may import of ours only "
                f"{', '.join(allowed) or 'nothing'})"
            )
    return out


def source_modules() -> Iterator[tuple[Path, str, bool]]:
    for top in OURS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            yield path, ".".join(parts[:-1] if is_package else parts), is_package


def test_the_package_follows_the_layout_rule() -> None:
    found = []
    checked = 0
    for path, module, is_package in source_modules():
        checked += 1
        found += violations(
            path.read_text(), module, is_package=is_package, where=str(path.relative_to(ROOT))
        )
    assert checked > 50  # the walk found the sources
    assert found == [], "layout rule broken:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "forbidden"),
    [
        ("gagpo_rllib.method.loss", "import gagpo_rllib.policy.models", "gagpo_rllib.policy.models"),
        ("gagpo_rllib.method.loss", "from envs.protocol import check_info", "envs.protocol.check_info"),
        (
            "gagpo_rllib.policy.models",
            "from gagpo_rllib.rllib.algorithm import GAGPOConfig",
            "gagpo_rllib.rllib",
        ),
        (
            "gagpo_rllib.policy.models",
            "def f():\n    from gagpo_rllib.tools import sft\n",
            "gagpo_rllib.tools.sft",
        ),
        ("gagpo_rllib.policy.models", "from gagpo_rllib import tools", "gagpo_rllib.tools"),
        ("gagpo_rllib.policy.models", "from ..tools.sft import finetune", "gagpo_rllib.tools.sft.finetune"),
        ("gagpo_rllib.policy.models", "def f():\n    import envs.alfworld.games\n", "envs.alfworld.games"),
        (
            "gagpo_rllib.rllib.evaluation",
            "def f():\n    from envs.alfworld.tasks import X\n",
            "envs.alfworld",
        ),
        ("gagpo_rllib.rllib.evaluation", "from envs import maze", "envs.maze"),
        ("gagpo_rllib.rllib.evaluation", "import envs", "envs"),
        ("gagpo_rllib.rllib.evaluation", 'ALIASES = {"maze": "envs.maze:MazeEnv"}', "envs.maze"),
        ("gagpo_rllib.rllib", "import importlib\nimportlib.import_module('envs.webshop')", "envs.webshop"),
        ("gagpo_rllib.columns", "from gagpo_rllib.policy.rl_module import PROMPTS", "gagpo_rllib.policy"),
        ("envs.maze.env", "from gagpo_rllib.policy import logprobs", "gagpo_rllib.policy.logprobs"),
        ("envs.maze.env", "def f():\n    import gagpo_rllib\n", "gagpo_rllib"),
        ("envs.protocol", "from envs.spaces import TextSpace", "envs.spaces.TextSpace"),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str, forbidden: str) -> None:
    found = violations(source, module)
    assert len(found) == 1 and f"imports {forbidden}" in found[0], found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("gagpo_rllib.method.loss", "import numpy as np\nimport torch\nfrom gagpo_rllib.method import stats"),
        ("gagpo_rllib.method.loss", "from . import advantages\nfrom .stats import summary"),
        (
            "gagpo_rllib.policy.rl_module",
            "from gagpo_rllib.method.loss import x\nfrom gagpo_rllib.columns import A",
        ),
        ("gagpo_rllib.policy.rl_module", "from envs.protocol import check_info\nfrom envs import protocol"),
        ("gagpo_rllib.policy.generation.hf", "from .base import GenerationBackend"),
        (
            "gagpo_rllib.rllib.evaluation",
            "from gagpo_rllib.tools import x\nfrom envs.protocol import EvalTable",
        ),
        ("gagpo_rllib.rllib.evaluation", '"""envs.maze:MazeEnv is the maze."""\nx = "see envs/maze"'),
        ("gagpo_rllib.tools.env_names", 'import envs.maze\nALIASES = {"maze": "envs.maze:MazeEnv"}'),
        ("envs.maze.env", "from envs.maze.layout import SPLITS\nfrom envs.protocol import EvalTable"),
        ("envs.protocol", "from collections.abc import Mapping"),
    ],
)
def test_an_allowed_import_passes(module: str, source: str) -> None:
    assert violations(source, module) == []


def test_relative_imports_of_a_package_resolve_from_the_package_itself() -> None:
    assert violations("from . import logprobs", "gagpo_rllib.policy", is_package=True) == []
    found = violations("from .. import rllib", "gagpo_rllib.policy", is_package=True)
    assert len(found) == 1 and "imports gagpo_rllib.rllib " in found[0]


OUTCOME_KEYS = ("won", "task_type", "task_score")
# (file, literal): a column-name string that is another vocabulary's key there.
OTHER_VOCABULARIES = {
    ("gagpo_rllib/policy/logprobs.py", "values"),  # the reference cache's own checkpointed state layout
}


def outcome_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant that is an outcome key."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OUTCOME_KEYS
    ]


def column_key_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every column-name string used as a key: a subscript, a ``.get``/``.pop``/
    ``.setdefault``/``get_extra_model_outputs`` argument, an ``in`` test, a dict key or a module constant."""
    found = []
    for node in ast.walk(ast.parse(source)):
        keys: list = []
        if isinstance(node, ast.Subscript):
            keys.append(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault", "get_extra_model_outputs")
            and node.args
        ):
            keys.append(node.args[0])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            keys.append(node.left)
        elif isinstance(node, ast.Dict):
            keys.extend(k for k in node.keys if k is not None)
        elif isinstance(node, ast.Assign):
            keys.append(node.value)
        found += [
            (k.lineno, k.value)
            for k in keys
            if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value in names
        ]
    return found


def library_sources() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "gagpo_rllib").rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()


def test_no_outcome_literal_outside_envs() -> None:
    found = [
        f"{rel}:{line}: {value!r}" for rel, src in library_sources() for line, value in outcome_literals(src)
    ]
    assert found == [], "read an episode's outcome with envs.protocol.outcome:\n" + "\n".join(found)


def test_column_names_live_in_columns() -> None:
    from gagpo_rllib.columns import Columns

    names = set(Columns.names().values())
    found = [
        f"{rel}:{line}: {value!r}"
        for rel, src in library_sources()
        if rel != "gagpo_rllib/columns.py" and not rel.startswith("gagpo_rllib/method/")
        for line, value in column_key_literals(src, names)
        if (rel, value) not in OTHER_VOCABULARIES
    ]
    assert found == [], "use gagpo_rllib.columns.Columns:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('x = info.get("won", False)', ["won"]),
        ('d = {"task_type": t}', ["task_type"]),
        ("x = info.get(WON, False)", []),
    ],
)
def test_an_outcome_literal_is_caught(source: str, caught: list[str]) -> None:
    assert [v for _, v in outcome_literals(source)] == caught


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('ids = episode.get_extra_model_outputs("prompt_ids")', ["prompt_ids"]),
        ('PROMPTS = "prompts"', ["prompts"]),
        ('row = {"invalid": True}', ["invalid"]),
        ('ok = "group_id" in episode.custom_data', ["group_id"]),
        ("ids = batch[Columns.PROMPT_IDS]", []),
        ('label = "prompt_ids are left-padded"', []),
    ],
)
def test_a_column_key_literal_is_caught(source: str, caught: list[str]) -> None:
    assert [
        v for _, v in column_key_literals(source, {"prompt_ids", "prompts", "invalid", "group_id"})
    ] == caught
