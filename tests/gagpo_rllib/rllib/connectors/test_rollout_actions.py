"""Module-to-env: any model output becomes an env action; answers without a valid action are flagged, never raise."""

from __future__ import annotations

import random

import numpy as np
import pytest
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.spaces import TextSpace
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.rl_module import object_array
from gagpo_rllib.rllib.connectors.rollout import ActionParserConnector

ADMISSIBLE = ["go north", "take key"]


def _episodes(n: int) -> list[SingleAgentEpisode]:
    out = []
    for _ in range(n):
        ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
        ep.add_env_reset(observation="room", infos={"task": "t", "admissible_actions": ADMISSIBLE})
        out.append(ep)
    return out


def _run(texts: list, constrained: bool = False) -> dict:
    conn = ActionParserConnector(constrained=constrained)
    return conn(
        rl_module=None, batch={RLlibColumns.ACTIONS: object_array(texts)}, episodes=_episodes(len(texts))
    )


def _adversarial(rng: random.Random) -> str:
    pieces = [
        "",
        "<action>",
        "</action>",
        "<think>",
        "</think>",
        "go north",
        "\u00e9\u4e2d\U0001f600",
        "\x00",
        "\n",
        "<action></action>",
        "<action>   </action>",
        "<<action>>",
        "<action><action>x</action></action>",
        "</action>x<action>",
        "<think><action>a</action>",
        "A" * 5000,
        "\ud800",
        "<ACTION>x</ACTION>",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))


def test_valid_free_answers_give_the_action() -> None:
    out = _run(["<think>north is open</think><action>Go North</action>", "<action> take key </action>"])
    assert list(out[RLlibColumns.ACTIONS_FOR_ENV]) == ["go north", "take key"]
    assert list(out[Columns.ENV_ACTION]) == ["go north", "take key"]
    assert not out[Columns.INVALID].any()
    assert list(out[Columns.INVALID_REASON]) == ["", ""]


def test_thousand_random_and_adversarial_outputs_never_raise() -> None:
    rng = random.Random(0)
    texts = [_adversarial(rng) for _ in range(900)]
    texts += ["".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 50))) for _ in range(100)]
    texts[:8] = [
        "",
        " ",
        "<action>",
        "<action></action>",
        "A" * 100_000,
        "<action>a</action><action>b</action>",
        "<think>x</think>",
        "\U0001f600<action>\u00e9</action",
    ]
    out = _run(texts)
    assert out[Columns.INVALID].dtype == bool and len(out[Columns.INVALID]) == 1000
    actions = out[RLlibColumns.ACTIONS_FOR_ENV]
    assert all(isinstance(a, str) for a in actions)
    # Every answer flagged invalid has a reason; every invalid action is cut to the limit.
    for a, bad, reason in zip(actions, out[Columns.INVALID], out[Columns.INVALID_REASON], strict=True):
        assert bool(reason) == bool(bad)
        assert len(a) <= 200
    # The fixed adversarial cases are all invalid.
    assert out[Columns.INVALID][:8].all()
    assert out[Columns.INVALID].sum() > 900


def test_constrained_mode_checks_admissibility() -> None:
    out = _run(["go north", "go nor", "", "Take Key"], constrained=True)
    assert list(out[Columns.INVALID]) == [False, True, True, True]
    assert out[RLlibColumns.ACTIONS_FOR_ENV][0] == "go north"


def test_length_mismatch_is_an_error() -> None:
    conn = ActionParserConnector()
    with pytest.raises(ValueError, match="actions for"):
        conn(rl_module=None, batch={RLlibColumns.ACTIONS: object_array(["a", "b"])}, episodes=_episodes(1))


def test_non_string_outputs_are_invalid() -> None:
    out = _run([None, 3, b"bytes"])
    assert out[Columns.INVALID].tolist() == [True, True, True]
    assert isinstance(out[Columns.INVALID], np.ndarray)
