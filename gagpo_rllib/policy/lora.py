"""LoRA adapters on the learner's policy (peft): the base stays frozen and doubles as the reference policy.

``apply_lora`` injects peft's LoRA layers into the Hugging Face model in place and returns the ``PeftModel`` that
wraps it; the module keeps calling the Hugging Face model itself (whose linear layers now add their adapters), so
the learner's forwards (shared-prompt KV cache, last-layer MLP shortcut) take the same code path as without LoRA
and never go through ``PeftModel.forward``. Names then carry peft's infixes (``q_proj.base_layer.weight``,
``q_proj.lora_A.default.weight``); ``merged_state`` turns the current policy back into plain Hugging Face names
with W + scale * B @ A, which is what the rollout backends (HF or vLLM) load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "check_lora",
    "lora_module_settings",
    "model_linear_names",
    "ADAPTER",
    "VLLM_LORA_RANKS",
    "adapters_disabled",
    "apply_lora",
    "is_lora",
    "linear_module_names",
    "merged_state",
    "trainable_names",
]

logger = logging.getLogger(__name__)

# vLLM's max_lora_rank choices (vllm/config/lora.py MaxLoRARanks): an engine is sized to the next one up.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# peft's adapter name (one adapter per model).
ADAPTER = "default"
_BASE_INFIX = ".base_layer."


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's ``nn.Linear`` modules (what ``lora_target_modules`` may name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def apply_lora(
    model: nn.Module,
    *,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: str | list[str],
) -> Any:
    """Inject LoRA adapters into ``model`` in place (base weights frozen, adapters in float32) and return the
    ``PeftModel`` around it. ``target_modules``: "all-linear" (every linear layer but the output head) or the
    last names of linear layers; names the model lacks are an error listing the model's linear modules."""
    from peft import LoraConfig, get_peft_model

    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [target_modules]
    if not isinstance(target_modules, str):
        known = linear_module_names(model)
        unknown = sorted(set(target_modules) - set(known))
        if unknown:
            raise ValueError(
                f"GAGPOConfig.lora_target_modules: {unknown} are not linear modules of this model; "
                f"its linear modules are {known} (or use 'all-linear')"
            )
    config = LoraConfig(
        r=int(rank),
        lora_alpha=float(alpha),
        lora_dropout=float(dropout),
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        bias="none",
    )
    # autocast_adapter_dtype (peft's default): adapters of a bf16 base are kept in float32, like master weights.
    return get_peft_model(model, config)


def is_lora(model: nn.Module | None) -> bool:
    """Whether ``model`` carries peft LoRA layers."""
    if model is None:
        return False
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in model.modules())


@contextlib.contextmanager
def adapters_disabled(peft_model: Any) -> Iterator[None]:
    """The base model alone (exactly the frozen initial weights): the reference policy, with no second copy."""
    with peft_model.disable_adapter():
        yield


def trainable_names(module: nn.Module) -> set[str]:
    """Names (as in ``module.state_dict()``) of the parameters that train: the adapters (and a critic's head)."""
    return {name for name, p in module.named_parameters() if p.requires_grad}


@torch.no_grad()
def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The current policy with plain Hugging Face names: every LoRA layer's W + scale * B @ A (computed in
    float32, returned in the base weight's dtype), adapters dropped, everything else as is; detached, on CPU."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, layer in model.named_modules():
        if isinstance(layer, LoraLayer) and ADAPTER in getattr(layer, "lora_A", {}):
            deltas[f"{name}.weight"] = layer.get_delta_weight(ADAPTER).float()
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        name = key.replace(_BASE_INFIX, ".")
        value = value.detach()
        if name in deltas:
            value = (value.float() + deltas[name].to(value.device)).to(value.dtype)
        out[name] = value.cpu()
    return out


def model_linear_names(model_path: str | None) -> list[str] | None:
    """The linear module names of the model in local folder ``model_path`` (built on the meta device from its
    config.json); None when that is not a readable local folder (the module checks when it loads the model)."""
    if not model_path or not (Path(model_path).expanduser() / "config.json").is_file():
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(Path(model_path).expanduser()), local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as err:
        logger.warning(
            "GAGPOConfig.lora_target_modules: cannot read %s (%s); checked at load", model_path, err
        )
        return None
    return linear_module_names(model)


def check_lora(
    config: Any, need: Callable[[bool, str, str], None], *, changed: Callable[[str], bool]
) -> None:
    """The LoRA rules of a GAGPOConfig (``need(ok, field, expected)`` raises naming the field; ``changed(field)``:
    whether it differs from its default); target names are checked against the model's linear modules when its
    config is a local folder (built on the meta device, no weights read)."""
    targets = config.lora_target_modules
    need(
        targets == "all-linear"
        or (
            isinstance(targets, (list, tuple))
            and len(targets) > 0
            and all(isinstance(t, str) and t.strip() for t in targets)
        ),
        "lora_target_modules",
        "'all-linear' or a non-empty list of linear module names",
    )
    if config.lora_rank == 0:
        changed = [n for n in ("lora_alpha", "lora_dropout", "lora_target_modules") if changed(n)]
        need(not changed, "lora_rank", f"an int >= 1 when {', '.join(changed)} is set (0 turns LoRA off)")
        return
    if importlib.util.find_spec("peft") is None:
        raise ValueError(
            f"GAGPOConfig.lora_rank={config.lora_rank} needs peft: pip install 'gagpo-rllib[lora]' (peft 0.21)"
        )
    need(
        config.learner_sharding != "fsdp",
        "learner_sharding",
        f"'ddp' with lora_rank {config.lora_rank} (LoRA with FSDP is not supported: set "
        "GAGPOConfig.lora_rank=0 or learner_sharding='ddp')",
    )
    if config.lora_dropout > 0:
        logger.warning(
            "GAGPOConfig.lora_dropout=%g: the learner's log-probs differ from the rollout's (dropout), so the "
            "first-minibatch ratio is not 1",
            config.lora_dropout,
        )
    if config.backend == "vllm" and config.lora_sync == "adapter":
        need(
            config.lora_rank <= max(VLLM_LORA_RANKS),
            "lora_rank",
            f"<= {max(VLLM_LORA_RANKS)} with lora_sync 'adapter' (vLLM's largest LoRA rank), or use "
            "lora_sync='merged'",
        )
        need(
            targets == "all-linear" or "lm_head" not in targets,
            "lora_sync",
            "'merged' when lora_target_modules include lm_head (vLLM's LoRA does not adapt the output head)",
        )
    if targets != "all-linear":
        known = model_linear_names(config.model_path)
        if known is not None:
            unknown = sorted(set(targets) - set(known))
            need(
                not unknown,
                "lora_target_modules",
                f"names of the model's linear modules {known} ({unknown} are not)",
            )


def lora_module_settings(config: Any) -> dict[str, Any] | None:
    """A GAGPOConfig's LoRA settings as the module's ``model_config["lora"]``: None when ``lora_rank`` is 0."""
    if not config.lora_rank:
        return None
    targets = config.lora_target_modules
    return {
        "rank": int(config.lora_rank),
        "alpha": float(config.lora_alpha if config.lora_alpha is not None else 2 * config.lora_rank),
        "dropout": float(config.lora_dropout),
        "target_modules": targets if isinstance(targets, str) else list(targets),
        # What the rollout engines receive: adapters only where vLLM runs them, else the merged policy.
        "sync": "adapter" if config.backend == "vllm" and config.lora_sync == "adapter" else "merged",
    }
