"""Every update starts on-policy: the first-minibatch ratio is 1 within 1e-6 in every iteration (CPU, fp32).

The HF backend's behaviour log-probs are used as they are (no recompute); the vLLM backend (on the stand-in in
tests/fakes/vllm) has the learner recompute them. Iterations after the first check that the weight sync reached
the rollout model before sampling.
"""

from __future__ import annotations

import contextlib

import pytest
import ray

from tests.fakes.vllm_path import fake_vllm_on_path


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    ("backend", "temperature", "constrained"),
    [
        ("hf", 1.0, True),
        ("hf", 0.6, True),
        pytest.param("hf", 0.6, False),  # free answers: 8 tokens a step
        pytest.param("vllm", 0.6, False),  # 1.0 runs in test_vllm_backend_rllib.py
    ],
)
def test_every_iteration_starts_at_ratio_one(
    ray_cluster, tiny_maze_config, backend: str, temperature: float, constrained: bool
) -> None:
    extra = {"backend_kwargs": {"device": "cpu"}, "max_prompt_tokens": 600} if backend == "vllm" else {}
    with fake_vllm_on_path() if backend == "vllm" else contextlib.nullcontext():
        config = tiny_maze_config(
            backend=backend, temperature=temperature, constrained_decoding=constrained, **extra
        )
        assert config.uses_recomputed_old_logprobs == (backend == "vllm")
        algo = config.build_algo()
        try:
            devs = [
                algo.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] for _ in range(3)
            ]
        finally:
            algo.stop()
    assert max(devs) < 1e-6, devs
