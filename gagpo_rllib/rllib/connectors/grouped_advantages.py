"""Learner connector: grouped episodes -> step advantages -> one padded token batch.

Each complete episode carries ``custom_data[Columns.GROUP_ID]`` (the K rollouts of one task instance share it), per
step the prompt ids, action ids, behaviour log-probs, the ``invalid`` flag and the state key (extra model outputs),
and per observation the env info. The connector takes the episodes' step rows (``groups.episode_rows``: columns
``group_id, episode_id, reward, state_key``) and calls ``advantages.compute_advantages`` on them.

The reward column is the environment's reward minus ``invalid_penalty`` on invalid steps: the penalty shapes the
learning signal only. Reported episode returns and success rates (EnvRunner metrics) use the env's own rewards.

With ``recompute_old_logprobs`` the "old" log-probs of the ratio are recomputed by the learner's own weights
(before the update, without gradient) instead of taken from the rollout backend; the same pass computes the
reference log-probs of the KL term (``LLMRLModule.no_grad_logprobs``), once per update instead of once per
minibatch and epoch. Needed whenever the rollout
numerics differ from the learner's: vLLM, or bf16/fp16 kernels on a GPU (cached decoding and the full forward
differ by up to ~4e-3 in bf16), where the first-minibatch ratio would otherwise not start at 1. The largest
difference between rollout and recomputed log-probs is logged as ``old_logp_rollout_max_dev``.

Which groups train is the driver's decision (``groups.stamp_training_groups``, once per iteration in
``GAGPO.training_step``), stamped on every episode (``custom_data[Columns.TRAINS]``): this connector reads the stamp
and drops the rows of groups that do not train. Episodes without a stamp (the connector used on its own) are
stamped here by that same function.
"""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModule

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages, grouping_diagnostics
from gagpo_rllib.method.loss import behaviour_weights
from gagpo_rllib.method.similarity import anchor_keys
from gagpo_rllib.policy.generation.base import allowed_token_masks
from gagpo_rllib.rllib.connectors.rollout import single_module
from gagpo_rllib.rllib.groups import StepRows, episode_rows, group_id, stamp_training_groups, trains

__all__ = ["GroupedAdvantages"]


def _pad(seqs: list[list], width: int, fill, dtype, left: bool) -> torch.Tensor:
    out = torch.full((len(seqs), width), fill, dtype=dtype)
    for i, s in enumerate(seqs):
        if s:
            t = torch.as_tensor(s, dtype=dtype)
            if left:
                out[i, width - len(s) :] = t
            else:
                out[i, : len(s)] = t
    return out


def _max_abs_dev(a: list[list[float]], b: list[list[float]]) -> float:
    """max |a - b| over the finite entries (a vLLM rollout marks log-probs it could not map with NaN)."""
    flat_a = np.fromiter((x for row in a for x in row), dtype=np.float64)
    flat_b = np.fromiter((x for row in b for x in row), dtype=np.float64)
    if flat_a.shape != flat_b.shape:
        raise ValueError(
            f"rollout and recomputed log-probs differ in length: {flat_a.shape} vs {flat_b.shape}"
        )
    finite = np.isfinite(flat_a)
    return float(np.max(np.abs(flat_a[finite] - flat_b[finite]))) if finite.any() else 0.0


class GroupedAdvantages(ConnectorV2):
    """Episodes -> ``compute_advantages`` -> ``{DEFAULT_MODULE_ID: {padded token tensors, advantages}}``."""

    def __init__(
        self,
        input_observation_space=None,
        input_action_space=None,
        *,
        estimator: str = "gagpo",
        gamma: float = 0.95,
        lam: float = 0.95,
        norm: str = "mean_std",
        omega: float = 1.0,
        invalid_penalty: float = 0.1,
        skip_uniform_groups: bool = False,
        constrained: bool = False,
        recompute_old_logprobs: bool = False,
        similarity_threshold: float | None = None,
        behaviour_weight_cap: float | None = None,
        **kwargs,
    ):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.estimator = estimator
        self.gamma, self.lam, self.norm, self.omega = gamma, lam, norm, omega
        self.invalid_penalty = float(invalid_penalty)
        self.skip_uniform_groups = bool(skip_uniform_groups)
        self.constrained = bool(constrained)
        self.recompute_old_logprobs = bool(recompute_old_logprobs)
        # Not None (rollouts overlapped with the update): weight each step by min(pi_prox / pi_behav, cap).
        self.behaviour_weight_cap = behaviour_weight_cap
        if behaviour_weight_cap is not None and not self.recompute_old_logprobs:
            raise ValueError(
                "behaviour_weight_cap needs recompute_old_logprobs (the proximal policy's log-probs)"
            )
        # None: exact state keys; else near-identical state texts of a group share an anchor (similarity.py).
        self.similarity_threshold = similarity_threshold

    def advantages(self, rows: StepRows) -> np.ndarray:
        return compute_advantages(
            rows.columns(),
            estimator=self.estimator,
            gamma=self.gamma,
            lam=self.lam,
            norm=self.norm,
            omega=self.omega,
        )

    def __call__(self, *, rl_module: RLModule, batch: dict, episodes: list, metrics=None, **kwargs) -> dict:
        rows = episode_rows(episodes, self.invalid_penalty)
        if self.similarity_threshold is not None:
            rows.state_key = anchor_keys(rows.group_id, rows.state_key, self.similarity_threshold)
        adv = self.advantages(rows)
        stamped = [Columns.TRAINS in e.custom_data for e in episodes]
        if not all(stamped):
            if any(stamped):
                raise ValueError(
                    f"{stamped.count(False)} of {len(episodes)} episodes lack custom_data['{Columns.TRAINS}']: stamp"
                    " the whole batch with stamp_training_groups"
                )
            stamp_training_groups(
                episodes, invalid_penalty=self.invalid_penalty, skip_uniform_groups=self.skip_uniform_groups
            )
        episode_trains = [trains(e) for e in episodes]
        keep = np.repeat(np.asarray(episode_trains, dtype=bool), [len(e) for e in episodes])
        skipped = {group_id(e) for e, t in zip(episodes, episode_trains, strict=True) if not t}
        if metrics is not None:
            self._log(metrics, rows, adv, keep, len(skipped))
        module = single_module(rl_module)
        if hasattr(module, "unwrapped"):  # the module itself, also under DDP (N learners)
            module = module.unwrapped()
        idx = np.flatnonzero(keep)
        prompts = [rows.prompt_ids[i] for i in idx]
        actions = [rows.action_ids[i] for i in idx]
        if any(len(a) == 0 for a in actions):
            raise ValueError("a step has no action tokens; the generation backend must return >= 1 token")
        masks = None
        if self.constrained:
            # The K rollouts of a group repeat steps: one mask per distinct (admissible actions, action).
            built: dict[tuple, torch.Tensor] = {}
            masks = []
            for i, act in zip(idx, actions, strict=True):
                key = (tuple(rows.admissible[i]), tuple(act))
                if key not in built:
                    built[key] = allowed_token_masks(
                        module.tokenizer, rows.admissible[i], act, module.vocab_size
                    )
                masks.append(built[key])
        old_logp = [rows.old_logp[i] for i in idx]
        # The update's one no-grad pass: the ratio's old log-probs (when recomputed) and the KL term's reference
        # log-probs, for every minibatch and epoch of this update.
        reference = bool(getattr(module, "has_reference", False))
        passed, hit_share = ({}, 0.0)
        if self.recompute_old_logprobs or reference:
            passed, hit_share = module.no_grad_logprobs(
                prompts, actions, masks, policy=self.recompute_old_logprobs, reference=reference
            )
        if self.recompute_old_logprobs:
            recomputed = passed.get(Columns.OLD_LOGP, [])
            if metrics is not None:
                metrics.log_value(
                    ("gagpo", "old_logp_rollout_max_dev"), _max_abs_dev(old_logp, recomputed), reduce="max"
                )
            behaviour, old_logp = old_logp, recomputed
        p_width = max((len(p) for p in prompts), default=0)
        a_width = max((len(a) for a in actions), default=0)
        data = {
            Columns.PROMPT_IDS: _pad(prompts, p_width, module.pad_token_id, torch.long, left=True),
            Columns.PROMPT_LEN: torch.as_tensor([len(p) for p in prompts], dtype=torch.long),
            Columns.ACTION_IDS: _pad(actions, a_width, module.pad_token_id, torch.long, left=False),
            Columns.ACTION_LEN: torch.as_tensor([len(a) for a in actions], dtype=torch.long),
            Columns.OLD_LOGP: _pad(old_logp, a_width, 0.0, torch.float32, left=False),
            Columns.ADVANTAGES: torch.as_tensor(adv[idx], dtype=torch.float32),
            Columns.INVALID: torch.as_tensor(rows.invalid[idx], dtype=torch.float32),
        }
        if self.behaviour_weight_cap is not None:
            weights, unusable = behaviour_weights(old_logp, behaviour, self.behaviour_weight_cap)
            data[Columns.BEHAVIOUR_WEIGHT] = torch.as_tensor(weights, dtype=torch.float32)
            if metrics is not None and len(weights):
                for name, value in (
                    ("behaviour_weight_mean", float(weights.mean())),
                    ("behaviour_weight_min", float(weights.min())),
                    ("behaviour_weight_max", float(weights.max())),
                    (
                        "behaviour_weight_truncated_share",
                        float(np.mean(weights >= self.behaviour_weight_cap)),
                    ),
                    ("behaviour_weight_unusable", float(unusable)),
                ):
                    metrics.log_value(("gagpo", name), value, window=1)
        if reference:
            data[Columns.REF_LOGP] = _pad(
                passed.get(Columns.REF_LOGP, []), a_width, 0.0, torch.float32, left=False
            )
            data[Columns.REFERENCE_CACHE_HIT_SHARE] = torch.full((len(idx),), float(hit_share))
        if masks is not None:
            data[Columns.ALLOWED_IDS] = self._allowed_ids(masks, a_width)
        data.update(self.extra_columns(rows, idx))
        batch[DEFAULT_MODULE_ID] = data
        return batch

    def extra_columns(self, rows: StepRows, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """Further per-step tensors for rows ``idx`` of the batch: none here (a critic adds its targets)."""
        return {}

    @staticmethod
    def _allowed_ids(masks: list[torch.Tensor], width: int) -> torch.Tensor:
        """Per action position, the token ids allowed during constrained sampling, padded with -1."""
        ids_of: dict[int, list[torch.Tensor]] = {}  # rows sharing a mask tensor share its ids
        for mask in masks:
            if id(mask) not in ids_of:
                ids_of[id(mask)] = [torch.nonzero(row).flatten() for row in mask]
        per_step = [ids_of[id(mask)] for mask in masks]
        depth = max((len(ids) for step in per_step for ids in step), default=1)
        out = torch.full((len(masks), max(width, 1), depth), -1, dtype=torch.long)
        for i, step in enumerate(per_step):
            for k, ids in enumerate(step):
                out[i, k, : len(ids)] = ids
        return out

    @staticmethod
    def _log(metrics, rows: StepRows, adv: np.ndarray, keep: np.ndarray, n_skipped: int) -> None:
        diag = grouping_diagnostics(rows.columns(), adv)
        stats = {
            **diag,
            "adv_mean": float(adv.mean()) if len(adv) else 0.0,
            "adv_std": float(adv.std()) if len(adv) else 0.0,
            "adv_min": float(adv.min()) if len(adv) else 0.0,
            "adv_max": float(adv.max()) if len(adv) else 0.0,
            "adv_zero_share": float(np.mean(np.abs(adv) < 1e-8)) if len(adv) else 0.0,
            "num_steps": float(len(adv)),
            "num_steps_trained": float(keep.sum()),
            "num_groups_in_batch": float(len(np.unique(rows.group_id))),
            "num_groups_skipped": float(n_skipped),
            "invalid_action_share_in_batch": float(rows.invalid.mean()) if len(rows.invalid) else 0.0,
        }
        # Counts add up over the learners (each sees its own whole groups); the rest is averaged.
        counts = ("num_steps", "num_steps_trained", "num_groups_in_batch", "num_groups_skipped")
        for name, value in stats.items():
            metrics.log_value(("gagpo", name), value, reduce="sum" if name in counts else "mean")
