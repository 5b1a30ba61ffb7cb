"""GAGPO on two FSDP2 learners (gloo): half the weights each, the one-learner update, no hang, exact checkpoints.

One algorithm (2 remote FSDP learners, the local EnvRunner samples) is shared by the tests of this module. The
chunks are small (``train_chunk_tokens``), so the learners' steps have different numbers of chunks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from ray.rllib.core import DEFAULT_MODULE_ID

import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.rllib.algorithm import GAGPO
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.groups import (
    GroupShardedTrainingData,
    episode_rows,
    stamp_training_groups,
    uniform_groups,
)
from gagpo_rllib.rllib.learner import GAGPOTorchLearner
from tests.gagpo_rllib.tolerances import assert_equal_sums, reduction_tolerance, token_positions
from tests.gagpo_rllib.toy_env import CorridorEnv, make_config

K, N = 3, 3  # 3 groups on 2 learners: the shards differ in size


def _on_learners(algo: GAGPO, fn) -> list:
    return [r.get() for r in algo.learner_group.foreach_learner(fn)]


def _shard_share(learner) -> dict:
    """The share of the policy's and the reference's elements this learner holds."""
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()

    def share(model) -> float:
        local = sum(p.to_local().numel() for p in model.parameters())
        return local / sum(p.numel() for p in model.parameters())

    return {
        "rank": dist.get_rank(),
        "policy": share(module.model),
        "reference": share(module.reference_model),
    }


def _full_weights(learner) -> dict[str, torch.Tensor]:
    """Learner 0's gathered full weights (empty on other learners), as torch tensors: gathered for this call
    (a collective, as before a checkpoint) and released again."""
    learner.gather_full_state()
    state = (
        learner.get_state(components="rl_module")["rl_module"][DEFAULT_MODULE_ID]
        if dist.get_rank() == 0
        else {}
    )
    out = {k: torch.as_tensor(np.asarray(v)).clone() for k, v in state.items()}
    learner.release_full_state()
    return out


@pytest.fixture(scope="module")
def algo(tiny_policy_path: Path):
    ray.cloudpickle.register_pickle_by_value(toy_env)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        make_config(tiny_policy_path, group_size=K, groups_per_iteration=N, learner_sharding="fsdp")
        .learners(num_learners=2)
        .training(minibatch_size=None, num_epochs=1, train_chunk_tokens=64)
    )
    algo = config.build_algo()
    yield algo
    algo.stop()
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.unregister_pickle_by_value(toy_env)


@pytest.fixture(scope="module")
def episodes(algo: GAGPO) -> list:
    """A batch with at least two trainable groups."""
    runner = algo.env_runner_group.local_env_runner
    for iteration in range(20):
        plan = task_plan(
            runner.num_tasks(), groups=N, group_size=K, seed=algo.config.seed, iteration=iteration
        )
        eps, _ = runner.sample_groups(plan, gen_seed=iteration)
        if N - len(uniform_groups(episode_rows(eps, algo.config.invalid_penalty))) >= 2:
            return eps
    raise AssertionError("no batch with two trainable groups in 20 iterations")


def _training_data(algo: GAGPO, episodes: list) -> GroupShardedTrainingData:
    cfg = algo.config
    stamp_training_groups(
        episodes, invalid_penalty=cfg.invalid_penalty, skip_uniform_groups=cfg.skip_uniform_groups
    )
    return GroupShardedTrainingData(episodes=episodes)


def test_each_learner_holds_half_the_weights_and_of_the_reference(algo: GAGPO) -> None:
    shares = sorted(_on_learners(algo, _shard_share), key=lambda s: s["rank"])
    for s in shares:
        assert 0.4 < s["policy"] < 0.6 and 0.4 < s["reference"] < 0.6
    assert sum(s["policy"] for s in shares) == pytest.approx(1.0)


@pytest.mark.timeout(600)
def test_an_update_equals_one_learners_and_reaches_the_env_runner(algo: GAGPO, episodes: list) -> None:
    """The one-learner update, as its gradient (exact up to summation order; the weights after Adam are not: it
    scales near-zero gradients up to lr) and the one-learner optimizer's step from that gradient."""
    cfg = algo.config
    before = _on_learners(algo, _full_weights)[0]
    local_cfg = (
        cfg.copy(copy_frozen=False)
        .learners(num_learners=0)
        .learners(learner_sharding="ddp")
        .training(learner_class=GAGPOTorchLearner, train_chunk_tokens=1 << 20)
    )
    local_cfg.validate()
    local = local_cfg.build_learner(env=CorridorEnv())
    local.module[DEFAULT_MODULE_ID].set_state({k: v.numpy() for k, v in before.items()})
    # Several chunks per step, a different number on each learner: the chunk counts are padded, nothing hangs.
    module = local.module[DEFAULT_MODULE_ID]
    module.train_chunk_tokens = cfg.train_chunk_tokens
    batches = _learner_batches(local, algo, episodes)
    chunks = [len(module.train_chunks(b)) for b in batches]
    module.train_chunk_tokens = 1 << 20  # the reference: one forward and backward per step
    assert min(chunks) >= 2 and chunks[0] != chunks[1]

    assert not any(_on_learners(algo, _optimizer_state))  # a first step, as the reference's
    local.update(episodes=episodes, num_epochs=1, minibatch_size=None)
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    grads = _on_learners(algo, _full_grads)[0]
    after = _on_learners(algo, _full_weights)[0]
    assert_equal_sums(grads, _grads(local), token_positions(*batches))
    # The learners' step is the one-learner optimizer's step from that gradient: elementwise, a few eps apart.
    (optim,) = local._named_optimizers.values()
    lr = optim.param_groups[0]["lr"]
    for k, v in _step(optim, before, grads).items():
        bound = reduction_tolerance(v.dtype, 1, safety=8.0) * (v.abs() + lr)
        assert bool(((after[k] - v).abs() <= bound).all()), k
    moved = sum(int(not torch.equal(v, before[k])) for k, v in after.items())
    assert moved > len(after) // 2
    # Still sharded after forwards and backwards (the frozen reference reshards its root after each forward).
    for share in _on_learners(algo, _shard_share):
        assert 0.4 < share["policy"] < 0.6 and 0.4 < share["reference"] < 0.6

    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    runner_weights = algo.env_runner_group.local_env_runner.module.state_dict()
    for k, v in runner_weights.items():
        assert torch.equal(v, after[k]), k


def _full_grads(learner) -> dict[str, torch.Tensor]:
    """The gradients of the last step, gathered from the shards (a collective), on learner 0."""
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    grads = {n: p.grad.full_tensor() for n, p in module.named_parameters() if p.grad is not None}
    return grads if dist.get_rank() == 0 else {}


def _grads(learner) -> dict[str, torch.Tensor]:
    module = learner.module[DEFAULT_MODULE_ID]
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _step(optim, weights: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The first step of an optimizer of ``optim``'s type and settings from ``weights`` along ``grads``."""
    params = {n: torch.nn.Parameter(weights[n].clone()) for n in grads}
    for n, p in params.items():
        p.grad = grads[n].clone()
    fresh = type(optim)(list(params.values()), **{k: optim.param_groups[0][k] for k in optim.defaults})
    fresh.step()
    return {n: p.detach() for n, p in params.items()}


def _learner_batches(local, algo: GAGPO, episodes: list) -> list[dict]:
    """The two learners' connector batches of ``episodes`` (whole groups per learner)."""
    shards = _training_data(algo, episodes).shard(2)
    return [
        algo.config.grouped_advantages()(rl_module=local.module, batch={}, episodes=data.episodes)[
            DEFAULT_MODULE_ID
        ]
        for data, _ in shards
    ]


@pytest.mark.timeout(300)
def test_a_learner_without_rows_does_not_hang(algo: GAGPO, episodes: list) -> None:
    one_group = min(e.custom_data["group_id"] for e in episodes)
    alone = [e for e in episodes if e.custom_data["group_id"] == one_group]
    before = _on_learners(algo, _full_weights)[0]
    results = algo.learner_group.update(
        training_data=_training_data(algo, alone), num_epochs=1, minibatch_size=None
    )
    assert len(results) == 2
    after = _on_learners(algo, _full_weights)[0]
    rows = episode_rows(alone, algo.config.invalid_penalty)
    if not uniform_groups(rows):  # a group with signal moves the weights
        assert any(not torch.equal(v, before[k]) for k, v in after.items())


def _optimizer_state(learner) -> list[torch.Tensor]:
    optim = next(iter(learner._named_optimizers.values()))
    return [t.to_local().clone() for s in optim.state.values() for t in s.values() if hasattr(t, "to_local")]


@pytest.mark.timeout(600)
def test_checkpoint_restores_the_sharded_weights_and_optimizer_exactly(
    algo: GAGPO, episodes: list, tmp_path: Path
) -> None:
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    saved = _on_learners(algo, lambda learner: (_full_weights(learner), _optimizer_state(learner)))
    assert saved[0][1] and saved[1][1]
    algo.save_to_path(tmp_path / "ckpt")
    algo.learner_group.update(training_data=_training_data(algo, episodes), num_epochs=1, minibatch_size=None)
    moved = _on_learners(algo, _full_weights)[0]
    assert any(not torch.equal(v, saved[0][0][k]) for k, v in moved.items())
    algo.restore_from_path(tmp_path / "ckpt")
    restored = _on_learners(algo, lambda learner: (_full_weights(learner), _optimizer_state(learner)))
    for k, v in saved[0][0].items():
        assert torch.equal(v, restored[0][0][k]), k
    for (_, before), (_, after) in zip(saved, restored, strict=True):
        assert len(before) == len(after) and all(
            torch.equal(a, b) for a, b in zip(before, after, strict=True)
        )
    runner_weights = algo.env_runner_group.local_env_runner.module.state_dict()
    assert all(torch.equal(v, saved[0][0][k]) for k, v in runner_weights.items())
