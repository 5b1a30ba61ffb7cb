"""A tiny corridor env following the env protocol, for the RLlib glue's tests (no dependency on envs/maze).

Task i: rooms 0..3, start in room 1 + (i % 2), the goal is room 0 ("left" tasks) or room 3 ("right" tasks).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envs.spaces import TextSpace

FIRST_PROMPT_TEMPLATE = (
    "Task: {task}\nStep {step}. {observation}\nAdmissible actions:\n{admissible_actions}\n"
    "Think in <think>...</think>, then answer with <action>...</action>."
)
PROMPT_TEMPLATE = (
    "Task: {task}\nThe last {history_length} steps:\n{history}\nStep {step}. {observation}\n"
    "Admissible actions:\n{admissible_actions}\nThink in <think>...</think>, then answer with <action>...</action>."
)
ACTIONS = ["go left", "go right"]
_KEYS = {"split", "seed", "max_steps", "num_tasks", "reward_scale"}


class CorridorEnv(gym.Env):
    """Four rooms in a row; reach the goal room. Reward ``reward_scale * won`` at the final step."""

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        for key in config:
            if key not in _KEYS and key not in ("num_envs",):
                raise ValueError(f"CorridorEnv: unknown config key {key!r}")
        self.num_tasks = int(config.get("num_tasks", 4))
        self.max_steps = int(config.get("max_steps", 6))
        self.reward_scale = float(config.get("reward_scale", 10.0))
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._rng = np.random.default_rng(config.get("seed", 0))
        self.task_id = 0
        self.pos = 0
        self.goal = 0
        self.t = 0

    def _info(self, won: bool = False) -> dict[str, Any]:
        return {
            "task": f"reach room {self.goal}",
            "task_id": self.task_id,
            "admissible_actions": list(ACTIONS),
            "state_key": f"{self.task_id}:{self.pos}",
            "won": won,
            "task_type": "left" if self.goal == 0 else "right",
        }

    def _obs(self) -> str:
        return f"You are in room {self.pos}."

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if options and "task_id" in options:
            self.task_id = int(options["task_id"])
        else:
            self.task_id = int(self._rng.integers(self.num_tasks))
        self.pos = 1 + self.task_id % 2
        self.goal = 0 if (self.task_id // 2) % 2 == 0 else 3
        self.t = 0
        return self._obs(), self._info()

    def step(self, action: str):
        self.t += 1
        if action == "go left":
            self.pos = max(0, self.pos - 1)
        elif action == "go right":
            self.pos = min(3, self.pos + 1)
        won = self.pos == self.goal
        truncated = not won and self.t >= self.max_steps
        return self._obs(), self.reward_scale * won, won, truncated, self._info(won)


def make_config(model_path, *, num_env_runners: int = 0, **gagpo: Any):
    """A GAGPOConfig on CorridorEnv with the tiny policy; each keyword of ``gagpo`` goes to its setter."""
    from gagpo_rllib import GAGPOConfig
    from gagpo_rllib.rllib.config import configure

    fields = dict(
        model_path=str(model_path),
        group_size=3,
        groups_per_iteration=2,
        constrained_decoding=True,
        max_new_tokens=8,
        prompt_template=PROMPT_TEMPLATE,
        first_prompt_template=FIRST_PROMPT_TEMPLATE,
    )
    fields.update(gagpo)
    config = (
        GAGPOConfig()
        .environment(CorridorEnv, env_config={"max_steps": 4})
        .env_runners(num_env_runners=num_env_runners)
        .training(lr=1e-3, minibatch_size=4, num_epochs=2)
        .debugging(seed=3)
    )
    return configure(config, **fields)
