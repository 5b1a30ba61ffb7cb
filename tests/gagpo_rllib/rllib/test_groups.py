"""Whole-group shards, the shared minibatch plan and the scale-out validation (no Ray cluster needed)."""

from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.groups import (
    GroupShardedTrainingData,
    assign_groups,
    epoch_minibatches,
    group_step_counts,
    minibatches_per_epoch,
    stamp_training_groups,
    trains,
)


def _episode(group_id: int, member: int, rewards: list[float]) -> SingleAgentEpisode:
    n = len(rewards)
    episode = SingleAgentEpisode(
        observations=["obs"] * (n + 1),
        actions=["act"] * n,
        rewards=rewards,
        infos=[{"state_key": f"{group_id}:{t}"} for t in range(n + 1)],
        extra_model_outputs={
            Columns.INVALID: [False] * n,
            Columns.PROMPT_IDS: [[1]] * n,
            Columns.ACTION_IDS: [[2]] * n,
            Columns.ACTION_LOGP: [[-1.0]] * n,
        },
        terminated=True,
        len_lookback_buffer=0,
    )
    episode.custom_data.update(group_id=group_id, member=member)
    return episode


def _batch() -> list[SingleAgentEpisode]:
    """Five groups of two: steps 9, 7, 5, 4 (uniform returns), 2."""
    lengths = {0: (5, 4), 1: (3, 4), 2: (2, 3), 3: (2, 2), 4: (1, 1)}
    episodes = []
    for gid, (a, b) in lengths.items():
        won = [0.0] * (a - 1) + [1.0]
        other = [0.0] * b if gid != 3 else [0.0] * (b - 1) + [1.0]
        episodes += [_episode(gid, 0, won), _episode(gid, 1, other)]
    return episodes


def _stamped(skip_uniform_groups: bool) -> list[SingleAgentEpisode]:
    episodes = _batch()
    stamp_training_groups(episodes, invalid_penalty=0.1, skip_uniform_groups=skip_uniform_groups)
    return episodes


def test_group_step_counts_give_uniform_groups_no_trainable_steps() -> None:
    counts = group_step_counts(_stamped(skip_uniform_groups=True))
    assert counts == {0: (9, 9), 1: (7, 7), 2: (5, 5), 3: (0, 4), 4: (2, 2)}
    assert group_step_counts(_stamped(skip_uniform_groups=False))[3] == (4, 4)


def test_the_stamp_decides_which_groups_train() -> None:
    episodes = _batch()
    decision = stamp_training_groups(episodes, invalid_penalty=0.1, skip_uniform_groups=True)
    assert decision.groups == [0, 1, 2, 3, 4] and decision.uniform == decision.skipped == {3}
    assert decision.any_trained and decision.uniform_share == pytest.approx(0.2)
    assert [trains(e) for e in episodes] == [e.custom_data["group_id"] != 3 for e in episodes]
    kept = stamp_training_groups(episodes, invalid_penalty=0.1, skip_uniform_groups=False)
    assert kept.uniform == {3} and not kept.skipped and all(trains(e) for e in episodes)
    # Only the uniform group: nothing trains under skip_uniform_groups.
    assert not stamp_training_groups(episodes[6:8], invalid_penalty=0.1, skip_uniform_groups=True).any_trained
    empty = stamp_training_groups([], invalid_penalty=0.1, skip_uniform_groups=True)
    assert not empty.any_trained and empty.uniform_share == 0.0


def test_unstamped_episodes_are_an_error_naming_the_stamp() -> None:
    with pytest.raises(KeyError, match="gagpo_trains.*stamp_training_groups"):
        group_step_counts(_batch())


def test_assign_groups_puts_largest_first_onto_the_least_loaded_shard() -> None:
    counts = {0: (9, 9), 1: (7, 7), 2: (5, 5), 3: (0, 4), 4: (2, 2)}
    shards = assign_groups(counts, 2)
    assert sorted(g for s in shards for g in s) == sorted(counts)
    assert shards == [[0, 4, 3], [1, 2]]  # 11 and 12 trainable steps
    # Every shard gets a group when there are enough, even groups without trainable steps.
    assert all(assign_groups({g: (0, 3) for g in range(3)}, 3))
    assert assign_groups(counts, 1) == [[0, 1, 2, 4, 3]]
    with pytest.raises(ValueError, match="num_shards"):
        assign_groups(counts, 0)


def test_epoch_minibatches_cover_every_row_once_in_equal_parts() -> None:
    for n, size in ((10, 3), (7, 7), (13, 4), (1, 5)):
        parts = minibatches_per_epoch(n, size)
        assert parts == -(-n // size)
        batches = epoch_minibatches(n, parts, np.random.default_rng(0))
        assert sorted(np.concatenate(batches).tolist()) == list(range(n))
        lengths = [len(b) for b in batches]
        assert max(lengths) <= size and max(lengths) - min(lengths) <= 1
    assert minibatches_per_epoch(10, None) == 1 and minibatches_per_epoch(0, 4) == 1
    # More parts than rows: the extra parts are empty (zero-weight steps on that learner).
    assert [len(b) for b in epoch_minibatches(2, 4)] == [1, 1, 0, 0]


def test_training_data_shards_whole_groups_with_one_minibatch_count() -> None:
    episodes = _stamped(skip_uniform_groups=True)
    data = GroupShardedTrainingData(episodes=episodes)
    shards = data.shard(num_shards=2, minibatch_size=4, num_epochs=3)
    assert len(shards) == 2
    groups = [sorted({e.custom_data["group_id"] for e in td.episodes}) for td, _ in shards]
    assert groups == [[0, 3, 4], [1, 2]]
    for (td, _), gids in zip(shards, groups, strict=True):
        assert len(td.episodes) == 2 * len(gids)  # both members of every group
    # Largest shard: 12 trainable steps -> ceil(12 / 4) = 3 minibatches per epoch, on every learner.
    assert [kw for _, kw in shards] == [{"num_total_minibatches": 9}] * 2
    assert [kw for _, kw in data.shard(num_shards=2, minibatch_size=None)] == [
        {"num_total_minibatches": 1}
    ] * 2


def _config(**learners) -> GAGPOConfig:
    return (
        GAGPOConfig()
        .environment(MazeEnv, env_config={"split": "train"})
        .llm(model_path="/models/any")
        .gagpo(groups_per_iteration=2)
        .learners(**learners)
    )


def test_validation_names_groups_per_iteration_when_learners_outnumber_groups() -> None:
    with pytest.raises(ValueError, match=r"groups_per_iteration must be >= num_learners \(3\)"):
        _config(num_learners=3).validate()
    _config(num_learners=2).validate()
