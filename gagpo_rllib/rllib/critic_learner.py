"""The PPO baseline's Learner: the GAGPO policy loss plus a clipped value loss, the critic on its own optimizer.

Loss = policy loss (``GAGPOTorchLearner``: same ratio, clip, KL and entropy terms) + ``vf_coeff`` * value loss,
in one backward pass per minibatch. The value loss is 0.5 * mean((V - R)^2), or with ``vf_clip`` set PPO's clipped
one as in the GiGPO reference's framework,
0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -vf_clip, vf_clip) - R)^2)), with V_old the critic's values
before the update and R = A + V_old the GAE targets (``CriticAdvantages``). The critic's own parameters (its head,
and its trunk unless shared with the policy) have their own optimizer and learning rate (``critic_lr``, by default
the policy's: a critic that trains much slower than the policy tracks only the mean return). Per chunk
and learner the value loss gets the policy loss's row weights (``row_weight``), so the accumulated, averaged
gradient is the one-learner gradient of the step. The value loss's statistics are reduced over the learners with the policy's.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.utils.typing import ModuleID
from torch import Tensor

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.distributed import StepStats
from gagpo_rllib.rllib.learner import GAGPOTorchLearner

__all__ = ["CRITIC_OPTIMIZER", "GAGPOCriticTorchLearner", "clipped_value_loss", "explained_variance"]

CRITIC_OPTIMIZER = "critic"


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    targets: Tensor,
    *,
    clip: float | None = 0.5,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss (see the module docstring) and its clip fraction; ``clip=None``: unclipped.

    ``weights`` [B] replace the mean's 1/B per step (a chunked minibatch passes 1 / its number of steps).
    """
    if values.shape != targets.shape or old_values.shape != targets.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)} and targets "
            f"{tuple(targets.shape)} must have the same shape"
        )
    if weights is not None and weights.shape != values.shape:
        raise ValueError(f"weights: shape {tuple(weights.shape)} differs from values {tuple(values.shape)}")
    targets = targets.detach().to(values.dtype)
    old_values = old_values.detach().to(values.dtype)
    unclipped = (values - targets) ** 2

    def reduce(per_step: Tensor) -> Tensor:
        return per_step.mean() if weights is None else (per_step * weights.detach().to(values.dtype)).sum()

    if clip is None:
        return 0.5 * reduce(unclipped), {"vf_clip_fraction": torch.zeros(())}
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - targets) ** 2
    loss = 0.5 * reduce(torch.maximum(unclipped, clipped))
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
        module = self.module[module_id]
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
            lr_or_lr_schedule=config.lr if config.critic_lr is None else config.critic_lr,
        )

    step_means = (
        *GAGPOTorchLearner.step_means,
        "value_loss",
        "value_mean",
        "value_target_mean",
        "vf_clip_fraction",
    )

    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: Any, batch: dict[str, Any], fwd_out: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        policy_loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        values = fwd_out[Columns.VALUES]
        targets = batch[Columns.VALUE_TARGETS].to(values.device)
        old_values = batch[Columns.OLD_VALUES].to(values.device)
        # Weighted like the policy loss (row_weight), so that the chunks and learners add up to the step's mean.
        weights = torch.as_tensor(batch[Columns.ROW_WEIGHT], dtype=torch.float32).to(values.device)
        value_loss, stats = clipped_value_loss(
            values, old_values, targets, clip=config.vf_clip, weights=weights
        )
        trained = weights > 0
        step = self.step_stats
        # The parent's non-finite-step check sees the value loss too.
        step.finite = step.finite and bool(torch.isfinite(value_loss.detach()))
        if bool(trained.any()):
            v, t, o = values.detach()[trained], targets[trained], old_values[trained]
            mean_loss, _ = clipped_value_loss(v, o, t, clip=config.vf_clip)
            step.add(
                float(trained.sum()),
                {
                    "value_loss": float(mean_loss),
                    "value_mean": float(v.mean()),
                    "value_target_mean": float(t.mean()),
                    "vf_clip_fraction": float(stats["vf_clip_fraction"]),
                },
            )
            step.samples.setdefault(Columns.VALUES, []).append(v.cpu())
            step.samples.setdefault(Columns.VALUE_TARGETS, []).append(t.detach().cpu())
        return policy_loss + config.vf_coeff * value_loss

    def log_step_stats(self, module_id: str, stats: StepStats) -> None:
        super().log_step_stats(module_id, stats)
        if Columns.VALUES in stats.samples:
            ev = explained_variance(
                torch.cat(stats.samples[Columns.VALUES]), torch.cat(stats.samples[Columns.VALUE_TARGETS])
            )
            if ev == ev:  # NaN: constant targets in this minibatch, nothing to explain
                self.metrics.log_value((module_id, "vf_explained_var"), ev, reduce="mean")
