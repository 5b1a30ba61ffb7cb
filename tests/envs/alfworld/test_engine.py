"""The memoised engine gives exactly the stock TextWorld/ALFWorld engine's texts, commands and wins."""

from __future__ import annotations

import random

import pytest
import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
from textworld.envs.pddl import PddlEnv, textgen

from envs.alfworld import engine as engine_module
from envs.alfworld.engine import AlfredEngine, memoised_engine
from envs.alfworld.games import BUNDLED_DATA, find_games, read_game
from envs.alfworld.tasks import TASK_TYPES


def _one_per_type() -> list[str]:
    games = find_games(BUNDLED_DATA, "valid_unseen").games
    return [next(g.game_file for g in games if g.task_type == t) for t in TASK_TYPES]


def _commands(walkthrough: list[str], admissible: list[str], rng: random.Random) -> list[str]:
    """The walkthrough with detours: random admissible commands, inventory, an invalid command."""
    out = []
    for i, command in enumerate(walkthrough):
        if i == 1:
            out += ["inventory", "look", "jump around"]
        out.append(command)
    return [rng.choice(admissible), *out]


@pytest.mark.parametrize("game_file", _one_per_type(), ids=lambda p: p.split("/")[-3].split("-")[0])
def test_same_observations_as_the_stock_engine(game_file):
    data = read_game(game_file)
    stock = AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True)), shuffle=False)
    stock.load(data)
    fast = AlfredEngine()
    fast.load(data, game_file)
    for episode in range(2):  # the second episode runs on the cached translation
        s_state, f_state = stock.reset(), fast.reset()
        assert f_state.feedback == s_state.feedback
        assert f_state["admissible_commands"] == s_state["admissible_commands"]
        commands = _commands(data["walkthrough"], s_state["admissible_commands"], random.Random(episode))
        for command in commands:
            s_state, _, _ = stock.step(command)
            f_state = fast.step(command)
            assert f_state.feedback == s_state.feedback, command
            assert f_state["admissible_commands"] == s_state["admissible_commands"], command
            assert f_state["won"] == s_state["won"]
        assert f_state["won"]


def test_patches_are_restored_even_on_error():
    stock_parse = textgen._parse_and_convert
    stock_copy = textgen.copy_context
    with pytest.raises(RuntimeError), memoised_engine():
        assert textgen._parse_and_convert is not stock_parse
        raise RuntimeError("boom")
    assert textgen._parse_and_convert is stock_parse and textgen.copy_context is stock_copy
    assert engine_module.pddl_logic.PddlState is engine_module._STOCK["PddlState"]
