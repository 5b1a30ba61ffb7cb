"""GAGPO with ``backend="vllm"`` on the real engine (vLLM's CPU build) in a remote EnvRunner, end to end.

Three iterations: each starts its update at ratio 1 (within the 1e-6 the README states for CPU fp32), and after
each update the runner's engine samples with the learner's weights: its log-probs are the learner model's on the
same tokens, on prompts it had cached before the update. Then a checkpoint is restored into a new algorithm,
whose new engine must sample with the restored (trained) weights and keep training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from gagpo_rllib.policy.generation import SamplingConfig
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.models import load_policy
from gagpo_rllib.rllib.algorithm import GAGPO

pytestmark = pytest.mark.vllm_engine

RATIO_TOLERANCE = 1e-6  # README: "ratio 1 within 1e-6" on CPU in float32
CFG = SamplingConfig(max_new_tokens=10)


@pytest.fixture(scope="module")
def ray_cluster(real_vllm):
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _prompts(tok) -> list[str]:
    """A short prompt and one longer than the CPU engine's 128-token cache block."""
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"You are in the hall {i}. " * n}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i, n in enumerate((1, 40))
    ]


def _engine_answers(
    algo: GAGPO, prompts: list[str], seed: int
) -> list[tuple[list[int], list[int], list[float]]]:
    """What the remote runner's engine samples (with behaviour log-probs) for ``prompts``."""

    def sample(runner) -> list[tuple[list[int], list[int], list[float]]]:
        backend = runner.module.started_backend
        assert backend is not None and type(backend).__name__ == "VLLMGenerationBackend"
        outs = backend.generate(prompts, sampling=CFG, seed=seed)
        return [(o.prompt_ids, o.action_ids, o.logprobs) for o in outs]

    answers = algo.env_runner_group.foreach_env_runner(sample, local_env_runner=False)
    assert len(answers) == 1
    return answers[0]


def _distance(model, tok, answers) -> float:
    """Max |engine log-prob - model log-prob| over the answers' tokens."""
    logp, mask, _ = action_logprobs(
        model,
        [a[0] for a in answers],
        [a[1] for a in answers],
        pad_token_id=tok.pad_token_id,
        temperature=1.0,
    )
    return max(
        abs(logp[b, k].item() - lp) for b, a in enumerate(answers) for k, lp in enumerate(a[2]) if mask[b, k]
    )


def _learner_model(algo: GAGPO):
    return algo.learner_group._learner.module["default_policy"].model


def test_three_iterations_and_a_restore_keep_the_engine_on_the_learners_weights(
    ray_cluster, tiny_maze_config, tiny_policy_path: Path, tmp_path: Path
) -> None:
    config = tiny_maze_config(backend="vllm", max_prompt_tokens=600).env_runners(num_env_runners=1)
    initial, tok = load_policy(tiny_policy_path)
    prompts = _prompts(tok)
    assert len(tok(prompts[1])["input_ids"]) >= 128
    algo = config.build_algo()
    try:
        assert algo.env_runner_group.local_env_runner.module.started_backend is None  # the idle driver runner
        assert _distance(initial, tok, _engine_answers(algo, prompts, 0)) < 1e-4
        for it in range(3):
            result = algo.train()
            dev = result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"]
            assert dev < RATIO_TOLERANCE, (it, dev)
            answers = _engine_answers(algo, prompts, it)
            assert _distance(_learner_model(algo), tok, answers) < 1e-4, it
            assert _distance(initial, tok, answers) > 1e-3, it  # the weights did move
        trained = {k: v.clone() for k, v in _learner_model(algo).state_dict().items()}
        algo.save_to_path(tmp_path / "ckpt")
    finally:
        algo.stop()

    restored = GAGPO.from_checkpoint(tmp_path / "ckpt")
    try:
        model = _learner_model(restored)
        assert all((model.state_dict()[k] == v).all() for k, v in trained.items())
        answers = _engine_answers(restored, prompts, 5)
        assert _distance(model, tok, answers) < 1e-4  # the new engine got the restored weights
        assert _distance(initial, tok, answers) > 1e-3
        result = restored.train()
        assert result["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] < RATIO_TOLERANCE
        assert _distance(_learner_model(restored), tok, _engine_answers(restored, prompts, 6)) < 1e-4
    finally:
        restored.stop()
