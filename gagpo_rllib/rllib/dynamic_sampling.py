"""Dynamic sampling (DAPO's "filter groups"): replace groups that carry no signal by freshly drawn ones.

A group whose K rollouts all got the same (shaped) return has zero advantage at every step under every grouped
estimator: it costs an update's compute and teaches nothing, and a task every rollout fails the same way is never
learned. With ``GAGPOConfig.dynamic_sampling`` an iteration first plays its usual plan (N groups x K); the uniform
groups are then set aside and new task instances are drawn and played, round after round, until the batch holds N
informative groups or ``dynamic_sampling_max_extra_groups`` extra groups have been played. Each round draws as many
new groups as informative ones are still missing (never more than the bound has left). The batch keeps the first N
informative groups in sampling order, whole groups only; when the bound runs out first it holds fewer (the
iteration reports the shortfall) and an iteration without any informative group skips its update.

Every extra round is a pure function of (seed, iteration, round) (``gagpo_rllib.rllib.plans.extra_plan``): its
tasks come from their own seeded stream, its group ids (``EXTRA_GROUP_ID_BASE`` + iteration x bound + j) never collide
with a plan's, and its groups are played by ``sample_whole_groups`` with the same fault tolerance as the first
plan's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.env_runner import PlannedEpisode
from gagpo_rllib.rllib.group_sampling import GroupSample

__all__ = ["DynamicSample", "fill_informative_groups", "merge_samples"]


def merge_samples(first: GroupSample, other: GroupSample) -> GroupSample:
    """Two rounds' whole groups as one sample (episodes in sampling order, counts added)."""
    return GroupSample(
        episodes=first.episodes + other.episodes,
        stats=first.stats + other.stats,
        runner_metrics=first.runner_metrics + other.runner_metrics,
        groups_planned=first.groups_planned + other.groups_planned,
        groups_complete=first.groups_complete + other.groups_complete,
        groups_replayed=first.groups_replayed + other.groups_replayed,
        groups_dropped=first.groups_dropped + other.groups_dropped,
        env_errors=first.env_errors + other.env_errors,
        runner_failures=first.runner_failures + other.runner_failures,
        attempts=first.attempts + other.attempts,
    )


@dataclass
class DynamicSample:
    """Everything an iteration sampled (``sample``) and the batch it trains on (``batch``: whole groups)."""

    sample: GroupSample  # every round's whole groups: the rollout metrics are over these
    batch: list  # the episodes of the informative groups kept, whole groups in sampling order
    groups_sampled: int  # whole groups that came back, over all rounds
    uniform_groups: int  # of those, groups whose rollouts all got the same return
    extra_groups: int  # groups planned beyond the first plan
    extra_episodes: int  # episodes planned beyond the first plan
    rounds: int  # extra rounds played
    informative_groups: int  # groups in the batch
    target_groups: int  # N

    def metrics(self) -> dict[str, float]:
        """The ``gagpo/`` values of dynamic sampling for this iteration."""
        return {
            "dynamic_extra_groups": float(self.extra_groups),
            "dynamic_extra_episodes": float(self.extra_episodes),
            "dynamic_rounds": float(self.rounds),
            "dynamic_informative_groups": float(self.informative_groups),
            "dynamic_shortfall_groups": float(max(0, self.target_groups - self.informative_groups)),
            "uniform_group_share": self.uniform_groups / self.groups_sampled if self.groups_sampled else 0.0,
        }


def _group_order(episodes: list) -> list[int]:
    seen: dict[int, None] = {}
    for ep in episodes:
        seen.setdefault(int(ep.custom_data[Columns.GROUP_ID]), None)
    return list(seen)


def fill_informative_groups(
    first: GroupSample,
    *,
    target_groups: int,
    max_extra_groups: int,
    group_size: int,
    uniform_of: Callable[[list], set[int]],
    plan_round: Callable[[int, int, int], list[PlannedEpisode]],
    play: Callable[[list[PlannedEpisode]], GroupSample],
) -> DynamicSample:
    """Play extra rounds after ``first`` until ``target_groups`` informative groups or the bound.

    ``uniform_of(episodes)``: the ids of the uniform groups among whole groups' episodes;
    ``plan_round(round_index, groups, first_group_id)``: the extra round's plan; ``play(plan)``: its whole groups.
    """
    sample = first
    order = _group_order(first.episodes)
    uniform = set(uniform_of(first.episodes)) if first.episodes else set()
    informative = [g for g in order if g not in uniform]
    extra = rounds = 0
    while len(informative) < target_groups and extra < max_extra_groups:
        rounds += 1
        n = min(target_groups - len(informative), max_extra_groups - extra)
        plan = plan_round(rounds, n, extra)
        extra += n
        got = play(plan)
        sample = merge_samples(sample, got)
        new_order = _group_order(got.episodes)
        new_uniform = set(uniform_of(got.episodes)) if got.episodes else set()
        order += new_order
        uniform |= new_uniform
        informative += [g for g in new_order if g not in new_uniform]
    keep = set(informative[:target_groups])
    batch = [ep for ep in sample.episodes if int(ep.custom_data[Columns.GROUP_ID]) in keep]
    return DynamicSample(
        sample=sample,
        batch=batch,
        groups_sampled=len(order),
        uniform_groups=len(uniform),
        extra_groups=extra,
        extra_episodes=extra * group_size,
        rounds=rounds,
        informative_groups=len(keep),
        target_groups=target_groups,
    )
