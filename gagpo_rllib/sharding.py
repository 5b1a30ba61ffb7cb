"""Scale-out over N RLlib learners: whole groups per learner, one shared minibatch plan, resource checks.

RLlib's own episode split (``ShardEpisodesIterator``) cuts episodes and ignores groups, but a group's advantages
need all K of its episodes on one learner. ``GroupShardedTrainingData.shard`` bins whole groups, largest first
onto the least-loaded learner, where the load is the number of *trainable* steps (after ``skip_uniform_groups``).

Under DDP every optimizer step all-reduces the gradients, so every learner must take the same number of steps
whatever its shard size: each shard gets the same ``num_total_minibatches`` = ``num_epochs`` x ``ceil(largest
shard / minibatch_size)``, and the learner splits its own rows into that many equal parts per epoch
(``epoch_minibatches``). A part with no rows becomes a zero-weight step that still joins the all-reduce.

Minibatches cover the batch exactly once per epoch, for any ``minibatch_size``: ``ceil(n / minibatch_size)``
parts whose sizes differ by at most one, none larger than ``minibatch_size`` (RLlib's ``int(n / size)`` would
leave the remainder untrained).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from ray.rllib.core.learner.training_data import TrainingData

from gagpo_rllib.connectors.grouped_advantages import episode_rows, uniform_groups

__all__ = [
    "GroupShardedTrainingData",
    "assign_groups",
    "epoch_minibatches",
    "group_step_counts",
    "minibatches_per_epoch",
    "placement_shortfall",
    "resource_shortfall",
]


def group_step_counts(
    episodes: Sequence, *, invalid_penalty: float, skip_uniform_groups: bool
) -> dict[int, tuple[int, int]]:
    """group id -> (trainable steps, all steps); a uniform group has 0 trainable steps when skipped."""
    rows = episode_rows(episodes, invalid_penalty)
    skipped = uniform_groups(rows) if skip_uniform_groups else set()
    gids, counts = np.unique(rows.group_id, return_counts=True)
    return {int(g): (0 if int(g) in skipped else int(c), int(c)) for g, c in zip(gids, counts, strict=True)}


def assign_groups(counts: dict[int, tuple[int, int]], num_shards: int) -> list[list[int]]:
    """Group ids per shard: largest (trainable, all) first onto the shard with the least (trainable, all, groups).

    Deterministic (ties by group id, then shard index); with at least ``num_shards`` groups every shard gets one.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    heap = [(0, 0, 0, i) for i in range(num_shards)]
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for gid in sorted(counts, key=lambda g: (-counts[g][0], -counts[g][1], g)):
        trainable, steps, groups, i = heapq.heappop(heap)
        shards[i].append(gid)
        heapq.heappush(heap, (trainable + counts[gid][0], steps + counts[gid][1], groups + 1, i))
    return shards


def minibatches_per_epoch(largest_shard_rows: int, minibatch_size: int | None) -> int:
    """Optimizer steps per epoch shared by all learners: no learner's minibatch exceeds ``minibatch_size``."""
    if not minibatch_size:
        return 1
    return max(1, math.ceil(largest_shard_rows / int(minibatch_size)))


def epoch_minibatches(
    num_rows: int, num_parts: int, rng: np.random.Generator | None = None
) -> list[np.ndarray]:
    """Row indices of ``num_parts`` minibatches covering ``range(num_rows)`` once (shuffled when ``rng`` given).

    Sizes differ by at most one; parts are empty only when ``num_rows < num_parts``.
    """
    order = rng.permutation(num_rows) if rng is not None else np.arange(num_rows)
    return np.array_split(order, num_parts)


@dataclasses.dataclass
class GroupShardedTrainingData(TrainingData):
    """Episodes for ``LearnerGroup.update(training_data=...)`` that shard by whole groups (see the module doc).

    ``invalid_penalty`` and ``skip_uniform_groups`` must be the learner connector's, so that the trainable step
    counts used for balancing are the rows the learners will train on.
    """

    invalid_penalty: float = 0.0
    skip_uniform_groups: bool = False

    def shard(self, num_shards: int, len_lookback_buffer: int | None = None, **kwargs: Any):
        if self.episodes is None:
            return super().shard(num_shards, len_lookback_buffer=len_lookback_buffer, **kwargs)
        counts = group_step_counts(
            self.episodes, invalid_penalty=self.invalid_penalty, skip_uniform_groups=self.skip_uniform_groups
        )
        by_group: dict[int, list] = defaultdict(list)
        for episode in self.episodes:
            by_group[int(episode.custom_data["group_id"])].append(episode)
        shards = assign_groups(counts, num_shards)
        largest = max(sum(counts[g][0] for g in shard) for shard in shards)
        per_epoch = minibatches_per_epoch(largest, kwargs.get("minibatch_size"))
        total = per_epoch * int(kwargs.get("num_epochs", 1) or 1)
        return [
            (TrainingData(episodes=[e for g in shard for e in by_group[g]]), {"num_total_minibatches": total})
            for shard in shards
        ]


def resource_shortfall(config: Any) -> str | None:
    """Why the learners and EnvRunners asked for cannot be placed, or None.

    Compared with the Ray cluster's totals when Ray runs, else with this machine (what ``ray.init()`` would
    find); skipped when ``RAY_ADDRESS`` points at a cluster not joined yet. Actors that cannot be placed would
    otherwise wait forever.
    """
    import ray

    if ray.is_initialized():
        total = ray.cluster_resources()
        have_cpu, have_gpu, where = float(total.get("CPU", 0)), float(total.get("GPU", 0)), "the Ray cluster"
    elif os.environ.get("RAY_ADDRESS"):
        return None
    else:
        import torch

        have_cpu = float(os.cpu_count() or 1)
        have_gpu = float(torch.cuda.device_count() if torch.cuda.is_available() else 0)
        where = "this machine"
    n_learners, n_runners = int(config.num_learners), int(config.num_env_runners)
    gpu_per_learner = float(config.num_gpus_per_learner or 0)
    cpu_per_learner = config.num_cpus_per_learner
    if cpu_per_learner == "auto":
        cpu_per_learner = 1 if gpu_per_learner == 0 else 0
    want_gpu = n_learners * gpu_per_learner + n_runners * float(config.num_gpus_per_env_runner or 0)
    want_cpu = n_learners * float(cpu_per_learner) + n_runners * float(config.num_cpus_per_env_runner or 0)
    if want_gpu > have_gpu + 1e-9:
        return (
            f"num_learners={n_learners} x num_gpus_per_learner={gpu_per_learner:g} + num_env_runners={n_runners}"
            f" x num_gpus_per_env_runner={config.num_gpus_per_env_runner:g} asks for {want_gpu:g} GPUs;"
            f" {where} has {have_gpu:g}"
        )
    if want_cpu > have_cpu + 1e-9:
        return (
            f"num_learners={n_learners} x num_cpus_per_learner={cpu_per_learner:g} + num_env_runners={n_runners}"
            f" x num_cpus_per_env_runner={config.num_cpus_per_env_runner:g} asks for {want_cpu:g} CPUs;"
            f" {where} has {have_cpu:g}"
        )
    return None


def placement_shortfall(bundles: Sequence[dict[str, float]]) -> str | None:
    """Why a trial's placement bundles exceed the running Ray cluster, or None (also when Ray is not running).

    Tune would otherwise keep the trial pending forever; its request includes a bundle for the driver.
    """
    import ray

    if not ray.is_initialized():
        return None
    total = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        want = sum(float(b.get(resource, 0)) for b in bundles)
        have = float(total.get(resource, 0))
        if want > have + 1e-9:
            return (
                f"the trial asks for {want:g} {resource}s in {len(bundles)} bundles (driver, learners, EnvRunners);"
                f" the Ray cluster has {have:g}"
            )
    return None
