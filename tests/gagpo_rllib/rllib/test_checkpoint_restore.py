"""Restoring a checkpoint taken at iteration k continues exactly as the uninterrupted run (one remote runner).

Compared after the next iteration: the iteration counter, the learner's weights and optimizer state, the weights
on the EnvRunner, and the task plan of the iteration after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle
import torch

import tests.gagpo_rllib.toy_env as toy_env
from gagpo_rllib.rllib.algorithm import GAGPO
from tests.gagpo_rllib.toy_env import make_config


@pytest.fixture(scope="module")
def ray_session():
    ray.cloudpickle.register_pickle_by_value(toy_env)  # the EnvRunner processes cannot import tests/
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(toy_env)


def tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors and numbers of a nested state dict, by path."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(tensors(value, f"{prefix}/{key}"))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            out.update(tensors(value, f"{prefix}/{i}"))
    elif isinstance(tree, (torch.Tensor, int, float)) and not isinstance(tree, bool):
        out[prefix] = torch.as_tensor(tree)
    return out


def snapshot(algo: GAGPO) -> dict[str, Any]:
    learner = algo.learner_group._learner
    (runner,) = algo.env_runner_group.foreach_env_runner(
        lambda r: {k: v.clone() for k, v in r.module.model.state_dict().items()}, local_env_runner=False
    )
    return {
        "iteration": algo.iteration,
        "weights": {k: v.clone() for k, v in learner.module["default_policy"].model.state_dict().items()},
        "optimizer": tensors(learner.get_state(components="optimizer")),
        "runner": runner,
        "next_plan": algo.iteration_plan(algo.iteration),
    }


def test_restored_run_matches_the_uninterrupted_one(
    ray_session, tiny_policy_path: Path, tmp_path: Path
) -> None:
    config = make_config(tiny_policy_path, num_env_runners=1, group_size=2, groups_per_iteration=2)
    algo = config.build_algo()
    algo.train()
    algo.save_to_path(tmp_path / "ckpt")  # k = 1
    algo.train()
    uninterrupted = snapshot(algo)
    algo.stop()

    restored = GAGPO.from_checkpoint(tmp_path / "ckpt")
    try:
        assert restored.iteration == 1
        restored.train()
        again = snapshot(restored)
    finally:
        restored.stop()

    assert again["iteration"] == uninterrupted["iteration"] == 2
    assert again["next_plan"] == uninterrupted["next_plan"]
    assert uninterrupted["optimizer"] and again["optimizer"].keys() == uninterrupted["optimizer"].keys()
    # Bit for bit: the restored learner has the reference log-probs the uninterrupted one had cached.
    for key, value in uninterrupted["optimizer"].items():
        assert torch.equal(again["optimizer"][key], value), f"optimizer state {key}"
    for key, value in uninterrupted["weights"].items():
        assert torch.equal(again["weights"][key], value), f"learner weight {key}"
        assert torch.equal(again["runner"][key], value), f"runner weight {key}"


def test_a_checkpoint_holds_the_rollout_weights_as_safetensors(
    ray_session, tiny_policy_path: Path, tmp_path: Path, monkeypatch
) -> None:
    """Beside the float32 master state: the policy in the rollout dtype, Hugging Face names, bit for bit what the
    runners load; sharded with an index when it spans several buckets."""
    import json

    from safetensors.torch import load_file

    from gagpo_rllib.rllib import weight_sync

    config = make_config(
        tiny_policy_path, num_env_runners=0, group_size=2, groups_per_iteration=2, dtype="bfloat16"
    )
    algo = config.build_algo()
    try:
        algo.train()
        weights = algo.learner_group._learner.module["default_policy"].model.state_dict()
        algo.save_to_path(tmp_path / "one")
        monkeypatch.setattr(weight_sync, "BUCKET_BYTES", 64 << 10)
        algo.save_to_path(tmp_path / "sharded")
    finally:
        algo.stop()
    (single,) = (tmp_path / "one" / "rollout_weights").glob("*.safetensors")
    one = load_file(single)
    index = json.loads(
        (tmp_path / "sharded" / "rollout_weights" / "model.safetensors.index.json").read_text()
    )
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2
    sharded: dict[str, torch.Tensor] = {}
    for file in files:
        sharded |= load_file(tmp_path / "sharded" / "rollout_weights" / file)
    assert set(one) == set(sharded) == set(index["weight_map"]) == set(weights)
    for name, value in weights.items():
        assert one[name].dtype == torch.bfloat16 and torch.equal(one[name], value.to(torch.bfloat16)), name
        assert torch.equal(sharded[name], one[name]), name
