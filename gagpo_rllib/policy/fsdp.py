"""FSDP2 for the learners' models: one shard unit per decoder layer, full weights gathered on demand.

With ``GAGPOConfig.learner_sharding = "fsdp"`` each of N learners holds 1/N of the trainable weights, their
gradients and the optimizer state (fp32 masters, forward/backward in the compute dtype through FSDP's mixed
precision policy, gradients reduced in fp32); the frozen reference is sharded too. Every forward all-gathers the
layers it runs, so it is a collective: all learners must run the same number of forwards (the learner pads the
chunks of a step; the reference cache and the shared-prompt forward, whose number of forwards depends on the
data, are off under FSDP).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

__all__ = [
    "decoder_layers",
    "full_model_state",
    "full_optimizer_state",
    "full_tensor",
    "load_full_model_state",
    "load_full_optimizer_state",
    "set_gradient_sync",
    "shard",
]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM (``model.model.layers``), of a trunk (``model.layers``) or of a critic
    (``model.trunk.layers``); empty for a model without them (a value head: one shard unit)."""
    for name in ("", "model", "trunk"):
        owner = getattr(model, name, None) if name else model
        layers = getattr(owner, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return list(layers)
    return []


def shard(
    model: nn.Module,
    *,
    compute_dtype: torch.dtype,
    layers: list[nn.Module] | None = None,
    frozen: bool = False,
) -> nn.Module:
    """``fully_shard`` each decoder layer, then the rest of ``model``, over all learners.

    Parameters stay in their dtype (the fp32 masters); forward and backward run in ``compute_dtype``; gradients
    are reduced in fp32. A ``frozen`` model (the reference: forward only) reshards its root (embeddings, head)
    after each forward too; a trained one keeps it gathered until its backward.
    """
    import torch.distributed as dist

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param_dtype = next(model.parameters()).dtype
    policy = MixedPrecisionPolicy(
        param_dtype=compute_dtype if compute_dtype != param_dtype else None,
        reduce_dtype=torch.float32 if param_dtype == torch.float32 else None,
    )
    for layer in decoder_layers(model) if layers is None else layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True if frozen else None)
    return model


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients in this backward (True) or accumulate them unsharded (False)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on CPU on rank 0, empty elsewhere. A collective."""
    return get_model_state_dict(module, options=_FULL)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP shard (a collective: every learner calls it, in the same order), on the
    shard's device; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def load_full_model_state(module: nn.Module, state: dict[str, Any]) -> None:
    """Load a full state dict (present on every rank) into the sharded ``module``; keys it lacks are ignored."""
    own = set(module.state_dict())
    tensors = {k: torch.as_tensor(v) for k, v in state.items() if k in own}
    set_model_state_dict(module, tensors, options=StateDictOptions(full_state_dict=True, strict=False))


def full_optimizer_state(module: nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state (keyed by parameter names) on CPU on rank 0, empty elsewhere. A collective."""
    return get_optimizer_state_dict(module, optim, options=_FULL)


def load_full_optimizer_state(module: nn.Module, optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer state (present on every rank) into the sharded optimizer. A collective."""
    set_optimizer_state_dict(module, optim, state, options=StateDictOptions(full_state_dict=True))
