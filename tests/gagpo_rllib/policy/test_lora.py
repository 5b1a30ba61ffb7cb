"""LoRA on the learner: the base is the reference, only adapters train, runners get the merged policy, checkpoints
hold the adapters and restore exactly, export writes the merged model, bad settings are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from envs.spaces import TextSpace
from gagpo_rllib import GAGPO, GAGPOConfig
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.logprobs import action_logprobs, cache_keyword
from gagpo_rllib.policy.lora import merged_state
from gagpo_rllib.policy.models import load_policy
from gagpo_rllib.policy.rl_module import LLMRLModule
from gagpo_rllib.rllib.config import configure
from gagpo_rllib.tools.export import export_checkpoint
from tests.gagpo_rllib.policy.test_rl_module import ADM, _prompts, _train_batch

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear"}
RATIO_TOLERANCE = 1e-6  # README: "ratio 1 within 1e-6" on CPU in float32


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _module(path: Path, *, inference_only: bool, lora: dict | None = LORA, **model_config) -> LLMRLModule:
    return LLMRLModule(
        observation_space=TextSpace(),
        action_space=TextSpace(),
        inference_only=inference_only,
        model_config={
            "model_path": str(path),
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "constrained": True},
            "lora": lora,
            **model_config,
        },
    )


def _move_adapters(module: LLMRLModule, seed: int = 0) -> None:
    """Non-zero adapters (peft starts B at 0, where the adapted policy is the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.model.named_parameters():
            if "lora_" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def _base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}


def _learner_module(algo: GAGPO) -> LLMRLModule:
    return algo.learner_group._learner.module["default_policy"].unwrapped()


# ------------------------------------------------------------------------------------------- the module
def test_reference_is_the_base_with_adapters_disabled_and_equals_a_frozen_copy(
    tiny_policy_path: Path,
) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True)
    learner_side = _module(tiny_policy_path, inference_only=False)
    assert learner_side.lora and learner_side.reference_model is None and learner_side.has_reference
    _move_adapters(learner_side)
    prompts = _prompts(runner_side)
    out = runner_side.forward_exploration(
        {Columns.PROMPTS: prompts, Columns.ADMISSIBLE: ADM, Columns.GEN_SEED: 3}
    )
    batch = _train_batch(out, learner_side, True)
    fwd = learner_side.forward_train(batch)
    frozen, _ = load_policy(tiny_policy_path)
    ids, acts = [list(p) for p in out["prompt_ids"]], [list(a) for a in out[Columns.ACTION_IDS]]
    masks = None
    from gagpo_rllib.policy.rl_module import unpad_token_batch

    _, _, masks = unpad_token_batch(batch, learner_side.vocab_size)
    with torch.no_grad():
        ref, mask, _ = action_logprobs(
            frozen, ids, acts, pad_token_id=learner_side.pad_token_id, allowed_masks=masks
        )
        adapted, _, _ = action_logprobs(
            learner_side.model, ids, acts, pad_token_id=learner_side.pad_token_id, allowed_masks=masks
        )
    width = fwd["ref_logp"].shape[1]
    torch.testing.assert_close(
        fwd["ref_logp"] * mask[:, :width], ref[:, :width] * mask[:, :width], atol=1e-6, rtol=0
    )
    # The current log-probs are the adapted policy's, and the adapters did move it away from the reference.
    torch.testing.assert_close(fwd["logp"].detach() * mask, adapted * mask, atol=1e-5, rtol=0)
    assert float(((fwd["logp"].detach() - fwd["ref_logp"]).abs() * mask).max()) > 1e-3
    # No second copy: the module's parameters are the base plus the adapters, nothing else.
    n_base = sum(p.numel() for p in frozen.parameters())
    n_lora = sum(p.numel() for n, p in learner_side.named_parameters() if ".lora_" in n)
    assert sum(p.numel() for p in learner_side.parameters()) == n_base + n_lora


def test_runner_state_is_the_merged_policy_and_checkpoint_state_the_adapters(tiny_policy_path: Path) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True)
    learner_side = _module(tiny_policy_path, inference_only=False)
    _move_adapters(learner_side)
    synced = learner_side.get_state(inference_only=True)
    assert set(synced) == {f"model.{k}" for k in runner_side.model.state_dict()}  # plain HF names
    runner_side.set_state(synced)
    prompts = _prompts(runner_side)
    out = runner_side.forward_exploration(
        {Columns.PROMPTS: prompts, Columns.ADMISSIBLE: ADM, Columns.GEN_SEED: 4}
    )
    fwd = learner_side.forward_train(_train_batch(out, learner_side, True))
    for i, lp in enumerate(out[Columns.ACTION_LOGP]):
        torch.testing.assert_close(fwd["logp"][i, : len(lp)].detach(), torch.tensor(lp), atol=1e-5, rtol=0)
    saved = learner_side.get_state()
    assert saved and all(".lora_" in k for k in saved)
    fresh = _module(tiny_policy_path, inference_only=False)
    fresh.set_state(saved)
    for k, v in learner_side.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[k], v), k
    with pytest.raises(ValueError, match="lacks .* trained parameters"):
        fresh.set_state({k: v for k, v in list(saved.items())[1:]})


def test_learner_forwards_run_the_hf_model_with_its_cache_keyword_and_checkpointing(
    tiny_policy_path: Path,
) -> None:
    """The learner calls the Hugging Face model (adapters inside its linear layers), never PeftModel.forward, so the
    shared-prompt KV cache uses the model's own cache argument; with gradient checkpointing the adapters get
    gradients and the log-probs are the same."""
    plain, _ = load_policy(tiny_policy_path)
    module = _module(tiny_policy_path, inference_only=False)
    assert type(module.model) is type(plain) and type(module.peft_model).__name__ == "PeftModel"
    assert cache_keyword(module.model) == cache_keyword(plain)
    _move_adapters(module)
    runner_side = _module(tiny_policy_path, inference_only=True)
    out = runner_side.forward_exploration(
        {Columns.PROMPTS: _prompts(runner_side), Columns.ADMISSIBLE: ADM, Columns.GEN_SEED: 7}
    )
    batch = _train_batch(out, module, True)
    shared = module.forward_train(batch)["logp"]
    checkpointed = _module(tiny_policy_path, inference_only=False, gradient_checkpointing=True)
    checkpointed.model.load_state_dict(module.model.state_dict())
    fwd = checkpointed.forward_train(batch)
    torch.testing.assert_close(fwd["logp"].detach(), shared.detach(), atol=1e-5, rtol=0)
    (fwd["logp"] * fwd["mask"]).sum().backward()
    grads = {n: p.grad for n, p in checkpointed.model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and bool(g.abs().sum() > 0) for n, g in grads.items() if "lora_A" in n)
    assert all(p.grad is None for n, p in checkpointed.model.named_parameters() if ".lora_" not in n)


def test_a_bfloat16_lora_learner_keeps_a_bf16_base_and_fp32_adapters(tiny_policy_path: Path) -> None:
    module = _module(tiny_policy_path, inference_only=False, dtype="bfloat16")
    for name, p in module.model.named_parameters():
        assert p.dtype == (torch.float32 if ".lora_" in name else torch.bfloat16), name
        assert p.requires_grad == (".lora_" in name), name
    assert all(v.dtype == torch.bfloat16 for v in module.get_state(inference_only=True).values())


# ----------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lora_rank": -1}, "lora_rank must be an int >= 0"),
        ({"lora_rank": 2.5}, "lora_rank must be an int >= 0"),
        ({"lora_alpha": 16.0}, "lora_rank must be an int >= 1 when lora_alpha is set"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha must be None"),
        ({"lora_rank": 4, "lora_dropout": 1.0}, r"lora_dropout must be a number in \[0, 1\)"),
        (
            {"lora_rank": 4, "lora_target_modules": []},
            "lora_target_modules must be 'all-linear' or a non-empty",
        ),
        (
            {"lora_rank": 4, "lora_target_modules": ["q_proj", "attn"]},
            r"lora_target_modules must be names of the model's linear modules \['down_proj', 'gate_proj', "
            r"'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\] \(\['attn'\] are not\)",
        ),
        ({"lora_rank": 4, "learner_sharding": "fsdp"}, "learner_sharding must be 'ddp' with lora_rank 4"),
        ({"lora_rank": 4, "lora_sync": "delta"}, "lora_sync must be one of"),
        (
            {"lora_rank": 4, "backend": "vllm", "lora_target_modules": ["q_proj", "lm_head"]},
            "lora_sync must be 'merged' when lora_target_modules include lm_head",
        ),
        ({"lora_rank": 1024, "backend": "vllm"}, "lora_rank must be <= 512 with lora_sync 'adapter'"),
    ],
)
def test_bad_lora_settings_are_refused_by_name(tiny_policy_path: Path, fields: dict, message: str) -> None:
    config = configure(GAGPOConfig(), model_path=str(tiny_policy_path), **fields)
    with pytest.raises(ValueError, match=message):
        config.validate_gagpo()


def test_unknown_target_modules_are_refused_when_the_module_loads_the_model(tiny_policy_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"lora_target_modules: \['qkv'\] .* linear modules are \['down_proj'"
    ):
        _module(tiny_policy_path, inference_only=False, lora={**LORA, "target_modules": ["qkv"]})


def test_lora_settings_reach_the_module(tiny_policy_path: Path) -> None:
    config = GAGPOConfig().llm(model_path=str(tiny_policy_path), lora_rank=8, lora_target_modules=["q_proj"])
    config.validate_gagpo()
    assert config.module_model_config()["lora"] == {
        "rank": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": ["q_proj"],
        "sync": "merged",  # the HF backend always gets the merged policy
    }
    assert config.env_runners(backend="vllm").module_model_config()["lora"]["sync"] == "adapter"
    assert config.llm(lora_sync="merged").module_model_config()["lora"]["sync"] == "merged"
    assert GAGPOConfig().module_model_config()["lora"] is None


# ------------------------------------------------------------------------------------------ training runs
def test_lora_run_trains_only_adapters_starts_each_update_on_policy_and_restores_exactly(
    ray_cluster, tiny_maze_config, tmp_path: Path
) -> None:
    config = tiny_maze_config(lora_rank=4, lora_alpha=8.0)
    algo = config.build_algo()
    try:
        module = _learner_module(algo)
        base = _base_weights(module.model)
        adapters = {k: v.clone() for k, v in module.model.state_dict().items() if ".lora_" in k}
        optimized = list(algo.learner_group._learner._params.values())
        assert optimized and all(p.requires_grad for p in optimized)
        assert sum(p.numel() for p in optimized) == sum(v.numel() for v in adapters.values())
        devs = [algo.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"]]
        algo.save_to_path(tmp_path / "ckpt")
        devs.append(algo.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"])
        after = module.model.state_dict()
        assert all(torch.equal(base[k], after[k]) for k in base)  # the base is bit-identical
        assert any(not torch.equal(adapters[k], after[k]) for k in adapters)  # the adapters trained
        # The runner samples with the merged policy: its weights are the learner's merged ones.
        runner = algo.env_runner.module.model.state_dict()
        for k, v in merged_state(module.model).items():
            torch.testing.assert_close(runner[k], v, atol=0, rtol=0)
        uninterrupted = {k: v.clone() for k, v in after.items()}
        optimizer = algo.learner_group._learner.get_state(components="optimizer")
    finally:
        algo.stop()
    assert max(devs) < RATIO_TOLERANCE, devs

    # The checkpoint holds the adapters (and their optimizer state), not the base.
    from gagpo_rllib.tools.export import read_module_checkpoint

    _, stored = read_module_checkpoint(tmp_path / "ckpt")
    assert stored and all(".lora_" in k for k in stored)
    assert len(optimizer["optimizer"]["default_policy_default_optimizer"]["state"]["state"]) == len(stored)

    restored = GAGPO.from_checkpoint(tmp_path / "ckpt")
    try:
        assert restored.iteration == 1
        dev = restored.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"]
        again = _learner_module(restored).model.state_dict()
    finally:
        restored.stop()
    assert dev < RATIO_TOLERANCE
    for k, v in uninterrupted.items():
        assert torch.equal(again[k], v), k

    # Export: a plain model folder whose logits are the merged policy's, and the adapters in peft's format.
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "export", adapter_dir=tmp_path / "adapter")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any(".lora_" in k for k in exported.state_dict())
    checkpoint_module = _module(
        config.model_path, inference_only=False, lora=config.module_model_config()["lora"]
    )
    checkpoint_module.set_state({f"model.{k}": v for k, v in stored.items()})
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        expected = checkpoint_module.model(input_ids=ids).logits
        torch.testing.assert_close(exported(input_ids=ids).logits, expected, atol=1e-5, rtol=0)
        from peft import PeftModel

        base_model, _ = load_policy(config.model_path)
        with_adapter = PeftModel.from_pretrained(base_model, str(tmp_path / "adapter"))
        torch.testing.assert_close(with_adapter(input_ids=ids).logits, expected, atol=1e-5, rtol=0)
        assert (expected - load_policy(config.model_path)[0](input_ids=ids).logits).abs().max() > 1e-4
    # The command: the same, through rllib export --adapter-dir.
    from gagpo_rllib.tools.cli import main

    assert (
        main(["export", str(tmp_path / "ckpt"), str(tmp_path / "cli"), "--adapter-dir", str(tmp_path / "a2")])
        == 0
    )
    assert (tmp_path / "cli" / "model.safetensors").is_file()
    assert (tmp_path / "a2" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("share_trunk", [False, True])
def test_ppo_with_lora_trains_adapters_and_the_value_head_only(
    ray_cluster, tiny_maze_config, share_trunk: bool
) -> None:
    """The critic is LoRA'd like the policy: a copy of the LoRA'd trunk training its own adapters (its base frozen
    and out of the checkpoint), or, with a shared trunk, the value head on the policy's adapted trunk."""
    algo = tiny_maze_config(estimator="ppo", lora_rank=4, critic_share_trunk=share_trunk).build_algo()
    try:
        module = _learner_module(algo)
        frozen = {
            k: v.clone() for k, v in module.state_dict().items() if ".lora_" not in k and "head" not in k
        }
        head = "value_head." if share_trunk else "critic.head."
        assert any(k.startswith("critic.trunk.") for k in frozen) != share_trunk
        algo.train()
        after = module.state_dict()
        assert all(
            torch.equal(frozen[k], after[k]) for k in frozen
        )  # every base weight, the critic's included
        saved = module.get_state()
        assert any(k.startswith(head) for k in saved)
        assert all(".lora_" in k or k.startswith(head) for k in saved)
        assert any(k.startswith("critic.trunk.") and ".lora_" in k for k in saved) != share_trunk
    finally:
        algo.stop()


def test_two_ddp_learners_train_the_same_adapters_on_a_frozen_base(ray_cluster, tiny_maze_config) -> None:
    def weights(learner) -> dict[str, torch.Tensor]:
        model = learner.module["default_policy"].unwrapped().model
        return {k: v.clone() for k, v in model.state_dict().items()}

    algo = tiny_maze_config(lora_rank=4).learners(num_learners=2).build_algo()
    try:
        before = [r.get() for r in algo.learner_group.foreach_learner(weights)][0]
        algo.train()
        w0, w1 = [r.get() for r in algo.learner_group.foreach_learner(weights)]
    finally:
        algo.stop()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # DDP kept the learners in step
    assert all(torch.equal(before[k], w0[k]) for k in before if ".lora_" not in k)
    assert any(not torch.equal(before[k], w0[k]) for k in before if ".lora_" in k)
