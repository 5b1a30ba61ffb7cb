"""Two FSDP learners end to end: ``rllib train file`` under Tune (trains, checkpoints the full model, exports it),
and the PPO baseline, whose critic is sharded like the policy."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from transformers import AutoModelForCausalLM

import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.tools.cli import main
from gagpo_rllib.tools.export import read_module_checkpoint
from tests.gagpo_rllib.toy_env import make_config
from tests.gagpo_rllib.train_files import tiny_maze_train_file


@pytest.fixture(scope="module")
def ray_session():
    # Tune's trial: one CPU for the Algorithm and one per learner.
    ray.cloudpickle.register_pickle_by_value(toy_env)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.unregister_pickle_by_value(toy_env)


@pytest.mark.timeout(900)
def test_two_fsdp_learners_train_checkpoint_and_export_the_full_model(
    ray_session, tmp_path: Path, tiny_policy_path: Path
) -> None:
    train_file = tmp_path / "fsdp.py"
    train_file.write_text(
        tiny_maze_train_file(
            tiny_policy_path,
            gagpo=', learner_sharding="fsdp", train_chunk_tokens=256',
            config_tail=".learners(num_learners=2)",
        )
    )
    storage = tmp_path / "results"
    args = ["train", "file", str(train_file), "--stop", '{"training_iteration": 2}', "--checkpoint-freq", "1"]
    assert main([*args, "--storage-path", str(storage), "--name", "fsdp"]) == 0
    checkpoint = sorted((storage / "fsdp").rglob("checkpoint_0*"))[-1]

    _, weights = read_module_checkpoint(checkpoint)
    reference = AutoModelForCausalLM.from_pretrained(tiny_policy_path).state_dict()
    assert weights.keys() >= reference.keys() - {"lm_head.weight"}
    for name, value in weights.items():
        assert value.shape == reference[name].shape, name  # full, not a shard
    assert any(not torch.equal(v, reference[k]) for k, v in weights.items())  # it trained

    out = tmp_path / "exported"
    assert main(["export", str(checkpoint), str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, value in weights.items():
        assert torch.equal(exported[name], value), name


def _critic_share(learner) -> float:
    critic = learner.module[DEFAULT_MODULE_ID].unwrapped().critic
    return sum(p.to_local().numel() for p in critic.parameters()) / sum(
        p.numel() for p in critic.parameters()
    )


@pytest.mark.timeout(900)
def test_ppo_on_two_fsdp_learners_shards_the_critic_and_trains(ray_session, tiny_policy_path: Path) -> None:
    config = (
        make_config(
            tiny_policy_path,
            estimator="ppo",
            learner_sharding="fsdp",
            groups_per_iteration=3,
            train_chunk_tokens=64,
        )
        .learners(num_learners=2)
        .training(minibatch_size=None, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):  # the critic's value forwards differ in number per learner: none may hang
            stats = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert math.isfinite(stats["value_loss"]) and math.isfinite(stats["policy_loss"])
        shares = [r.get() for r in algo.learner_group.foreach_learner(_critic_share)]
        assert all(0.4 < share < 0.6 for share in shares)
    finally:
        algo.stop()
