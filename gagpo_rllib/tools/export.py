"""Export a checkpoint's policy as a Hugging Face model folder that transformers and vLLM load.

The folder holds config.json, the weights as safetensors, the tokenizer (with its chat template) and a
generation_config.json carrying the run's decoding settings (temperature, end and pad tokens, no top-k/top-p
truncation, as the policy was trained). The architecture and tokenizer come from the model the run started from
(``model_path`` in the checkpoint, or ``base_model`` when that folder has moved); the weights are the checkpoint's.

A LoRA run's checkpoint holds only the adapters: they are put on the base model and merged into its weights, so the
folder is a plain model; ``adapter_dir`` also writes the adapters in peft's own format (``PeftModel.from_pretrained``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from gagpo_rllib.policy.lora import apply_lora, merged_state
from gagpo_rllib.policy.models import DTYPES, load_policy
from gagpo_rllib.rllib.checkpoints import load_pickle, module_dir

__all__ = ["export_checkpoint", "read_module_checkpoint"]

# The LLMRLModule keeps the causal LM as its ``model`` attribute: its parameters are named "model.<hf name>".
_PREFIX = "model."


def read_module_checkpoint(checkpoint: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(model_config, Hugging Face state dict) of the policy stored in ``checkpoint``."""
    folder = module_dir(checkpoint)
    ctor = load_pickle(folder / "class_and_ctor_args.pkl")
    model_config = dict(ctor["ctor_args_and_kwargs"][1].get("model_config") or {})
    state = load_pickle(folder / "module_state.pkl")
    weights = {
        name[len(_PREFIX) :]: torch.as_tensor(value)
        for name, value in state.items()
        if name.startswith(_PREFIX)
    }
    if not weights:
        raise ValueError(
            f"{folder}/module_state.pkl holds no '{_PREFIX}*' weights: not an LLMRLModule policy"
        )
    return model_config, weights


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    base_model: str | None = None,
    dtype: str | None = None,
    adapter_dir: str | os.PathLike | None = None,
) -> Path:
    """Write the checkpoint's policy to ``out_dir`` as a Hugging Face model folder; returns ``out_dir``.

    ``dtype`` ("float32", "bfloat16", "float16") defaults to the dtype the run trained in. ``adapter_dir`` (LoRA
    runs only): also write the adapters there in peft's format.
    """
    model_config, weights = read_module_checkpoint(checkpoint)
    base = base_model or model_config.get("model_path")
    if not base:
        raise ValueError(f"{checkpoint}: the checkpoint names no model_path; pass base_model")
    dtype_name = dtype or model_config.get("dtype", "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype_name!r}")
    try:
        model, tokenizer = load_policy(base, dtype=torch.float32)
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(
            f"cannot load the base model {base!r} of this checkpoint ({err}); pass base_model=<folder>"
        ) from err
    lora = model_config.get("lora")
    if adapter_dir is not None and not lora:
        raise ValueError(f"{checkpoint}: adapter_dir is for LoRA runs; this run trained every weight")
    if lora:
        weights = _merge_adapters(model, weights, lora, base, adapter_dir)
    result = model.load_state_dict(weights, strict=False)
    # Tied output embeddings may be stored once; anything else missing or unexpected means a different model.
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = sorted(set(result.missing_keys) - tied)
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the checkpoint's weights do not fit the base model {base!r}: missing {missing[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}"
        )
    model.to(DTYPES[dtype_name])
    model.config.dtype = dtype_name
    model.generation_config = generation_config(model_config, tokenizer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "gagpo_export.json").write_text(
        json.dumps({"checkpoint": str(Path(checkpoint).resolve()), "base_model": str(base)}, indent=1)
    )
    return out


def _merge_adapters(
    model: torch.nn.Module,
    adapters: dict[str, torch.Tensor],
    lora: dict[str, Any],
    base: str,
    adapter_dir: str | os.PathLike | None,
) -> dict[str, torch.Tensor]:
    """The merged policy (Hugging Face names) of ``model`` with the checkpoint's adapters on it."""
    peft_model = apply_lora(
        model,
        rank=lora["rank"],
        alpha=lora["alpha"],
        dropout=lora["dropout"],
        target_modules=lora["target_modules"],
    )
    own = {name for name in model.state_dict() if ".lora_" in name}
    missing, unexpected = sorted(own - set(adapters)), sorted(set(adapters) - own)
    if missing or unexpected:
        raise ValueError(
            f"the checkpoint's adapters do not fit the base model {base!r} with its LoRA settings {lora}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.load_state_dict(adapters, strict=False)
    if adapter_dir is not None:
        peft_model.save_pretrained(str(adapter_dir))
    weights = merged_state(model)
    # Back to a plain model: the merged weights are loaded into it by the caller.
    peft_model.unload()
    return weights


def generation_config(model_config: dict[str, Any], tokenizer: Any) -> GenerationConfig:
    """The run's evaluation sampling as a GenerationConfig (plain sampling: no top-k or top-p cut)."""
    sampling = dict(model_config.get("eval_sampling") or model_config.get("sampling") or {})
    return GenerationConfig(
        do_sample=True,
        temperature=float(sampling.get("temperature", 1.0)),
        top_k=0,
        top_p=1.0,
        max_new_tokens=int(sampling.get("max_new_tokens", 256)),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
