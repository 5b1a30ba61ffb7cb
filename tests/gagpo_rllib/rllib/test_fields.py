"""The field table: each field's own check, and the copies written from it (docs, README, the command line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gagpo_rllib.rllib.fields import FIELD, FIELDS, SETTERS, Field, option_table

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("check", "good", "bad", "wording"),
    [
        ("int>=1", [1, 7], [0, 2.5, True, None], "an int >= 1"),
        ("None|int>=0", [None, 0, 3], [-1, 1.5], "None or an int >= 0"),
        ("num(0,1)", [0.2], [0.0, 1.0, float("nan")], "a number in (0, 1)"),
        ("bool", [True, False], ["yes", 1], "a bool"),
    ],
)
def test_a_check_admits_its_values_and_names_what_it_wants(check, good, bad, wording) -> None:
    field = Field("x", "gagpo", None, check, "doc")
    assert all(field.problem(v) is None for v in good)
    assert all(field.problem(v) == wording for v in bad)


def test_choices_and_rules() -> None:
    assert FIELD["backend"].problem("vllm") is None
    assert FIELD["backend"].problem("tgi") == "one of ('hf', 'vllm')"
    assert FIELD["model_path"].problem(None) is None  # a rule: checked by GAGPOConfig.validate_rules


def test_every_default_passes_its_own_check() -> None:
    assert [f.name for f in FIELDS if f.problem(f.default) is not None] == []
    assert len({f.name for f in FIELDS}) == len(FIELDS)


def test_the_docs_option_table_is_the_tables() -> None:
    text = (ROOT / "docs" / "running.md").read_text()
    copy = text.split("<!-- option-table -->\n", 1)[1].split("\n<!-- /option-table -->", 1)[0]
    assert copy == option_table(), (
        "write it again: python -c 'from gagpo_rllib.rllib.fields import option_table'"
    )


def test_the_readme_lists_each_setters_fields() -> None:
    text = (ROOT / "README.md").read_text()
    for setter in SETTERS:
        row = re.search(rf"^\| `\.{setter}\(\.\.\.\)` \|(.*)\|$", text, flags=re.M)
        assert row, setter
        listed = re.findall(r"`(\w+)`", row.group(1))
        own = [f.name for f in FIELDS if f.setter == setter]
        assert [n for n in listed if n in FIELD] == own, setter


def test_the_command_line_offers_the_tables_choices() -> None:
    from gagpo_rllib.tools.cli import build_parser

    parser = build_parser()
    evaluate = parser._subparsers._group_actions[0].choices["evaluate"]
    options = {a.dest: a for a in evaluate._actions}
    assert tuple(options["backend"].choices) == FIELD["backend"].choices
    assert tuple(options["dtype"].choices) == FIELD["dtype"].choices


def test_the_dtype_choices_are_the_dtype_maps() -> None:
    from gagpo_rllib.policy.models import DTYPES as MAP
    from gagpo_rllib.rllib.fields import DTYPES

    assert tuple(MAP) == DTYPES
