"""RLlib connectors of GAGPO: prompts in (env-to-module), actions out (module-to-env), advantages (learner)."""

from gagpo_rllib.rllib.connectors.env_to_module import PromptConnector
from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages
from gagpo_rllib.rllib.connectors.module_to_env import ActionParserConnector

__all__ = ["ActionParserConnector", "GroupedAdvantages", "PromptConnector"]
