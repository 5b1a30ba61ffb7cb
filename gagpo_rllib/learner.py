"""The GAGPO Learner: clipped, length-normalised per-step ratio, k3 KL to a frozen reference, entropy bonus.

A plain ``TorchLearner`` subclass (``PPOTorchLearner`` would silently add a fake extra timestep per episode and a
GAE connector). The batch comes from ``GroupedAdvantages``; the module's train forward returns the current and
reference log-probs of the action tokens; the loss itself is ``gagpo_rllib.loss.gagpo_policy_loss``. Minibatches,
epochs and gradient clipping are RLlib's (``config.training(minibatch_size=, num_epochs=, grad_clip=)``).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.typing import ModuleID

from gagpo_rllib.loss import gagpo_policy_loss

__all__ = ["GAGPOTorchLearner"]

# How each statistic is reduced over the minibatches of one update (the default is the mean).
_REDUCE = {"ratio_max": "max", "ratio_min": "min", "first_minibatch_ratio_max_dev": "max"}


class GAGPOTorchLearner(TorchLearner):
    """Computes the GAGPO policy loss per module and logs ratio, clipping, KL and entropy statistics.

    ``first_minibatch_ratio_max_dev`` is max |ratio - 1| over the steps of the first minibatch of each update:
    0 up to float noise when rollout and learner log-probs agree (the policy has not moved yet).
    """

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._minibatch_index = 0

    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: Any, batch: dict[str, Any], fwd_out: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        logp, mask = fwd_out["logp"], fwd_out["mask"]
        width = logp.shape[1]
        old_logp = batch["old_logp"][:, :width].to(logp.dtype)
        # None when the module keeps no reference copy (kl_coeff 0); the loss raises if the KL term needs it.
        ref_logp = fwd_out.get("ref_logp")
        loss, stats = gagpo_policy_loss(
            logp,
            old_logp,
            ref_logp,
            batch["advantages"].to(logp.dtype),
            mask,
            clip_eps=config.clip_eps,
            kl_coeff=config.kl_coeff,
            entropy=fwd_out.get("entropy"),
            entropy_coeff=config.entropy_coeff,
        )
        values = {name: float(v.detach()) for name, v in stats.items()}
        if getattr(self, "_minibatch_index", 0) == 0:
            with torch.no_grad():
                m = mask.to(logp.dtype)
                n = m.sum(-1).clamp_min(1.0)
                ratio = torch.exp(((logp - old_logp) * m).sum(-1) / n)
                values["first_minibatch_ratio_max_dev"] = (
                    float((ratio - 1.0).abs().max()) if len(ratio) else 0.0
                )
        self._minibatch_index = getattr(self, "_minibatch_index", 0) + 1
        values["action_tokens_mean"] = float(mask.sum(-1).float().mean()) if len(mask) else 0.0
        for name, value in values.items():
            self.metrics.log_value((module_id, name), value, reduce=_REDUCE.get(name, "mean"))
        return loss
