"""Learner connector of the PPO baseline: the grouped-advantage batch, with GAE from the learned critic.

Before the update the critic's V(s_t) is computed for every step (no gradient, in chunks); ``critic_gae`` turns
the shaped rewards and V into advantages (whitened over the batch by ``norm``) and value targets R_t = A_t + V(s_t).
The batch gains ``old_values`` and ``value_targets`` for the clipped value loss. Same rollouts, same rows, same
policy loss as the critic-free estimators: only the advantage differs.
"""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.core.rl_module.rl_module import RLModule

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages, critic_gae
from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages
from gagpo_rllib.rllib.connectors.rollout import single_module
from gagpo_rllib.rllib.groups import StepRows

__all__ = ["CriticAdvantages"]


class CriticAdvantages(GroupedAdvantages):
    """``GroupedAdvantages`` for ``estimator="ppo"``: needs a module with ``state_values`` (``CriticRLModule``)."""

    def __init__(self, *args, value_chunk_size: int = 64, **kwargs):
        kwargs.setdefault("estimator", "ppo")
        super().__init__(*args, **kwargs)
        if self.estimator != "ppo":
            raise ValueError(f"CriticAdvantages computes estimator 'ppo', got {self.estimator!r}")
        self.value_chunk_size = int(value_chunk_size)
        self._module = None
        self._values = self._targets = np.zeros(0)

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, **kwargs) -> dict:
        self._module = single_module(rl_module).unwrapped()
        if not hasattr(self._module, "state_values"):
            raise TypeError(
                f"estimator 'ppo' needs the critic module (gagpo_rllib.policy.critic.CriticRLModule), got "
                f"{type(self._module).__name__}"
            )
        try:
            return super().__call__(rl_module=rl_module, batch=batch, episodes=episodes, **kwargs)
        finally:
            self._module = None

    def state_values(self, prompts: list[list[int]]) -> np.ndarray:
        """V(s_t) per step under the critic's current weights, without gradient."""
        module = self._module
        starts = list(range(0, len(prompts), self.value_chunk_size))
        rounds = module.forward_rounds(len(starts))  # FSDP: all learners call the critic as often
        out = []
        with torch.no_grad(), module.compute_context():
            for r in range(rounds):
                if r < len(starts):
                    out.append(
                        module.state_values(prompts[starts[r] : starts[r] + self.value_chunk_size]).cpu()
                    )
                else:
                    module.state_values([[module.pad_token_id]])
        return torch.cat(out).double().numpy() if out else np.zeros(0)

    def advantages(self, rows: StepRows) -> np.ndarray:
        columns = {**rows.columns(), "value": self.state_values(rows.prompt_ids)}
        self._values = columns["value"]
        _, self._targets = critic_gae(columns, gamma=self.gamma, lam=self.lam)
        return compute_advantages(columns, estimator="ppo", gamma=self.gamma, lam=self.lam, norm=self.norm)

    def extra_columns(self, rows: StepRows, idx: np.ndarray) -> dict[str, torch.Tensor]:
        return {
            Columns.OLD_VALUES: torch.as_tensor(self._values[idx], dtype=torch.float32),
            Columns.VALUE_TARGETS: torch.as_tensor(self._targets[idx], dtype=torch.float32),
        }
