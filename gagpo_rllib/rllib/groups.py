"""Group decisions, made on the driver once per iteration: which groups carry signal, which train, which learner
trains them, and which extra groups dynamic sampling plays.

Every decision reads the episodes' **step rows** (``episode_rows``): one row per environment step with its group,
episode, shaped reward (the env reward minus ``invalid_penalty`` on invalid steps: the penalty shapes the learning
signal only, reported returns use the env's own rewards), state key, tokens and behaviour log-probs. Each episode's
rows are extracted once per process and reused by every later reader (the driver's decisions, and the learner
connector when the learner runs in the driver's process).

- **Uniform groups** (``uniform_groups``): a group whose K episodes all got the same shaped return has zero
  advantage at every step under every grouped estimator.
- **Which groups train** (``stamp_training_groups``): every group, or with ``skip_uniform_groups`` all but the
  uniform ones (an adaptive optimiser would still take full-size steps on what remains of their gradient). The
  decision is stamped on every episode (``custom_data[Columns.TRAINS]``); the sharding below and the learner
  connector (``GroupedAdvantages``) read the stamp.
- **Which learner trains them** (``GroupShardedTrainingData``): RLlib's own episode split cuts episodes and ignores
  groups, but a group's advantages need all K of its episodes on one learner. Whole groups are binned largest
  first onto the least-loaded learner, the load being the number of *trainable* steps. Under DDP every optimizer
  step all-reduces the gradients, so every learner takes the same number of steps whatever its shard size: each
  shard gets ``num_total_minibatches`` = ``num_epochs`` x ``ceil(largest shard / minibatch_size)`` and splits its own
  rows into that many equal parts per epoch (``epoch_minibatches``; a part with no rows is a zero-weight step that
  still joins the all-reduce). Parts cover the batch exactly once per epoch, sizes differing by at most one.
- **Dynamic sampling** (DAPO's "filter groups", ``fill_informative_groups``): with
  ``GAGPOConfig.dynamic_sampling`` the uniform groups of the first plan are set aside and new task instances are
  drawn and played, round after round, until the batch holds N informative groups or
  ``dynamic_sampling_max_extra_groups`` extra groups have been played; the batch keeps the first N informative
  groups in sampling order, whole groups only (fewer when the bound runs out: the iteration reports the shortfall).
  Every extra round is a pure function of (seed, iteration, round) (``group_sampling.extra_plan``).
- **Reward signal** (``reward_signal_shares``): the shares of groups whose advantages carry no reward signal, by
  kind, for the rollout metrics.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.rllib.core.learner.training_data import TrainingData

from envs import protocol
from envs.protocol import outcome
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import REQUIRED_COLUMNS

if TYPE_CHECKING:  # group_sampling and env_runner import the sharding below through rllib_internals
    from gagpo_rllib.rllib.env_runner import PlannedEpisode
    from gagpo_rllib.rllib.group_sampling import GroupSample

__all__ = [
    "DynamicSample",
    "GroupShardedTrainingData",
    "StepRows",
    "TrainingGroups",
    "assign_groups",
    "epoch_minibatches",
    "episode_rows",
    "fill_informative_groups",
    "group_id",
    "group_step_counts",
    "merge_samples",
    "minibatches_per_epoch",
    "reward_signal_shares",
    "stamp_training_groups",
    "trains",
    "uniform_groups",
]


@dataclass
class StepRows:
    """Per-step columns of a list of episodes, rows of one episode contiguous and in step order."""

    group_id: np.ndarray
    episode_id: list[str]
    reward: np.ndarray  # shaped: env reward - penalty * invalid
    state_key: list[str]
    invalid: np.ndarray
    prompt_ids: list[list[int]]
    action_ids: list[list[int]]
    old_logp: list[list[float]]
    admissible: list[list[str]]

    def columns(self, keep: np.ndarray | None = None) -> dict[str, Any]:
        sel = np.arange(len(self.reward)) if keep is None else np.flatnonzero(keep)
        # The advantage table's columns, in the order gagpo_rllib.method.advantages names them.
        values = (
            self.group_id[sel],
            [self.episode_id[i] for i in sel],
            self.reward[sel],
            [self.state_key[i] for i in sel],
        )
        return dict(zip(REQUIRED_COLUMNS, values, strict=True))


def _custom(episode, key: str, hint: str) -> Any:
    try:
        return episode.custom_data[key]
    except KeyError:
        raise KeyError(f"episode {episode.id_} has no custom_data['{key}']: {hint}") from None


def group_id(episode) -> int:
    """The episode's group (``custom_data[Columns.GROUP_ID]``, set from the driver's plan)."""
    return int(_custom(episode, Columns.GROUP_ID, "sample with GAGPOEnvRunner.sample_groups"))


# Step rows of the episodes this process read last (a bounded LRU): each episode is flattened once per process.
_ROWS_CACHE_EPISODES = 4096
_rows_cache: OrderedDict[tuple, StepRows] = OrderedDict()
_rows_lock = threading.Lock()


def _rows_of(episode, invalid_penalty: float) -> StepRows:
    """One complete episode's step rows (cached by episode id, length, group and penalty)."""
    if not episode.is_done:
        raise ValueError(f"episode {episode.id_} is not complete: grouped advantages need whole episodes")
    gid = group_id(episode)
    key = (str(episode.id_), len(episode), gid, float(invalid_penalty))
    with _rows_lock:
        if key in _rows_cache:
            _rows_cache.move_to_end(key)
            return _rows_cache[key]
    steps = len(episode)
    invalid = np.asarray(list(episode.get_extra_model_outputs(Columns.INVALID)), dtype=bool)
    rewards = np.asarray(list(episode.get_rewards()), dtype=np.float64)
    infos = list(episode.get_infos())[:steps]
    if Columns.STATE_KEY in episode.extra_model_outputs:
        # Keys the EnvRunner computed with the configured state_key choice; else the env's own key.
        state_keys = list(episode.get_extra_model_outputs(Columns.STATE_KEY))
    else:
        for t, info in enumerate(infos):
            protocol.check_info(info, (protocol.STATE_KEY,), where=f" at step {t} of episode {episode.id_}")
        state_keys = [str(info[protocol.STATE_KEY]) for info in infos]
    rows = StepRows(
        group_id=np.full(steps, gid, dtype=np.int64),
        episode_id=[str(episode.id_)] * steps,
        reward=rewards - invalid_penalty * invalid,
        state_key=state_keys,
        invalid=invalid,
        prompt_ids=[list(v) for v in episode.get_extra_model_outputs(Columns.PROMPT_IDS)],
        action_ids=[list(v) for v in episode.get_extra_model_outputs(Columns.ACTION_IDS)],
        old_logp=[list(v) for v in episode.get_extra_model_outputs(Columns.ACTION_LOGP)],
        admissible=[[str(a) for a in info.get(protocol.ADMISSIBLE_ACTIONS, ())] for info in infos],
    )
    with _rows_lock:
        _rows_cache[key] = rows
        while len(_rows_cache) > _ROWS_CACHE_EPISODES:
            _rows_cache.popitem(last=False)
    return rows


def episode_rows(episodes: Sequence, invalid_penalty: float) -> StepRows:
    """Complete episodes as step rows, one episode's rows contiguous and in step order (see the module docstring
    for the reward column); fresh lists, so a caller may replace a column (e.g. similarity anchors)."""
    parts = [_rows_of(episode, invalid_penalty) for episode in episodes]
    return StepRows(
        group_id=np.concatenate([r.group_id for r in parts]) if parts else np.zeros(0, dtype=np.int64),
        episode_id=[e for r in parts for e in r.episode_id],
        reward=np.concatenate([r.reward for r in parts]) if parts else np.zeros(0, dtype=np.float64),
        state_key=[k for r in parts for k in r.state_key],
        invalid=np.concatenate([r.invalid for r in parts]) if parts else np.zeros(0, dtype=bool),
        prompt_ids=[x for r in parts for x in r.prompt_ids],
        action_ids=[x for r in parts for x in r.action_ids],
        old_logp=[x for r in parts for x in r.old_logp],
        admissible=[x for r in parts for x in r.admissible],
    )


def uniform_groups(rows: StepRows) -> set[int]:
    """Group ids whose episodes all got the same shaped return (within 1e-9)."""
    returns: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for gid, eid, r in zip(rows.group_id.tolist(), rows.episode_id, rows.reward.tolist(), strict=True):
        returns[gid][eid] += r
    return {g for g, per_ep in returns.items() if np.ptp(list(per_ep.values())) <= 1e-9}


@dataclass
class TrainingGroups:
    """Which groups of a batch train: the decision ``stamp_training_groups`` stamped on the episodes."""

    groups: list[int]  # every group id of the batch, in batch order
    uniform: set[int]  # groups whose episodes all got the same shaped return
    skipped: set[int]  # groups that do not train: the uniform ones under skip_uniform_groups, else none

    @property
    def any_trained(self) -> bool:
        """Whether the update has any row to train on."""
        return len(self.skipped) < len(self.groups)

    @property
    def uniform_share(self) -> float:
        """Share of the batch's groups that are uniform (0.0 without groups)."""
        return len(self.uniform) / len(self.groups) if self.groups else 0.0


def stamp_training_groups(
    episodes: Sequence, *, invalid_penalty: float, skip_uniform_groups: bool
) -> TrainingGroups:
    """Decide which groups of ``episodes`` train and stamp it on every episode (``custom_data[Columns.TRAINS]``).

    The one place of the rule (called once per iteration by ``GAGPO.training_step``): a group trains unless
    ``skip_uniform_groups`` and its episodes all got the same shaped return (``uniform_groups`` over
    ``episode_rows`` with ``invalid_penalty``). ``sharding`` and ``GroupedAdvantages`` read the stamp.
    """
    uniform = uniform_groups(episode_rows(episodes, invalid_penalty)) if episodes else set()
    skipped = set(uniform) if skip_uniform_groups else set()
    for episode in episodes:
        episode.custom_data[Columns.TRAINS] = group_id(episode) not in skipped
    return TrainingGroups(
        groups=list(dict.fromkeys(group_id(e) for e in episodes)), uniform=uniform, skipped=skipped
    )


def trains(episode) -> bool:
    """The stamp of ``stamp_training_groups``: whether the episode's group trains in this update."""
    hint = "stamp the batch with stamp_training_groups (GAGPO.training_step does)"
    return bool(_custom(episode, Columns.TRAINS, hint))


def reward_signal_shares(episodes: list) -> dict[str, float]:
    """Shares of groups whose advantages carry no reward signal, by kind (0.0 each with no episode).

    A group whose episodes got no env reward at all has V(s) = 0 everywhere: its advantages come only from the
    invalid-action penalties (``groups_penalty_only_share``: group normalisation then turns the timing of equal
    penalties into advantages of order 1) or are all zero (``groups_zero_advantage_share``).
    ``groups_all_invalid_share``: groups with no success and every step invalid. ``groups_no_reward_signal_share``
    is the first two together; 1.0 means the whole update learns nothing from the task.
    """
    by_group: dict[Any, dict[str, bool]] = {}
    for ep in episodes:
        g = by_group.setdefault(
            group_id(ep),
            {"rewarded": False, "any_invalid": False, "all_invalid": True},
        )
        rewards = [float(r) for r in ep.get_rewards()]
        invalid = [bool(x) for x in ep.get_extra_model_outputs(Columns.INVALID)] if len(ep) else []
        won = outcome(ep.get_infos(-1)).won
        g["rewarded"] |= won or any(r != 0.0 for r in rewards)
        g["any_invalid"] |= any(invalid)
        g["all_invalid"] &= bool(invalid) and all(invalid) and not won
    n = len(by_group)
    if n == 0:
        return {
            "groups_penalty_only_share": 0.0,
            "groups_zero_advantage_share": 0.0,
            "groups_all_invalid_share": 0.0,
            "groups_no_reward_signal_share": 0.0,
        }
    penalty_only = sum(not g["rewarded"] and g["any_invalid"] for g in by_group.values()) / n
    zero = sum(not g["rewarded"] and not g["any_invalid"] for g in by_group.values()) / n
    return {
        "groups_penalty_only_share": penalty_only,
        "groups_zero_advantage_share": zero,
        "groups_all_invalid_share": sum(g["all_invalid"] for g in by_group.values()) / n,
        "groups_no_reward_signal_share": penalty_only + zero,
    }


def group_step_counts(episodes: Sequence) -> dict[int, tuple[int, int]]:
    """group id -> (trainable steps, all steps), in ascending group id; a group stamped not to train
    (``stamp_training_groups``) has 0 trainable steps."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for episode in episodes:
        count = counts[group_id(episode)]
        count[0] += len(episode) if trains(episode) else 0
        count[1] += len(episode)
    return {g: (counts[g][0], counts[g][1]) for g in sorted(counts)}


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

    The episodes carry the driver's decision of which groups train (``stamp_training_groups``), which the
    learner connector reads too: the trainable step counts used for balancing are the rows the learners train on.
    """

    def shard(self, num_shards: int, len_lookback_buffer: int | None = None, **kwargs: Any):
        if self.episodes is None:
            return super().shard(num_shards, len_lookback_buffer=len_lookback_buffer, **kwargs)
        counts = group_step_counts(self.episodes)
        by_group: dict[int, list] = defaultdict(list)
        for episode in self.episodes:
            by_group[group_id(episode)].append(episode)
        shards = assign_groups(counts, num_shards)
        largest = max(sum(counts[g][0] for g in shard) for shard in shards)
        per_epoch = minibatches_per_epoch(largest, kwargs.get("minibatch_size"))
        total = per_epoch * int(kwargs.get("num_epochs", 1) or 1)
        return [
            (TrainingData(episodes=[e for g in shard for e in by_group[g]]), {"num_total_minibatches": total})
            for shard in shards
        ]


def merge_samples(first: GroupSample, other: GroupSample) -> GroupSample:
    """Two rounds' whole groups as one sample (episodes in sampling order, counts added)."""
    return type(first)(
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
        seen.setdefault(group_id(ep), None)
    return list(seen)


def fill_informative_groups(
    first: GroupSample,
    *,
    target_groups: int,
    max_extra_groups: int,
    group_size: int,
    plan_round: Callable[[int, int, int], list[PlannedEpisode]],
    play: Callable[[list[PlannedEpisode]], GroupSample],
    invalid_penalty: float = 0.0,
    uniform_of: Callable[[list], set[int]] | None = None,
) -> DynamicSample:
    """Play extra rounds after ``first`` until ``target_groups`` informative groups or the bound.

    ``plan_round(round_index, groups, first_group_id)``: the extra round's plan; ``play(plan)``: its whole groups.
    A group is uniform by ``uniform_groups`` over the shaped rewards (``invalid_penalty``), or by
    ``uniform_of(episodes)`` when given (the ids of the uniform groups among whole groups' episodes).
    """
    if uniform_of is None:

        def uniform_of(episodes: list) -> set[int]:
            return uniform_groups(episode_rows(episodes, invalid_penalty))

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
    batch = [ep for ep in sample.episodes if group_id(ep) in keep]
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
