"""Module-to-env connector: the state key of each live episode's current state, stored with the step.

Runs once per step on the EnvRunner, after the action is parsed and before the env steps, so the key of s_t can use
s_t's info and the episode so far (``gagpo_rllib.rllib.state_keys``). The key becomes the step's extra model output
``state_key``, which the learner's grouped-advantage connector hands to ``compute_advantages`` unchanged.
"""

from __future__ import annotations

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.rl_module import RLModule

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.rl_module import object_array
from gagpo_rllib.rllib.state_keys import resolve_state_key, state_key_of

__all__ = ["StateKeyConnector"]


class StateKeyConnector(ConnectorV2):
    """Adds ``state_key`` (one key per episode, in episode order) to the module-to-env batch."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        state_key: str = "env",
        history: int = 2,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.spec = state_key
        self.key_fn = resolve_state_key(state_key, history=history)

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        # RLlib's own sample() loop may pass a fresh, not yet reset episode (its action is then discarded).
        batch[Columns.STATE_KEY] = object_array(
            state_key_of(self.key_fn, episode.get_infos(-1), episode, self.spec) if episode.is_reset else None
            for episode in episodes
        )
        return batch
