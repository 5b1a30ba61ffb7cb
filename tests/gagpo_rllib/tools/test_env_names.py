"""The command line's env names: the bundled envs by short name, any class by ``package.module:ClassName``."""

from __future__ import annotations

import pytest

from envs.maze import MazeEnv
from envs.webshop import WebShopEnv
from gagpo_rllib.tools.env_names import ENV_ALIASES, resolve_env


def test_names_resolve_to_env_classes() -> None:
    assert resolve_env("maze") is MazeEnv
    assert resolve_env("envs.webshop:WebShopEnv") is WebShopEnv
    assert sorted(ENV_ALIASES) == ["alfworld", "maze", "webshop"]
    assert resolve_env("alfworld").__name__ == "AlfworldEnv"  # the class imports without alfworld itself


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nowhere", "--env must be one of"),
        ("envs.nowhere:Env", "cannot import envs.nowhere:Env"),
        ("envs.maze:NoSuchEnv", "cannot import envs.maze:NoSuchEnv"),
    ],
)
def test_bad_names_raise_naming_the_option(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_env(name)


def test_a_class_with_a_bad_protocol_attribute_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MazeEnv, "eval_split", "valid_unseen")
    with pytest.raises(ValueError, match=r"MazeEnv.eval_split 'valid_unseen' is not one of MazeEnv.splits"):
        resolve_env("maze")
