"""The PPO baseline's Learner: the GAGPO policy loss plus a clipped value loss, the critic on its own optimizer.

Loss = policy loss (``GAGPOTorchLearner``: same ratio, clip, KL and entropy terms) + ``vf_coeff`` * value loss,
in one backward pass per minibatch. The value loss is PPO's clipped one, as in the GiGPO reference's framework:
0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -vf_clip, vf_clip) - R)^2)) with V_old the critic's values
before the update and R = A + V_old the GAE targets (``CriticAdvantages``). The critic's own parameters (its head,
and its trunk unless shared with the policy) have their own optimizer and learning rate (``critic_lr``). With N
learners the value loss gets the policy loss's row weight (n_local * N / n_global), so the DDP-averaged gradient
is the one-learner gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.utils.typing import ModuleID
from torch import Tensor

from gagpo_rllib.connectors.critic_advantages import OLD_VALUES, VALUE_TARGETS
from gagpo_rllib.critic import VALUES
from gagpo_rllib.learner import GAGPOTorchLearner

__all__ = ["CRITIC_OPTIMIZER", "GAGPOCriticTorchLearner", "clipped_value_loss", "explained_variance"]

CRITIC_OPTIMIZER = "critic"


def clipped_value_loss(
    values: Tensor, old_values: Tensor, targets: Tensor, *, clip: float | None = 0.5
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss (see the module docstring) and its clip fraction; ``clip=None``: unclipped."""
    if values.shape != targets.shape or old_values.shape != targets.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)} and targets "
            f"{tuple(targets.shape)} must have the same shape"
        )
    targets = targets.detach().to(values.dtype)
    old_values = old_values.detach().to(values.dtype)
    unclipped = (values - targets) ** 2
    if clip is None:
        return 0.5 * unclipped.mean(), {"vf_clip_fraction": torch.zeros(())}
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - targets) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped).mean()
    return loss, {"vf_clip_fraction": (clipped > unclipped).float().mean().detach()}


def explained_variance(values: Tensor, targets: Tensor) -> float:
    """1 - Var(R - V) / Var(R): 1 for a perfect critic, 0 for a constant one; NaN when the targets are constant."""
    values, targets = values.detach().double(), targets.detach().double()
    var = targets.var(unbiased=False)
    if len(targets) < 2 or float(var) == 0.0:
        return float("nan")
    return float(1.0 - (targets - values).var(unbiased=False) / var)


class GAGPOCriticTorchLearner(GAGPOTorchLearner):
    """``GAGPOTorchLearner`` plus the value loss; logs ``value_loss``, ``vf_explained_var``, ``value_mean``."""

    def configure_optimizers_for_module(self, module_id: ModuleID, config: Any = None) -> None:
        module = self._module[module_id]
        critic = module.unwrapped().critic_parameters()  # unwrapped: also under DDP
        critic_ids = {id(p) for p in critic}
        policy = [p for p in self.get_parameters(module) if id(p) not in critic_ids]
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(policy),
            params=policy,
            lr_or_lr_schedule=config.lr,
        )
        self.register_optimizer(
            module_id=module_id,
            optimizer_name=CRITIC_OPTIMIZER,
            optimizer=torch.optim.Adam(critic),
            params=critic,
            lr_or_lr_schedule=config.critic_lr,
        )

    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: Any, batch: dict[str, Any], fwd_out: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        policy_loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        values = fwd_out[VALUES]
        targets = batch[VALUE_TARGETS].to(values.device)
        value_loss, stats = clipped_value_loss(
            values, batch[OLD_VALUES].to(values.device), targets, clip=config.vf_clip
        )
        logged = {
            "value_loss": float(value_loss.detach()),
            "vf_explained_var": explained_variance(values, targets),
            "value_mean": float(values.detach().mean()),
            "value_target_mean": float(targets.mean()),
            "vf_clip_fraction": float(stats["vf_clip_fraction"]),
        }
        for name, value in logged.items():
            if value != value:  # NaN: constant targets in this minibatch, nothing to explain
                continue
            self.metrics.log_value((module_id, name), value, reduce="mean")
        # The parent's non-finite-step check sees the value loss too.
        self._loss_finite = bool(getattr(self, "_loss_finite", True)) and bool(
            torch.isfinite(value_loss.detach())
        )
        # Weighted like the policy loss, so that DDP's average over learners is the mean over all rows.
        return policy_loss + config.vf_coeff * value_loss * self.step_loss_scale
