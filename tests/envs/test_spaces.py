"""TextSpace keeps whole strings through gymnasium's vector batching."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envs.spaces import TextSpace


class EchoEnv(gym.Env):
    observation_space = TextSpace()
    action_space = TextSpace()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "you are in the hall. exits: north, east", {}

    def step(self, action):
        return f"you said: {action}", 0.0, False, False, {}


def test_any_unicode_string_is_a_member():
    space = TextSpace(max_length=20)
    assert space.contains("héllo wörld [SEP] ✓")
    assert space.contains("")
    assert not space.contains("x" * 21)
    assert not space.contains(b"bytes")
    assert space.contains(space.sample())


def test_batched_form_is_a_1d_object_array_of_whole_strings():
    space = TextSpace()
    batched = batch_space(space, 3)
    out = concatenate(space, ["go north", "take key 1", "ü"], create_empty_array(space, 3))
    assert isinstance(out, np.ndarray) and out.dtype == object and out.shape == (3,)
    assert batched.contains(out)
    assert list(iterate(batched, out)) == ["go north", "take key 1", "ü"]


def test_vector_env_keeps_whole_strings():
    env = gym.vector.SyncVectorEnv([EchoEnv, EchoEnv])
    obs, _ = env.reset(seed=0)
    assert obs.tolist() == ["you are in the hall. exits: north, east"] * 2
    actions = np.empty(2, dtype=object)
    actions[:] = ["go north", "open the red door"]
    obs, *_ = env.step(actions)
    assert obs.tolist() == ["you said: go north", "you said: open the red door"]


def test_env_checker_accepts_text_spaces():
    check_env(EchoEnv(), skip_render_check=True)
