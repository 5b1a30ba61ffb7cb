"""RLlib connectors of GAGPO: prompts in (env-to-module), actions out (module-to-env), advantages (learner)."""

from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages
from gagpo_rllib.rllib.connectors.rollout import ActionParserConnector, PromptConnector

__all__ = ["ActionParserConnector", "GroupedAdvantages", "PromptConnector"]
