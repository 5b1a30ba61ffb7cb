"""Env-to-module connector: turns each live episode into the chat prompt of its next turn.

The prompt holds the task, the last H (observation, action) pairs, the current observation and the admissible
actions, filled into the environment's own templates (``envs/<name>/prompts.py``) and wrapped in the tokenizer's
chat template by ``PromptBuilder``. The action shown in the history is the one the environment received; an
invalid answer shows as a short marker with its reason (``prompting.invalid_marker``), never as the raw text, which
a model would otherwise copy.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.protocol import PROMPT_INFO_KEYS, check_info
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.prompting import PromptBuilder, invalid_marker

__all__ = ["PromptConnector", "episode_info", "recent_history", "single_module"]

_REQUIRED_INFO = ("task", "admissible_actions")


def single_module(rl_module: RLModule) -> RLModule:
    """The policy module, whether RLlib hands over the module itself or its MultiRLModule wrapper."""
    if isinstance(rl_module, MultiRLModule):
        return rl_module[DEFAULT_MODULE_ID]
    return rl_module


def episode_info(episode: SingleAgentEpisode, index: int = -1) -> dict[str, Any]:
    """The env info at observation ``index`` with the keys a prompt needs checked (``envs.protocol``)."""
    return check_info(episode.get_infos(index), PROMPT_INFO_KEYS)


class PromptConnector(ConnectorV2):
    """Builds ``{"prompts": [...], "admissible": [...]}`` with one entry per episode, in episode order."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        first_template: str,
        template: str,
        history_length: int = 2,
        max_prompt_tokens: int | None = None,
        system_prompt: str | None = None,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.first_template = first_template
        self.template = template
        self.history_length = int(history_length)
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self._builder: PromptBuilder | None = None

    def _get_builder(self, rl_module: RLModule) -> PromptBuilder:
        if self._builder is None:
            self._builder = PromptBuilder(
                single_module(rl_module).tokenizer,
                template=self.template,
                first_template=self.first_template,
                history_length=self.history_length,
                max_prompt_tokens=self.max_prompt_tokens,
                system_prompt=self.system_prompt,
            )
        return self._builder

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        builder = self._get_builder(rl_module)
        prompts, admissible = [], []
        for episode in episodes:
            info = episode_info(episode)
            actions = [str(a) for a in info["admissible_actions"]]
            prompts.append(
                builder.build(
                    task=str(info["task"]),
                    observation=str(episode.get_observations(-1)),
                    admissible_actions=actions,
                    history=recent_history(episode, self.history_length),
                    step=len(episode),
                )
            )
            admissible.append(actions)
        batch[Columns.PROMPTS] = prompts
        batch[Columns.ADMISSIBLE] = admissible
        return batch


def recent_history(episode: SingleAgentEpisode, length: int) -> list[tuple[str, str]]:
    """The last ``length`` (observation, action) pairs before the current observation.

    The action is the one the env received; an invalid answer is shown as ``invalid_marker(reason)``.
    """
    steps = len(episode)
    if steps == 0 or length <= 0:
        return []
    start = max(0, steps - length)
    window = slice(start, steps)
    observations = episode.get_observations(window)
    actions = [str(a) for a in episode.get_extra_model_outputs(Columns.ENV_ACTION, window)]
    if Columns.INVALID in episode.extra_model_outputs:
        invalid = episode.get_extra_model_outputs(Columns.INVALID, window)
        reasons = (
            episode.get_extra_model_outputs(Columns.INVALID_REASON, window)
            if Columns.INVALID_REASON in episode.extra_model_outputs
            else [""] * len(actions)
        )
        actions = [
            invalid_marker(str(r)) if bool(bad) else a
            for a, bad, r in zip(actions, invalid, reasons, strict=True)
        ]
    return [(str(o), a) for o, a in zip(observations, actions, strict=True)]
