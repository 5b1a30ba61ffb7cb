"""The env protocol: every bundled env class follows it, and a broken info or class attribute gets an error
naming what is wrong."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import MappingProxyType

import pytest

from envs.alfworld import SHORT_NAMES, AlfworldEnv
from envs.maze import MazeEnv
from envs.protocol import (
    GENERIC_TABLE,
    INFO_KEYS,
    PROMPT_INFO_KEYS,
    EnvSpec,
    EvalTable,
    check_env_class,
    check_info,
)
from envs.webshop import WebShopEnv

ENV_CLASSES = (MazeEnv, AlfworldEnv, WebShopEnv)


@pytest.mark.parametrize("env_cls", ENV_CLASSES, ids=lambda c: c.__name__)
def test_each_env_class_declares_the_protocol(env_cls: type) -> None:
    spec = check_env_class(env_cls, strict=True)
    assert spec.name == env_cls.__name__
    assert spec.splits is not None and "train" in spec.splits and spec.eval_split in spec.splits


def test_the_bundled_envs_metadata() -> None:
    assert check_env_class(MazeEnv) == EnvSpec("MazeEnv", ("train", "eval"), "eval", GENERIC_TABLE)
    alf = check_env_class(AlfworldEnv)
    assert (alf.splits, alf.eval_split) == (("train", "valid_seen", "valid_unseen"), "valid_unseen")
    assert alf.eval_table.name == "alfworld" and alf.eval_table.task_type_columns == SHORT_NAMES
    assert alf.eval_table.columns == ("Pick", "Look", "Clean", "Heat", "Cool", "Pick2", "All")
    assert alf.eval_table.success_column == "All"
    shop = check_env_class(WebShopEnv)
    assert set(shop.splits) == {"train", "eval", "test"} and shop.eval_split == "eval"
    assert shop.eval_table == EvalTable(name="webshop", score=True)
    assert shop.eval_table.columns == ("score", "success") and shop.eval_table.success_column == "success"


def play_two_steps(env) -> None:
    """Every info of a reset and two steps holds the protocol's keys; num_tasks counts the split's tasks."""
    assert env.num_tasks >= 1
    obs, info = env.reset(seed=0, options={"task_id": 0})
    assert isinstance(obs, str) and check_info(info) is info and info["task_id"] == 0
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(str(info["admissible_actions"][0]))
        check_info(info)
        assert isinstance(obs, str) and isinstance(float(reward), float)
        if terminated or truncated:
            break


def test_maze_infos_follow_the_protocol() -> None:
    play_two_steps(MazeEnv({"split": MazeEnv.eval_split}))
    play_two_steps(MazeEnv({"difficulty": "hard"}))


def test_webshop_infos_follow_the_protocol() -> None:
    play_two_steps(WebShopEnv({"split": WebShopEnv.eval_split}))


@pytest.mark.skipif(importlib.util.find_spec("alfworld") is None, reason="needs the alfworld extra")
def test_alfworld_infos_follow_the_protocol() -> None:
    play_two_steps(AlfworldEnv({"split": AlfworldEnv.eval_split}))


def test_a_broken_info_gets_an_error_naming_the_key() -> None:
    info = {"task": "t", "task_id": 0, "admissible_actions": ["a"], "state_key": "s", "won": False}
    with pytest.raises(KeyError, match=r"env info lacks required key\(s\) \['task_type'\].*got keys \["):
        check_info(info)
    with pytest.raises(KeyError, match=r"env info at step 3 lacks required key\(s\) \['state_key', 'won'\]"):
        check_info({"task": "t"}, ("task", "state_key", "won"), where=" at step 3")
    with pytest.raises(TypeError, match="env info must be a dict"):
        check_info(["task"])
    assert check_info({"task": "t", "admissible_actions": []}, PROMPT_INFO_KEYS)
    assert check_info({**info, "task_type": "all"}, INFO_KEYS)
    assert check_info(MappingProxyType({"task": "t"}), ("task",))


class Bare:
    """A class that declares none of the protocol's attributes (an env of someone else)."""


def test_an_env_without_metadata_gets_the_defaults() -> None:
    assert check_env_class(Bare) == EnvSpec("Bare", None, "eval", GENERIC_TABLE)
    assert check_env_class("registered_env_name") == EnvSpec("registered_env_name")
    assert check_env_class(Bare).check_split("anything") == "anything"
    with pytest.raises(
        TypeError, match=r"Bare does not follow the env protocol .* lacks \['splits', 'eval_split'"
    ):
        check_env_class(Bare, strict=True)
    with pytest.raises(TypeError, match="expected an env class"):
        check_env_class("registered_env_name", strict=True)


@pytest.mark.parametrize(
    ("attributes", "error", "message"),
    [
        ({"splits": "train"}, TypeError, "Bad.splits must be a tuple of non-empty str"),
        ({"splits": ("train", "")}, TypeError, "Bad.splits must be a tuple of non-empty str"),
        ({"splits": ()}, ValueError, "Bad.splits must name at least one split"),
        ({"splits": ("train", "train")}, ValueError, "Bad.splits must name at least one split, each once"),
        ({"eval_split": None}, TypeError, "Bad.eval_split must be a non-empty str"),
        ({"splits": ("train",), "eval_split": "eval"}, ValueError, "Bad.eval_split 'eval' is not one of"),
        ({"eval_table": {"Pick": "x"}}, TypeError, "Bad.eval_table must be an envs.protocol.EvalTable"),
    ],
)
def test_a_bad_class_attribute_gets_an_error_naming_it(attributes: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_env_class(type("Bad", (), attributes))


def test_split_check_names_the_field() -> None:
    spec = check_env_class(MazeEnv)
    assert spec.check_split("train") == "train"
    with pytest.raises(ValueError, match=r"--split 'test': MazeEnv has the splits \['train', 'eval'\]"):
        spec.check_split("test", "--split")
    with pytest.raises(ValueError, match="split must be a non-empty str"):
        spec.check_split(None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "EvalTable.name must be a non-empty str"),
        ({"name": "x", "task_type_columns": ["Pick"]}, "EvalTable.task_type_columns must be a mapping"),
        ({"name": "x", "task_type_columns": {"a": "All"}}, "columns must be non-empty str other than 'All'"),
        (
            {"name": "x", "task_type_columns": {"a": "A"}, "score": True},
            "task_type_columns or score, not both",
        ),
        ({"score": True}, "needs a name other than 'generic'"),
    ],
)
def test_a_bad_eval_table_gets_an_error_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        EvalTable(**kwargs)


def test_generic_table_and_column_order() -> None:
    assert GENERIC_TABLE.columns == () and GENERIC_TABLE.success_column == "All"
    table = EvalTable(name="two", task_type_columns={"b_type": "B", "a_type": "A", "a2_type": "A"})
    assert table.columns == ("B", "A", "All")  # in the mapping's order, a shared column once


def test_importing_the_protocol_imports_no_env_and_no_trainer() -> None:
    code = (
        "import sys, envs.protocol; "
        "print(sorted(m for m in sys.modules if m.startswith(('gagpo_rllib', 'envs.', 'gymnasium', 'ray'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['envs.protocol']"
