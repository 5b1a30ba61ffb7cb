"""Export of a checkpoint's policy to a Hugging Face folder: transformers loads it with the module's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch
from ray.rllib.core.rl_module.rl_module import RLModule
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from gagpo_rllib.policy.models import load_policy
from gagpo_rllib.rllib.checkpoints import MODULE_PATH
from gagpo_rllib.tools.cli import main
from gagpo_rllib.tools.export import export_checkpoint, read_module_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tiny_maze_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GAGPO checkpoint after one training iteration on the maze (weights moved away from the base)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = tiny_maze_config(eval_temperature=0.3)
    algo = config.build_algo()
    algo.train()
    path = Path(algo.save_to_path(str(tmp_path_factory.mktemp("ckpt") / "checkpoint_000000")))
    algo.stop()
    yield path
    ray.shutdown()


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_exported_folder_loads_with_the_checkpoint_logits(
    checkpoint: Path, tiny_policy_path: Path, tmp_path: Path
) -> None:
    out = export_checkpoint(checkpoint, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in names)

    exported = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    module = RLModule.from_checkpoint(checkpoint / MODULE_PATH)  # RLlib's own loader of the policy
    base, base_tokenizer = load_policy(tiny_policy_path)
    ids = tokenizer("You are in the kitchen. go north", return_tensors="pt").input_ids
    assert (
        ids.tolist()
        == base_tokenizer("You are in the kitchen. go north", return_tensors="pt").input_ids.tolist()
    )
    torch.testing.assert_close(logits(exported, ids), logits(module.model, ids), atol=1e-5, rtol=1e-5)
    assert (logits(exported, ids) - logits(base, ids)).abs().max() > 1e-4  # trained weights, not the base

    generation = GenerationConfig.from_pretrained(out)
    assert generation.do_sample and generation.temperature == pytest.approx(0.3) and generation.top_k == 0
    assert generation.eos_token_id == tokenizer.eos_token_id
    assert json.loads((out / "gagpo_export.json").read_text())["base_model"] == str(tiny_policy_path)


def test_dtype_override_and_errors(checkpoint: Path, tiny_policy_path: Path, tmp_path: Path) -> None:
    out = export_checkpoint(checkpoint / MODULE_PATH, tmp_path / "bf16", dtype="bfloat16")
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    model_config, weights = read_module_checkpoint(checkpoint)
    assert model_config["model_path"] == str(tiny_policy_path) and "lm_head.weight" in weights
    with pytest.raises(FileNotFoundError, match="not an RLlib Algorithm checkpoint"):
        export_checkpoint(tiny_policy_path, tmp_path / "x")
    with pytest.raises(ValueError, match="dtype"):
        export_checkpoint(checkpoint, tmp_path / "y", dtype="int8")
    with pytest.raises(ValueError, match="base model"):
        export_checkpoint(checkpoint, tmp_path / "z", base_model=str(tmp_path / "moved"))
    with pytest.raises(ValueError, match="adapter_dir is for LoRA runs"):
        export_checkpoint(checkpoint, tmp_path / "w", adapter_dir=tmp_path / "adapter")
    assert not (tmp_path / "w").exists()


def test_export_command(checkpoint: Path, tmp_path: Path, capsys) -> None:
    assert main(["export", str(checkpoint), str(tmp_path / "cli")]) == 0
    text = capsys.readouterr().out
    assert f"exported to {tmp_path / 'cli'}" in text and "model.safetensors" in text
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "cli").config.model_type == "qwen2"
