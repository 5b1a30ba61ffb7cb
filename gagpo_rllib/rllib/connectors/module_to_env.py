"""Module-to-env connector: extracts the environment action from each generated answer.

Free mode: the answer must hold one ``<action>...</action>`` (after an optional ``<think>...</think>``).
Constrained mode: the answer is the action itself and must be one of the admissible actions (decoding that stops
at the token limit can leave a prefix). An answer that fails is an invalid step: the environment still receives it
(as an unrecognised command), the step is flagged ``invalid`` and the learner subtracts the invalid-action penalty.
Parsing never raises on any string.
"""

from __future__ import annotations

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.core.rl_module.rl_module import RLModule

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.actions import parse_action
from gagpo_rllib.policy.rl_module import object_array
from gagpo_rllib.rllib.connectors.env_to_module import episode_info

__all__ = ["ActionParserConnector"]


class ActionParserConnector(ConnectorV2):
    """Adds ``ACTIONS_FOR_ENV`` (str per episode), ``env_action``, ``invalid`` and ``invalid_reason``."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        constrained: bool = False,
        lowercase: bool = True,
        max_action_chars: int = 200,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.constrained = bool(constrained)
        self.lowercase = bool(lowercase)
        self.max_action_chars = int(max_action_chars)

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        texts = batch[RLlibColumns.ACTIONS]
        if len(texts) != len(episodes):
            raise ValueError(f"module output has {len(texts)} actions for {len(episodes)} episodes")
        env_actions, invalid, reasons = [], [], []
        for text, episode in zip(texts, episodes, strict=True):
            admissible = None
            # RLlib's own sample() loop may pass a fresh, not yet reset episode (its action is then discarded).
            if self.constrained and episode.is_reset:
                admissible = [str(a) for a in episode_info(episode)["admissible_actions"]]
            parsed = parse_action(
                text,
                constrained=self.constrained,
                lowercase=self.lowercase,
                max_action_chars=self.max_action_chars,
                admissible=admissible,
            )
            env_actions.append(parsed.action)
            invalid.append(not parsed.valid)
            reasons.append(parsed.reason)
        batch[RLlibColumns.ACTIONS_FOR_ENV] = object_array(env_actions)
        batch[Columns.ENV_ACTION] = object_array(env_actions)
        batch[Columns.INVALID] = np.asarray(invalid, dtype=bool)
        batch[Columns.INVALID_REASON] = object_array(reasons)
        return batch
