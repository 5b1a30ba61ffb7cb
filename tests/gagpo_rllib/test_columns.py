"""The batch-column namespace: one name per column, each used by the library, nothing of ours imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import gagpo_rllib
from gagpo_rllib.columns import Columns

PACKAGE = Path(gagpo_rllib.__file__).resolve().parent


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "columns.py"}


def test_every_column_has_its_own_name() -> None:
    names = Columns.names()
    assert len(names) >= 30
    values = list(names.values())
    assert len(set(values)) == len(values), sorted(v for v in values if values.count(v) > 1)
    assert all(re.fullmatch(r"[a-z][a-z_]*", v) for v in values)


def test_every_column_is_used_by_the_library() -> None:
    text = "\n".join(_sources().values())
    unused = [name for name in Columns.names() if not re.search(rf"\bColumns\.{name}\b", text)]
    assert not unused


def test_columns_imports_nothing_of_ours_and_is_not_instantiated() -> None:
    tree = ast.parse((PACKAGE / "columns.py").read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)] + [
        a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
    ]
    assert not [m for m in imported if m.startswith(("gagpo_rllib", "envs"))]
    with pytest.raises(TypeError, match="namespace"):
        Columns()


def test_the_on_the_wire_names_are_unchanged() -> None:
    """Checkpointed episodes and tests written against the strings keep working."""
    assert Columns.GROUP_ID == "group_id" and Columns.PROMPT_IDS == "prompt_ids"
    assert Columns.ACTION_LOGP == "action_logp" and Columns.OLD_LOGP == "old_logp"
    assert (
        Columns.INVALID == "invalid"
        and Columns.STATE_KEY == "state_key"
        and Columns.ENV_ACTION == "env_action"
    )
    assert Columns.ROW_WEIGHT == "row_weight" and Columns.ADVANTAGES == "advantages"
