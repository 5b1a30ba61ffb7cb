"""The weight sync: learner 0 puts the inference-only weights (no critic, rollout dtype) into the object store
once, the remote EnvRunner takes that object, and each iteration reports the bytes and seconds of the sync."""

from __future__ import annotations

import pytest
import ray
import torch

from gagpo_rllib.rllib.weight_sync import publish_weights, state_nbytes


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _spy_on_set_state(runner) -> None:
    """Record, on the runner, the name -> dtype of every module state it is given."""
    module = runner.module
    original = module.set_state
    runner.received = []

    def record(state):
        runner.received.append({k: str(v.dtype) for k, v in state.items()})
        return original(state)

    module.set_state = record


def test_ppo_in_bf16_ships_the_policy_only_once_from_learner_0(
    ray_cluster, tiny_maze_config, monkeypatch
) -> None:
    """A remote learner, a remote runner and a remote validation runner: both runners take learner 0's object."""
    from gagpo_rllib.rllib import weight_sync
    from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation

    published_count = []
    publish = weight_sync.publish_weights

    def counting_publish(learner_group):
        published_count.append(1)
        return publish(learner_group)

    monkeypatch.setattr(weight_sync, "publish_weights", counting_publish)
    config = (
        tiny_maze_config(estimator="ppo", dtype="bfloat16")
        .learners(num_learners=1)
        .env_runners(num_env_runners=1)
    )
    config = with_validation(
        config, split="eval", interval=1, num_env_runners=1, settings=EvalSettings(num_tasks=1)
    )
    algo = config.build_algo()
    try:
        group = algo.env_runner_group
        group.foreach_env_runner(_spy_on_set_state, local_env_runner=False)
        algo.eval_env_runner_group.foreach_env_runner(_spy_on_set_state, local_env_runner=False)
        published_count.clear()

        def learner_side(learner):
            module = learner.module["default_policy"]
            state = module.state_dict()
            return (
                list(module.get_non_inference_attributes()),
                {k: v.numel() for k, v in state.items()},
                ray.get_runtime_context().get_worker_id(),
            )

        results = algo.learner_group.foreach_learner(learner_side)
        learner_only, numel, learner_worker = algo.learner_group._get_results(results)[0]
        critic = [k for k in numel if any(k.startswith(a + ".") for a in learner_only)]
        assert critic  # the learner does hold a critic, so leaving it out is a real check
        result = algo.train()
        received = group.foreach_env_runner(lambda r: r.received, local_env_runner=False)[0]
        assert len(received) == 1
        names = received[0]
        assert set(names) == set(numel) - set(critic)  # every policy tensor, no critic tensor
        assert set(names.values()) == {"torch.bfloat16"}
        policy_bytes = 2 * sum(n for k, n in numel.items() if k in names)
        gagpo = result["gagpo"]
        assert gagpo["weight_sync_bytes"] == policy_bytes
        assert gagpo["weight_sync_tensors"] == len(names) and gagpo["weight_sync_runners"] == 1.0
        assert gagpo["weight_sync_s"] > 0.0
        # The validation runner got the same weights through the same path (one more publication by learner 0).
        evaluated = algo.eval_env_runner_group.foreach_env_runner(
            lambda r: r.received, local_env_runner=False
        )
        assert evaluated[0] == [names] and result["evaluation"]["valid"]["num_episodes"] >= 1
        assert len(published_count) == 2

        # The object is learner 0's: put there, not a copy made by the driver.
        published = publish_weights(algo.learner_group)
        from ray.core.generated import common_pb2

        owner = common_pb2.Address()
        owner.ParseFromString(published.ref.owner_address())
        assert owner.worker_id.hex() == learner_worker
        assert published.nbytes == policy_bytes
    finally:
        algo.stop()


def test_state_nbytes_counts_tensors_and_arrays_in_nested_states() -> None:
    import numpy as np

    state = {"a": torch.zeros(3, 4, dtype=torch.bfloat16), "b": {"c": np.zeros(5, dtype=np.float32)}, "n": 3}
    assert state_nbytes(state) == (3 * 4 * 2 + 5 * 4, 2)
