"""Per-episode rollouts, the group queue and rollouts overlapped with the update (``max_staleness``).

Per-episode generation with a queue of whole groups over two remote EnvRunners plays the same episodes as the
lock-step schedule with contiguous shares and ends on bit-identical weights (the HF backend: a row's answer depends
on its own seed only, and its batches are the lock-step ones). With ``max_staleness=1`` every update but the first
trains on episodes of the weights one update old; its first minibatch's ratio against the proximal policy (the
recomputed log-probs) is 1 within 1e-6, and the behaviour weights move away from 1 once the policy has changed.
"""

from __future__ import annotations

import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from gagpo_rllib.rllib.rllib_internals import local_learner


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _weights(algo) -> dict[str, torch.Tensor]:
    module = local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped()
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def _train(config, iterations: int) -> tuple[list[dict], dict[str, torch.Tensor]]:
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(iterations)]
        return results, _weights(algo)
    finally:
        algo.stop()


def _config(tiny_maze_config, **fields):
    config = tiny_maze_config(
        groups_per_iteration=4, constrained_decoding=False, temperature=1.0, envs_per_runner=2, **fields
    )
    return config.env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)


def test_per_episode_rollouts_from_a_group_queue_end_on_the_lockstep_weights(
    ray_cluster, tiny_maze_config
) -> None:
    lockstep, want = _train(_config(tiny_maze_config, rollout_schedule="lockstep"), 3)
    per_episode, got = _train(_config(tiny_maze_config, rollout_schedule="per_episode"), 3)
    for a, b in zip(lockstep, per_episode, strict=True):
        for name in ("episode_return_mean", "episode_len_mean", "generated_tokens", "num_episodes"):
            assert a["gagpo"][name] == b["gagpo"][name], name
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_staleness_one_trains_on_the_previous_weights_at_ratio_one_against_the_proximal_policy(
    ray_cluster, tiny_maze_config
) -> None:
    config = _config(tiny_maze_config, max_staleness=1)
    results, overlapped = _train(config, 4)
    staleness = [r["gagpo"]["staleness"] for r in results]
    assert staleness == [0.0, 1.0, 1.0, 1.0]
    devs = [r["learners"][DEFAULT_MODULE_ID]["first_minibatch_ratio_max_dev"] for r in results]
    assert max(devs) < 1e-6, devs
    weights = [r["learners"]["gagpo"] for r in results]
    # Iteration 0 is on-policy: pi_prox = pi_behav up to the rounding of another batch.
    assert (
        max(abs(weights[0]["behaviour_weight_min"] - 1), abs(weights[0]["behaviour_weight_max"] - 1)) < 1e-5
    )
    assert all(
        max(abs(w["behaviour_weight_min"] - 1), abs(w["behaviour_weight_max"] - 1)) > 1e-3
        for w in weights[1:]
    )
    assert all(w["behaviour_weight_max"] <= config.behaviour_weight_cap for w in weights)
    # The local runner plays the same jobs inline, in the same order: the same episodes, the same weights.
    _, inline = _train(config.copy(copy_frozen=False).env_runners(num_env_runners=0), 4)
    for name, value in overlapped.items():
        assert torch.equal(inline[name], value), name


def test_background_validation_reports_what_blocking_validation_reports(
    ray_cluster, tiny_maze_config
) -> None:
    """Validation on a remote evaluation runner beside training: the same episodes for the same weights as the
    blocking validation (its metrics land in a later iteration, under the iteration they validate), and training
    ends on the same weights."""
    from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation

    def run(background: bool) -> tuple[dict[int, dict], dict[str, torch.Tensor]]:
        config = tiny_maze_config(groups_per_iteration=2).env_runners(num_env_runners=0)
        config = with_validation(
            config,
            split="eval",
            interval=1,
            settings=EvalSettings(num_tasks=3, episodes_per_task=2),
            num_env_runners=1,
            background=background,
            num_cpus_per_env_runner=0.5,
        )
        algo = config.build_algo()
        try:
            results = [algo.train() for _ in range(4)]
            weights = _weights(algo)
            valid = [r.get("evaluation", {}).get("valid") for r in results]
            if background:  # the last one started may still play: wait for it and read what it logs
                algo.background_validation.report(algo, wait=True)
                valid.append(algo.metrics.peek(("evaluation", "valid")))
                assert not algo.validation_busy()
        finally:
            algo.stop()
        return {int(v["iteration"]): v for v in valid if v and "iteration" in v}, weights

    blocking, trained = run(background=False)
    assert sorted(blocking) == [0, 1, 2, 3]
    background, trained_beside = run(background=True)
    assert background and set(background) <= {0, 1, 2, 3}
    for iteration, valid in background.items():
        for name in ("num_episodes", "success", "episode_len_mean"):
            assert valid[name] == blocking[iteration][name], (iteration, name)
    for name, value in trained.items():
        assert torch.equal(trained_beside[name], value), name


def test_a_checkpoint_with_a_rollout_in_flight_restores_without_losing_or_repeating_a_group(
    ray_cluster, tiny_maze_config, tmp_path
) -> None:
    """The checkpoint of iteration 1 is taken while iteration 2 plays; the restored run plans iteration 2 again
    from its seed (with the restored weights: staleness 0) and goes on from there."""
    from gagpo_rllib.rllib.algorithm import GAGPO

    config = _config(tiny_maze_config, max_staleness=1)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        assert algo.rollout_pipeline().in_flight() == [2]
        path = algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    restored = GAGPO.from_checkpoint(path)
    try:
        assert restored.iteration == 2
        first = restored.train()["gagpo"]
        assert (
            first["staleness"] == 0.0
            and first["num_episodes"] == config.groups_per_iteration * config.group_size
        )
        assert first["groups_complete"] == config.groups_per_iteration and first["groups_replayed"] == 0
        assert restored.rollout_pipeline().in_flight() == [3]
        assert restored.train()["gagpo"]["staleness"] == 1.0
    finally:
        restored.stop()
