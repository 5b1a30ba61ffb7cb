"""A LoRA run with ``backend="vllm"`` on the real engine (vLLM's CPU build) in a remote EnvRunner.

Both syncs: "adapter" (the engine keeps its base and loads vLLM's own LoRA adapter in place) and "merged" (the
merged policy under the usual names). After each update the engine's log-probs are the learner's adapted policy's
on the same tokens (prompts cached before the update included), each update starts at ratio 1, and a restored
checkpoint's new engine samples with the restored adapters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from gagpo_rllib.policy.models import load_policy
from gagpo_rllib.rllib.algorithm import GAGPO
from tests.gagpo_rllib.rllib.test_vllm_engine_rllib import (
    RATIO_TOLERANCE,
    _distance,
    _engine_answers,
    _learner_model,
    _prompts,
)

pytestmark = pytest.mark.vllm_engine


@pytest.fixture(scope="module")
def ray_cluster(real_vllm):
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _engine_syncs(algo: GAGPO) -> tuple[int, int]:
    """(full weight syncs, adapter syncs) the remote runner's engine received."""

    def counts(runner) -> tuple[int, int]:
        backend = runner.module.started_backend
        return backend.weight_syncs, backend.adapter_syncs

    return algo.env_runner_group.foreach_env_runner(counts, local_env_runner=False)[0]


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_lora_engine_follows_the_learners_adapted_policy(
    ray_cluster, tiny_maze_config, tiny_policy_path: Path, tmp_path: Path, sync: str
) -> None:
    config = tiny_maze_config(backend="vllm", max_prompt_tokens=600, lora_rank=8, lora_sync=sync).env_runners(
        num_env_runners=1
    )
    config.training(lr=5e-2)  # adapters start at B = 0: a large step makes the move measurable in 2 updates
    initial, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok)
    algo = config.build_algo()
    try:
        for it in range(2):
            result = algo.train()
            dev = result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"]
            assert dev < RATIO_TOLERANCE, (it, dev)
            answers = _engine_answers(algo, prompts, it)
            assert _distance(_learner_model(algo), tok, answers) < 1e-4, it
        assert _distance(initial, tok, answers) > 1e-3  # the adapters did move the policy
        weight_syncs, adapter_syncs = _engine_syncs(algo)
        assert (adapter_syncs > 0, weight_syncs > 0) == (
            (True, False) if sync == "adapter" else (False, True)
        )
        algo.save_to_path(tmp_path / "ckpt")
    finally:
        algo.stop()

    restored = GAGPO.from_checkpoint(tmp_path / "ckpt")
    try:
        answers = _engine_answers(restored, prompts, 5)
        assert _distance(_learner_model(restored), tok, answers) < 1e-4  # the new engine got the adapters
        assert _distance(initial, tok, answers) > 1e-3
    finally:
        restored.stop()
