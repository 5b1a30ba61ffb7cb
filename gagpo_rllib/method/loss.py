"""The GAGPO policy loss: per-step length-normalised clipped ratio, k3 KL to the reference, entropy bonus.

The credit unit is the environment step: every token of an action shares the step's advantage, and the ratio is
the geometric mean of the token ratios over the action (see the method note).

Off-policy steps (rollouts overlapped with the update, ``max_staleness`` >= 1) use the decoupled objective: the
ratio is taken against the proximal policy pi_prox (the learner's weights at the start of the update, recomputed)
and the step is weighted by its truncated behaviour importance weight w = min(pi_prox / pi_behav, cap), the same
length-normalised form as the ratio (``behaviour_weights``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["behaviour_weights", "gagpo_policy_loss"]


def behaviour_weights(
    proximal: Sequence[Sequence[float]], behaviour: Sequence[Sequence[float]], cap: float
) -> tuple[np.ndarray, int]:
    """Per step w = min(exp(mean_t(log pi_prox(a_t) - log pi_behav(a_t))), cap) over the action's tokens.

    Returns the weights and how many steps had no usable behaviour log-prob (NaN: an engine's answer in another
    tokenisation); those get w = 1, i.e. the step is treated as sampled by the proximal policy.
    """
    if len(proximal) != len(behaviour):
        raise ValueError(f"behaviour: {len(behaviour)} steps for {len(proximal)} proximal steps")
    weights = np.ones(len(proximal), dtype=np.float64)
    unusable = 0
    for i, (prox, behav) in enumerate(zip(proximal, behaviour, strict=True)):
        prox, behav = np.asarray(prox, dtype=np.float64), np.asarray(behav, dtype=np.float64)
        if prox.shape != behav.shape:
            raise ValueError(f"behaviour[{i}]: {behav.shape[0]} log-probs for {prox.shape[0]} proximal ones")
        if len(prox) == 0:
            continue
        log_w = float(np.mean(prox - behav))
        if not np.isfinite(log_w):
            unusable += 1
            continue
        weights[i] = min(float(np.exp(min(log_w, _MAX_LOG_RATIO))), float(cap))
    return weights, unusable


# exp() of a larger log-ratio overflows float32; such steps are clipped anyway.
_MAX_LOG_RATIO = 20.0


def _step_mean(values: Tensor, mask: Tensor, counts: Tensor) -> Tensor:
    """Mean over each step's tokens: [B, M] -> [B]."""
    return (values * mask).sum(-1) / counts


def gagpo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    kl_coeff: float = 0.01,
    entropy: Tensor | None = None,
    entropy_coeff: float = 0.0,
    weights: Tensor | None = None,
    behaviour_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss to minimise and detached stats (means over the valid steps).

    logp/old_logp/ref_logp/mask/entropy: [B, M] per action token; advantages: [B], one per step. Steps whose mask
    is all zero are ignored. ``ref_logp`` may be None only when ``kl_coeff`` is 0.

    The loss is sum_b w_b * (-min(r_b A_b, clip(r_b) A_b) + kl_coeff * KL_b - entropy_coeff * H_b), with r_b the
    step's length-normalised ratio and KL_b, H_b token means over the step. ``weights`` [B] are the w_b; None
    means 1 / (number of valid steps) on each valid step, i.e. the mean over steps. A learner that splits a
    minibatch into chunks passes w_b = 1 / (steps of the whole minibatch): the chunks' losses then add up to the
    minibatch's, and so do their gradients. ``behaviour_weights`` [B] (off-policy steps, see the module docstring)
    multiply each step's clipped surrogate: -u_b min(r_b A_b, clip(r_b) A_b); None means u_b = 1.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp: expected [B, M], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp), ("entropy", entropy)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} differs from logp {tuple(logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages: expected shape ({logp.shape[0]},), got {tuple(advantages.shape)}")
    for name, t in (("weights", weights), ("behaviour_weights", behaviour_weights)):
        if t is not None and t.shape != logp.shape[:1]:
            raise ValueError(f"{name}: expected shape ({logp.shape[0]},), got {tuple(t.shape)}")
    if ref_logp is None and kl_coeff != 0:
        raise ValueError("ref_logp: required when kl_coeff != 0")
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")

    mask = mask.to(logp.dtype)
    tokens = mask.sum(-1)
    valid = tokens > 0
    if not bool(valid.any()):
        zero = logp.sum() * 0.0
        nan = torch.tensor(float("nan"))
        return zero, {k: nan for k in _STAT_KEYS}
    counts = tokens.clamp_min(1.0)
    adv = advantages.to(logp.dtype).detach()

    log_ratio = _step_mean(logp - old_logp.detach(), mask, counts).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surr = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    step_obj = torch.minimum(surr, clipped)
    if behaviour_weights is not None:
        step_obj = step_obj * behaviour_weights.to(device=logp.device, dtype=logp.dtype).detach()
    mean_w = valid.to(logp.dtype) / valid.sum()
    w = mean_w if weights is None else weights.to(logp.dtype).detach() * valid
    policy_loss = -(step_obj * mean_w).sum()
    loss = -(step_obj * w).sum()

    if ref_logp is not None:
        q = (ref_logp.detach() - logp) * mask
        k3 = torch.exp(q) - q - 1.0
        kl_step = _step_mean(k3, mask, counts)
        kl = (kl_step * mean_w).sum()
        loss = loss + kl_coeff * (kl_step * w).sum()
    else:
        kl = logp.sum() * 0.0
    if entropy is not None:
        ent_step = _step_mean(entropy, mask, counts)
        ent = (ent_step * mean_w).sum()
        loss = loss - entropy_coeff * (ent_step * w).sum()
    else:
        ent = logp.sum() * 0.0
    r = ratio.detach()[valid]
    stats = {
        "policy_loss": policy_loss.detach(),
        "kl": kl.detach(),
        "entropy": ent.detach(),
        "ratio_mean": r.mean(),
        "ratio_min": r.min(),
        "ratio_max": r.max(),
        "clip_fraction": ((r - 1.0).abs() > clip_eps).to(logp.dtype).mean(),
    }
    return loss, stats


_STAT_KEYS = ("policy_loss", "kl", "entropy", "ratio_mean", "ratio_min", "ratio_max", "clip_fraction")
