"""The GAGPO Learner: clipped, length-normalised per-step ratio, k3 KL to a frozen reference, entropy bonus.

A ``ChunkedTorchLearner`` (``gagpo_rllib.rllib.rllib_internals``; ``PPOTorchLearner`` would silently add a fake extra
timestep per episode and a GAE connector). The batch comes from ``GroupedAdvantages``; the module's train forward
returns the current and reference log-probs of the action tokens; the loss itself is
``gagpo_rllib.method.loss.gagpo_policy_loss``. Epochs and gradient clipping are RLlib's (``config.training(num_epochs=,
grad_clip=)``); the minibatches and chunks are ``ChunkedTorchLearner``'s:

- **Every step once per epoch.** ``minibatch_size`` (per learner) gives ``ceil(n / minibatch_size)`` minibatches
  of equal size (differing by at most one) that cover the batch (``groups.epoch_minibatches``).
- **Chunks.** A minibatch is trained in length-sorted chunks of at most ``train_chunk_tokens`` tokens, each
  chunk's backward before the next chunk's forward; each row's loss weight (the ``row_weight`` column) is
  N / (rows of the step over all N learners), so the chunks' gradients add up to the minibatch's mean gradient.
- **N learners (DDP or FSDP).** Each learner trains its whole groups (``groups.GroupShardedTrainingData``), all
  take the same number of steps; DDP/FSDP average the gradients over the learners, so with the weights above the
  result is the one-learner gradient of the step. A learner without rows for a step trains one of its rows (or a
  one-token placeholder) with weight 0, which keeps it in the collectives. Logged statistics are reduced over the
  learners once per step (``distributed.reduce_step_stats``: means weighted by rows, ``ratio_max``/``ratio_min``
  over all), so every learner logs the same values.
- **Non-finite updates.** A NaN/inf loss or gradient norm on any learner skips that optimizer step on all of
  them (weights and optimizer state unchanged), counted once per step in ``nonfinite_updates_skipped``
  (``reduce="sum"``). Weights that are not finite are never handed out (no checkpoint, no weight sync).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.utils.typing import ModuleID

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.loss import gagpo_policy_loss
from gagpo_rllib.policy.distributed import StepStats, agree_max, reduce_step_stats, world
from gagpo_rllib.rllib.rllib_internals import ChunkedTorchLearner
from gagpo_rllib.rllib.threads import set_torch_threads

__all__ = ["GAGPOTorchLearner", "NONFINITE_SKIPPED"]

logger = logging.getLogger(__name__)

NONFINITE_SKIPPED = "nonfinite_updates_skipped"

# Statistics averaged over the rows of a step (weighted by rows across learners), and those taken as extremes.
_MEANS = (
    "policy_loss",
    "kl",
    "entropy",
    "ratio_mean",
    "clip_fraction",
    "action_tokens_mean",
    "unique_row_share",
    "reference_cache_hit_share",
)
_HIGHS = ("ratio_max", "first_minibatch_ratio_max_dev")
_REDUCE = {"ratio_max": "max", "ratio_min": "min", "first_minibatch_ratio_max_dev": "max"}


class GAGPOTorchLearner(ChunkedTorchLearner):
    """Computes the GAGPO policy loss per chunk and logs ratio, clipping, KL and entropy statistics per step.

    ``first_minibatch_ratio_max_dev`` is max |ratio - 1| over the steps of the first minibatch of each update:
    0 up to float noise when rollout and learner log-probs agree (the policy has not moved yet).
    """

    # Statistics averaged over the rows of a step (weighted by rows across learners).
    step_means: tuple[str, ...] = _MEANS

    def build(self) -> None:
        """Set torch's threads to this learner's CPU share (``gagpo_rllib.rllib.threads``), then build."""
        set_torch_threads(self.config, "Learner")
        super().build()

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._minibatch_index = 0

    # ------------------------------------------------------------------------------------------------- loss
    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: Any, batch: dict[str, Any], fwd_out: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The loss of one chunk of a step: its rows' terms times their ``row_weight``."""
        logp, mask = fwd_out[Columns.LOGP], fwd_out[Columns.MASK]
        width = logp.shape[1]
        old_logp = batch[Columns.OLD_LOGP][:, :width].to(logp.dtype)
        weights = torch.as_tensor(batch[Columns.ROW_WEIGHT], dtype=torch.float32).to(logp.device)
        # None when the module keeps no reference copy (kl_coeff 0); the loss raises if the KL term needs it.
        ref_logp = fwd_out.get(Columns.REF_LOGP)
        loss, stats = gagpo_policy_loss(
            logp,
            old_logp,
            ref_logp,
            batch[Columns.ADVANTAGES].to(logp.dtype),
            mask,
            clip_eps=config.clip_eps,
            kl_coeff=config.kl_coeff,
            entropy=fwd_out.get(Columns.ENTROPY),
            entropy_coeff=config.entropy_coeff,
            weights=weights,
            behaviour_weights=batch.get(Columns.BEHAVIOUR_WEIGHT),
        )
        rows = float(((mask.sum(-1) > 0) & (weights > 0)).sum())
        means = {
            name: float(stats[name])
            for name in ("policy_loss", "kl", "entropy", "ratio_mean", "clip_fraction")
        }
        means["action_tokens_mean"] = float(mask.sum(-1).float().mean()) if len(mask) else 0.0
        # How much of the forward the learner saved: distinct rows per row, reference rows taken from the cache.
        for name in (Columns.UNIQUE_ROW_SHARE, Columns.REFERENCE_CACHE_HIT_SHARE):
            if name in fwd_out:
                means[name] = float(fwd_out[name])
        highs = {"ratio_max": float(stats["ratio_max"])}
        if getattr(self, "_minibatch_index", 0) == 0:
            with torch.no_grad():
                m = mask.to(logp.dtype)
                n = m.sum(-1).clamp_min(1.0)
                ratio = torch.exp(((logp - old_logp) * m).sum(-1) / n)
                highs["first_minibatch_ratio_max_dev"] = (
                    float((ratio - 1.0).abs().max()) if len(ratio) else 0.0
                )
        step = self.step_stats
        step.finite = step.finite and bool(torch.isfinite(loss.detach()))
        step.rows += rows
        step.add(rows, means, highs=highs, lows={"ratio_min": float(stats["ratio_min"])})
        return loss

    def log_step_stats(self, module_id: str, stats: StepStats) -> None:
        """The step's statistics over all learners (one reduction), logged once per optimizer step."""
        values, global_rows = reduce_step_stats(
            stats, self.device, means=self.step_means, highs=_HIGHS, lows=("ratio_min",)
        )
        stats.global_rows = global_rows
        if all(np.isfinite(v) for v in values.values()):
            for name, value in values.items():
                self.metrics.log_value((module_id, name), value, reduce=_REDUCE.get(name, "mean"))
        self._minibatch_index = getattr(self, "_minibatch_index", 0) + 1

    # -------------------------------------------------------------------------------------------- gradients
    def postprocess_gradients(self, gradients_dict):
        # Decided on the raw gradients (clipping would turn an infinite norm into zeros), agreed by all learners.
        grads = [_local(g) for g in gradients_dict.values() if g is not None]
        norm_finite = (
            bool(torch.isfinite(torch.stack([torch.linalg.vector_norm(g) for g in grads]).sum()))
            if grads
            else True
        )
        bad = not (self.step_stats.finite and norm_finite)
        bad = agree_max(float(bad), grads[0].device if grads else self.device) > 0
        self.step_stats.skipped = bad
        if bad:
            return gradients_dict
        return super().postprocess_gradients(gradients_dict)

    def apply_gradients(self, gradients_dict) -> None:
        _, rank = world()
        step = self.step_stats
        for module_id in self.trained_module_ids():
            self.metrics.log_value(
                (module_id, NONFINITE_SKIPPED), float(step.skipped and rank == 0), reduce="sum"
            )
        if step.skipped or step.global_rows <= 0:
            if step.skipped:
                logger.warning(
                    "GAGPO learner: update %d, minibatch %d: loss or gradient norm not finite, step skipped",
                    self.update_count,
                    getattr(self, "_minibatch_index", 0),
                )
            self.drop_gradients()
            return
        super().apply_gradients(gradients_dict)

    # ------------------------------------------------------------------------------------------------ state
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        if state.get(COMPONENT_RL_MODULE):
            self.check_weights_finite()
        return state

    def check_weights_finite(self) -> None:
        """Raise before weights with a NaN or an infinity are handed out (to runners or a checkpoint): checked on
        the device where the weights live; under FSDP on learner 0's gathered host copy."""
        for module_id, _ in self.module.items():
            if self.sharded:
                weights = self.module[module_id].unwrapped()._gathered or {}
                bad = [name for name, w in weights.items() if not _finite(w)]
            else:
                bad = self.module[module_id].unwrapped().nonfinite_weights()
            if bad:
                raise RuntimeError(
                    f"GAGPO learner: weights {bad[:5]} of {module_id} are not finite; not handing them out"
                )


def _local(t: torch.Tensor) -> torch.Tensor:
    """This learner's shard of an FSDP (DTensor) gradient; the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _finite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    array = np.asarray(value)
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())
