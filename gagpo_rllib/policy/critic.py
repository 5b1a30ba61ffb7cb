"""The learned critic of the PPO baseline: V(s_t) from the hidden state of the prompt's last token.

As the GiGPO reference's framework does it, the critic starts from the policy's weights: a copy of the policy's
transformer trunk with a scalar head (``share_trunk=False``, the default), or, to halve the weights' memory, a
scalar head on the policy's own trunk (``share_trunk=True``: the value loss then also trains the trunk). The state
s_t is the turn's prompt, so V(s_t) reads the trunk's last hidden state at the last prompt token.

``CriticRLModule`` is ``LLMRLModule`` plus that critic on the learner only: the critic is a non-inference
attribute, so EnvRunners (``inference_only``) neither build it nor receive its weights; it is in the learner's
module state, so checkpoints hold and restore it; ``rllib export`` keeps only the policy's ``model.*`` weights and
``rllib evaluate`` builds the plain policy module, so both ignore it.

Under LoRA (``GAGPOConfig.lora_rank``) the critic is LoRA'd like the policy: the separate critic is a copy of the
LoRA'd trunk whose own adapters and head train (its base stays frozen and, like the policy's, out of the
checkpoint); the shared trunk's value head reads the policy's adapted trunk, so the value loss trains the policy's
adapters.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from ray.rllib.core.rl_module.apis.inference_only_api import InferenceOnlyAPI
from torch import Tensor, nn

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.logprobs import (
    back_in_order,
    last_mlp_only_on_last_column,
    left_pad,
    length_chunks,
    padded_positions,
    unique_rows,
)
from gagpo_rllib.policy.rl_module import LLMRLModule, unpad_token_batch

__all__ = ["CriticRLModule", "ValueHead", "last_token_hidden"]


def last_token_hidden(trunk: nn.Module, prompt_ids: list[list[int]], *, pad_token_id: int) -> Tensor:
    """The trunk's last hidden state at each prompt's last token: [B, hidden] (prompts left-padded).

    Position ids are cumsum(attention_mask) - 1, as in generation, so padding does not shift the positions. Only the
    last column is read, so the last layer's MLP runs there alone (``last_mlp_only_on_last_column``).
    """
    if not prompt_ids:
        raise ValueError("prompt_ids: empty batch")
    for b, p in enumerate(prompt_ids):
        if not p:
            raise ValueError(f"prompt_ids[{b}]: empty prompt")
    device = next(trunk.parameters()).device
    input_ids, attn = left_pad(prompt_ids, pad_token_id)
    position_ids = padded_positions(attn)
    with last_mlp_only_on_last_column(trunk):
        out = trunk(
            input_ids=input_ids.to(device),
            attention_mask=attn.to(device),
            position_ids=position_ids.to(device),
            use_cache=False,
        )
    return out.last_hidden_state[:, -1, :]


class ValueHead(nn.Module):
    """A scalar head, initialised from an explicit seed (small weights, zero bias: V starts near 0)."""

    def __init__(self, hidden_size: int, *, seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1, dtype=dtype)
        generator = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            weight = torch.randn(self.linear.weight.shape, generator=generator) / hidden_size**0.5
            self.linear.weight.copy_(weight.to(dtype))
            self.linear.bias.zero_()

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1).float()


class ValueModel(nn.Module):
    """A separate critic: a copy of the policy's trunk plus a ``ValueHead``."""

    def __init__(
        self, trunk: nn.Module, hidden_size: int, *, seed: int = 0, dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        self.trunk = trunk
        self.head = ValueHead(hidden_size, seed=seed, dtype=dtype)

    def forward(self, prompt_ids: list[list[int]], *, pad_token_id: int) -> Tensor:
        return self.head(last_token_hidden(self.trunk, prompt_ids, pad_token_id=pad_token_id))


class CriticRLModule(LLMRLModule, InferenceOnlyAPI):
    """``LLMRLModule`` with a critic on the learner; ``model_config["critic"]``: ``share_trunk`` (False), ``seed``.

    The train forward adds ``values`` [B] (with gradient) for the batch's prompts; ``state_values`` gives them for
    any list of prompts (the learner connector calls it without gradient to get V(s_t) for GAE).
    """

    def setup(self) -> None:
        super().setup()
        cfg = dict((self.model_config or {}).get("critic") or {})
        unknown = sorted(set(cfg) - {"share_trunk", "seed"})
        if unknown:
            raise ValueError(f"model_config['critic'] has unknown keys {unknown}; expected share_trunk, seed")
        self.share_trunk = bool(cfg.get("share_trunk", False))
        if self.inference_only:
            return
        hidden = int(self.model.config.hidden_size)
        seed = int(cfg.get("seed", 0))
        # Trained like the policy: fp32 masters unless pure_low_precision.
        if self.share_trunk:
            self.value_head = ValueHead(hidden, seed=seed, dtype=self.param_dtype)
        else:
            self.critic = ValueModel(
                copy.deepcopy(self.model.base_model), hidden, seed=seed, dtype=self.param_dtype
            )
            if not self.lora:  # under LoRA the copy trains its own adapters only (its base stays frozen)
                self.critic.trunk.requires_grad_(True)

    def get_non_inference_attributes(self) -> list[str]:
        return ["value_head"] if self.share_trunk else ["critic"]

    def fsdp_parts(self) -> list[nn.Module]:
        # The separate critic is sharded per trunk layer; the shared trunk's head is one small unit.
        return [*super().fsdp_parts(), self.value_head if self.share_trunk else self.critic]

    def critic_parameters(self) -> list[nn.Parameter]:
        """The parameters only the critic uses (the head, plus the trunk copy unless the trunk is shared)."""
        part = self.value_head if self.share_trunk else self.critic
        return [p for p in part.parameters() if p.requires_grad]

    def state_values(self, prompt_ids: list[list[int]]) -> Tensor:
        """V(s) for each prompt: [B] float32.

        The K rollouts of a group share prompts, so the critic runs once per distinct prompt, in length-sorted
        chunks of at most ``train_chunk_tokens`` tokens; the gather back to the rows sums their gradients.
        """
        if self.inference_only:
            raise RuntimeError("an inference-only CriticRLModule (EnvRunner) has no critic")
        if not prompt_ids:
            raise ValueError("prompt_ids: empty batch")
        distinct = unique_rows([tuple(p) for p in prompt_ids])
        prompts = [list(prompt_ids[i]) for i in distinct.index]
        chunks = length_chunks([len(p) for p in prompts], self.train_chunk_tokens)
        rounds = self.forward_rounds(len(chunks))  # FSDP: as many forwards on every learner
        parts, order = [], []
        for r in range(rounds):
            if r < len(chunks):
                parts.append(self._values([prompts[i] for i in chunks[r]]))
                order.extend(chunks[r])
            else:
                self._values([[self.pad_token_id]])
        values = torch.cat(parts)
        return values[back_in_order(order).to(values.device)[distinct.inverse.to(values.device)]]

    def _values(self, prompt_ids: list[list[int]]) -> Tensor:
        if self.share_trunk:
            return self.value_head(
                last_token_hidden(self.model.base_model, prompt_ids, pad_token_id=self.pad_token_id)
            )
        return self.critic(prompt_ids, pad_token_id=self.pad_token_id)

    def _train_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = super()._train_outputs(batch)
        prompts, _, _ = unpad_token_batch({k: batch[k] for k in _TOKEN_KEYS}, self.vocab_size)
        out[Columns.VALUES] = self.state_values(prompts)
        return out


_TOKEN_KEYS = (Columns.PROMPT_IDS, Columns.PROMPT_LEN, Columns.ACTION_IDS, Columns.ACTION_LEN)
