"""Every update starts on-policy: the first-minibatch ratio is 1 within 1e-6 in every iteration (CPU, fp32).

The HF backend's behaviour log-probs are used as they are (no recompute). Iterations after the first check that
the weight sync reached the rollout model before sampling. The vLLM backend (the learner recomputes) is checked the
same way on a remote EnvRunner in test_vllm_backend_rllib.py.
"""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    ("backend", "temperature", "constrained"),
    [
        ("hf", 1.0, True),
        ("hf", 0.6, True),
        pytest.param("hf", 0.6, False),  # free answers: 8 tokens a step
    ],
)
def test_every_iteration_starts_at_ratio_one(
    ray_cluster, tiny_maze_config, backend: str, temperature: float, constrained: bool
) -> None:
    config = tiny_maze_config(backend=backend, temperature=temperature, constrained_decoding=constrained)
    assert not config.uses_recomputed_old_logprobs
    algo = config.build_algo()
    try:
        devs = [algo.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] for _ in range(3)]
    finally:
        algo.stop()
    assert max(devs) < 1e-6, devs
