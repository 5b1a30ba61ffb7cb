"""GAGPO on two RLlib learners (DDP over gloo): whole groups per learner, the one-learner gradient, no deadlock.

One algorithm (2 remote learners, the local EnvRunner samples) is shared by the tests of this module.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages
from gagpo_rllib.rllib.algorithm import GAGPO
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.groups import (
    GroupShardedTrainingData,
    episode_rows,
    stamp_training_groups,
    uniform_groups,
)
from gagpo_rllib.rllib.learner import NONFINITE_SKIPPED, GAGPOTorchLearner
from tests.gagpo_rllib.tolerances import assert_equal_sums, token_positions
from tests.gagpo_rllib.toy_env import CorridorEnv, make_config

K, N = 3, 3  # 3 groups on 2 learners: the shards differ in size


class RecordingLearner(GAGPOTorchLearner):
    """The GAGPO learner, keeping what its connector produced and how many rows each optimizer step had."""

    def _make_batch_if_necessary(self, training_data):
        batch = super()._make_batch_if_necessary(training_data)
        if training_data.episodes is not None:
            rows = episode_rows(training_data.episodes, self.config.invalid_penalty)
            skipped = uniform_groups(rows) if self.config.skip_uniform_groups else set()
            steps = [(e.id_, t) for e in training_data.episodes for t in range(len(e))]
            kept = [s for s, g in zip(steps, rows.group_id.tolist(), strict=True) if g not in skipped]
            adv = batch.policy_batches[DEFAULT_MODULE_ID]["advantages"].tolist()
            members = defaultdict(list)
            for e in training_data.episodes:
                members[int(e.custom_data["group_id"])].append(int(e.custom_data["member"]))
            record = {"members": dict(members), "advantages": dict(zip(kept, adv, strict=True))}
            record.update(num_steps=len(steps), steps=[], chunks=[])
            self.records = [*getattr(self, "records", []), record]
        return batch

    def _uncompiled_update(self, batch, **kwargs):
        if getattr(self, "records", None):
            ((_, rows),) = batch.items()
            self.records[-1]["steps"].append(int((rows[Columns.ROW_WEIGHT] > 0).sum()))
            chunks = self.module[DEFAULT_MODULE_ID].unwrapped().train_chunks(rows)
            self.records[-1]["chunks"].append(len(chunks))
        return super()._uncompiled_update(batch, **kwargs)


def _on_learners(algo: GAGPO, fn) -> list:
    return [r.get() for r in algo.learner_group.foreach_learner(fn)]


def _last_record(learner) -> dict:
    return {**learner.records[-1], "rank": dist.get_rank()}


def _grads(learner) -> dict[str, torch.Tensor]:
    model = learner.module[DEFAULT_MODULE_ID].unwrapped().model
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _weights(learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].unwrapped().model.state_dict().items()}


def _adam_state(learner) -> list[torch.Tensor]:
    optim = next(iter(learner._named_optimizers.values()))
    return [t.clone() for s in optim.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


@pytest.fixture(scope="module")
def algo(tiny_policy_path: Path):
    # The learner processes cannot import the tests folder.
    ray.cloudpickle.register_pickle_by_value(toy_env)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        # Small chunks: every step runs several forward/backward chunks on each learner.
        make_config(
            tiny_policy_path,
            group_size=K,
            groups_per_iteration=N,
            skip_uniform_groups=True,
            train_chunk_tokens=64,
        )
        .learners(num_learners=2)
        .training(learner_class=RecordingLearner, minibatch_size=3, num_epochs=2)
    )
    algo = config.build_algo()
    yield algo
    algo.stop()
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.unregister_pickle_by_value(toy_env)


def _sample(algo: GAGPO, iteration: int) -> list:
    runner = algo.env_runner_group.local_env_runner
    cfg = algo.config
    plan = task_plan(runner.num_tasks(), groups=N, group_size=K, seed=cfg.seed, iteration=iteration)
    episodes, _ = runner.sample_groups(plan, gen_seed=iteration)
    return episodes


def _training_data(algo: GAGPO, episodes: list) -> GroupShardedTrainingData:
    cfg = algo.config
    stamp_training_groups(
        episodes, invalid_penalty=cfg.invalid_penalty, skip_uniform_groups=cfg.skip_uniform_groups
    )
    return GroupShardedTrainingData(episodes=episodes)


@pytest.fixture(scope="module")
def episodes(algo: GAGPO) -> list:
    """A batch with at least two trainable groups (some plan of the first iterations has them)."""
    for iteration in range(20):
        eps = _sample(algo, iteration)
        rows = episode_rows(eps, algo.config.invalid_penalty)
        if N - len(uniform_groups(rows)) >= 2:
            return eps
    raise AssertionError("no batch with two trainable groups in 20 iterations")


def test_learners_get_whole_groups_and_one_learner_advantages_and_gradient(
    algo: GAGPO, episodes: list, tiny_policy_path: Path
) -> None:
    cfg = algo.config
    # The one-learner reference: a local learner with the same weights, same batch, one full-batch step, one
    # forward and one backward over the whole batch.
    local_cfg = (
        cfg.copy(copy_frozen=False)
        .learners(num_learners=0)
        .training(learner_class=GAGPOTorchLearner, train_chunk_tokens=1 << 20)
    )
    local_cfg.validate()
    local = local_cfg.build_learner(env=CorridorEnv())
    local.set_state(_on_learners(algo, lambda learner: learner.get_state(components="rl_module"))[0])
    local.update(episodes=episodes, num_epochs=1, minibatch_size=None)
    expected_grads = _grads(local)

    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    records = sorted(_on_learners(algo, _last_record), key=lambda r: r["rank"])

    # Whole groups: every learner has all K members of each of its groups; together all N groups, once.
    groups = [g for r in records for g in r["members"]]
    assert sorted(groups) == sorted({e.custom_data["group_id"] for e in episodes})
    for r in records:
        assert all(sorted(m) == list(range(K)) for m in r["members"].values())
    # Different shard sizes (trainable steps), one optimizer step each.
    sizes = [len(r["advantages"]) for r in records]
    assert sizes[0] != sizes[1] and [r["steps"] for r in records] == [[sizes[0]], [sizes[1]]]
    assert max(c for r in records for c in r["chunks"]) >= 2  # the step ran chunk by chunk

    # Put together, the learners' advantages are compute_advantages on the whole batch, exactly.
    rows = episode_rows(episodes, cfg.invalid_penalty)
    adv = compute_advantages(
        rows.columns(), estimator=cfg.estimator, gamma=cfg.gamma, lam=cfg.lam, norm=cfg.norm, omega=cfg.omega
    )
    skipped = uniform_groups(rows)
    steps = [(e.id_, t) for e in episodes for t in range(len(e))]
    whole = {s: a for s, a, g in zip(steps, adv, rows.group_id.tolist(), strict=True) if g not in skipped}
    combined = {**records[0]["advantages"], **records[1]["advantages"]}
    assert combined.keys() == whole.keys()
    assert max(abs(np.float32(whole[s]) - combined[s]) for s in whole) == 0.0

    # Both learners: the one-learner gradient of the batch (up to summation order), and the same weights after
    # the step (the same reduced gradient and kernels on both: bit-identical).
    batch = cfg.grouped_advantages()(rl_module=local.module, batch={}, episodes=episodes)[DEFAULT_MODULE_ID]
    for learner_grads in _on_learners(algo, _grads):
        assert_equal_sums(learner_grads, expected_grads, token_positions(batch))
    w0, w1 = _on_learners(algo, _weights)
    for k, v in w0.items():
        assert torch.equal(v, w1[k])


@pytest.mark.timeout(600)
def test_three_iterations_with_minibatches_and_skipped_groups_finish_with_total_counts(algo: GAGPO) -> None:
    trained = 0
    for _ in range(3):
        result = algo.train()
        records = sorted(_on_learners(algo, _last_record), key=lambda r: r["rank"])
        g, lrn = result["gagpo"], result["learners"]
        if g["update_skipped"]:
            continue
        trained += 1
        # Same number of optimizer steps on both learners; each learner's rows in exactly one step per epoch.
        assert len(records[0]["steps"]) == len(records[1]["steps"])
        for r in records:
            per_epoch = len(r["steps"]) // 2
            assert sum(r["steps"][:per_epoch]) == sum(r["steps"][per_epoch:]) == len(r["advantages"])
            assert max(r["steps"]) <= 3
        # Counts are the iteration's totals, not one learner's.
        assert lrn["gagpo"]["num_groups_in_batch"] == g["groups_complete"] == N
        total_steps = sum(r["num_steps"] for r in records)
        assert (
            lrn["gagpo"]["num_steps"]
            == total_steps
            == pytest.approx(g["episode_len_mean"] * g["num_episodes"])
        )
        assert lrn["gagpo"]["num_steps_trained"] == sum(len(r["advantages"]) for r in records)
        assert lrn["default_policy"]["num_module_steps_trained"] == 2 * lrn["gagpo"]["num_steps_trained"]
        assert lrn["default_policy"][NONFINITE_SKIPPED] == 0
    assert trained >= 1


def test_nonfinite_loss_on_one_learner_skips_the_step_on_both(algo: GAGPO, episodes: list) -> None:
    cfg = algo.config
    module = algo.env_runner_group.local_env_runner.module
    whole = cfg.grouped_advantages()(rl_module=module, batch={}, episodes=episodes)[DEFAULT_MODULE_ID]
    n = len(whole["advantages"])
    # Two real batches of different sizes, the second with NaN advantages: a NaN loss on learner 1 only.
    batches = [{k: v[:cut] if i == 0 else v[cut:] for k, v in whole.items()} for i, cut in enumerate([1, 1])]
    assert n >= 2 and len(batches[0]["advantages"]) == 1
    batches[1]["advantages"] = torch.full_like(batches[1]["advantages"], float("nan"))
    before = _on_learners(algo, lambda learner: (_weights(learner), _adam_state(learner)))
    results = algo.learner_group.update(
        batches=[MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, len(b["advantages"])) for b in batches]
    )
    after = _on_learners(algo, lambda learner: (_weights(learner), _adam_state(learner)))
    for (w_before, s_before), (w_after, s_after) in zip(before, after, strict=True):
        assert all(torch.equal(v, w_after[k]) for k, v in w_before.items())
        assert len(s_before) == len(s_after) and all(
            torch.equal(a, b) for a, b in zip(s_before, s_after, strict=True)
        )
    counts = [r[DEFAULT_MODULE_ID][NONFINITE_SKIPPED].peek() for r in results]
    assert sum(counts) == 1  # one step skipped, counted once however many learners
    # The next update trains again.
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    moved = _on_learners(algo, _weights)
    assert any(not torch.equal(v, moved[0][k]) for k, v in after[0][0].items())


def _reference_cache(learner) -> tuple[list[bytes], np.ndarray]:
    state = learner.module["default_policy"].unwrapped().reference_cache.get_state()
    return state["keys"], state["values"].copy()


def _empty_reference_cache(learner) -> None:
    cache = learner.module["default_policy"].unwrapped().reference_cache
    cache.set_state(type(cache)(cache.max_rows).get_state())


def test_checkpoint_restores_both_learners(algo: GAGPO, episodes: list, tmp_path: Path) -> None:
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    saved = _on_learners(algo, lambda learner: (_weights(learner), _adam_state(learner)))
    caches = _on_learners(algo, _reference_cache)
    assert (
        all(keys for keys, _ in caches) and caches[0][0] != caches[1][0]
    )  # each learner caches its own groups
    algo.save_to_path(tmp_path / "ckpt")
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    _on_learners(algo, _empty_reference_cache)
    algo.restore_from_path(tmp_path / "ckpt")
    restored = _on_learners(algo, lambda learner: (_weights(learner), _adam_state(learner)))
    for weights, state in restored:
        assert all(torch.equal(v, weights[k]) for k, v in saved[0][0].items())
        assert all(torch.equal(a, b) for a, b in zip(saved[0][1], state, strict=True))
    # Each learner gets back its own reference log-probs (gathered from both at the save).
    for (keys, values), (want_keys, want_values) in zip(
        _on_learners(algo, _reference_cache), caches, strict=True
    ):
        assert keys == want_keys and np.array_equal(values, want_values)


def test_a_trial_the_cluster_cannot_hold_is_refused_not_left_pending(algo: GAGPO) -> None:
    # Tune adds a driver bundle: 1 + 2 learners = 3 CPUs on a 2-CPU cluster.
    with pytest.raises(ValueError, match=r"asks for 3 CPUs in 3 bundles .* the Ray cluster has 2"):
        GAGPO.default_resource_request(algo.config.to_dict())
