"""Generation with a Hugging Face causal LM: one batched KV-cache decoding loop per step for all live sub-envs.

The loop is written here rather than taken from ``model.generate`` for two reasons:

- memory: ``generate(output_logits=True)`` keeps the full logits of every generated position, B x T x V floats
  (for Qwen2.5's 151,936-token vocabulary, 128 prompts x 512 new tokens in fp32 is about 40 GB). Here only the
  current position's [B, V] logits live at a time; the sampled token's log-prob is taken as decoding proceeds,
  so what is kept grows with B x T.
- exactness and seeds: the sampled distribution is ``scaled_logprobs`` (raw logits / T, over the trie's allowed
  set when constrained), the same function the learner calls, and each row draws from its own seeded generator,
  so a prompt's answer depends only on its own seed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gagpo_rllib.generation.base import GenerationBackend, GenerationOutput, SamplingConfig, Seed, row_seeds
from gagpo_rllib.generation.constraints import ActionTrie, action_token_ids, end_token_id
from gagpo_rllib.logprobs import scaled_logprobs

__all__ = ["HFGenerationBackend"]

logger = logging.getLogger(__name__)


class HFGenerationBackend(GenerationBackend):
    """Pure ancestral sampling at temperature T; behaviour log-probs of exactly the distribution sampled.

    The model's own generation_config (top-k, top-p, repetition penalty, ...) is ignored on purpose: any logits
    processor other than temperature and the action constraint would make the stored log-probs differ from the
    distribution that was actually sampled. Free generation stops on the tokenizer's end token and on the model's
    generation-config end tokens (chat models often end a turn with another token); the stop token is kept in
    ``action_ids`` with its log-prob.
    """

    def __init__(
        self,
        model_path: str | Path | tuple[PreTrainedModel, PreTrainedTokenizerBase],
        device: str | torch.device = "cpu",
        *,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if isinstance(model_path, tuple):
            self.model, self.tokenizer = model_path
        else:
            from gagpo_rllib.models import load_policy

            self.model, self.tokenizer = load_policy(model_path, dtype=dtype, device=device)
        self.device = torch.device(device)
        self.model.to(self.device)
        self.model.eval()
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "tokenizer.pad_token_id: the tokenizer needs a pad token (load it with load_policy)"
            )
        self.eos_token_id = end_token_id(self.tokenizer)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        # transformers renamed the KV-cache argument from past_key_values to cache (both are supported).
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def stop_token_ids(self) -> list[int]:
        """The tokenizer's end token, then the model's generation-config end tokens (read at each call)."""
        model_eos = self.model.generation_config.eos_token_id
        model_eos = (
            [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
        )
        return [self.eos_token_id] + sorted({int(t) for t in model_eos} - {self.eos_token_id})

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        for i, p in enumerate(ids):
            if not p:
                raise ValueError(f"prompts[{i}]: encodes to no tokens")
        width = max(len(p) for p in ids)
        input_ids = torch.full((len(ids), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(ids), width), dtype=torch.long)
        for i, p in enumerate(ids):
            input_ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        return input_ids.to(self.device), attn.to(self.device), [list(p) for p in ids]

    def generate(
        self,
        prompts: list[str],
        *,
        sampling: SamplingConfig,
        admissible: list[list[str]] | None = None,
        seed: Seed = None,
    ) -> list[GenerationOutput]:
        if not prompts:
            return []
        self.check_admissible(prompts, sampling, admissible)
        seeds = row_seeds(seed, len(prompts))
        input_ids, attn, prompt_ids = self._encode(prompts)
        tries: list[ActionTrie] | None = None
        budget = int(sampling.max_new_tokens)
        if sampling.constrained:
            tries = [ActionTrie(action_token_ids(self.tokenizer, acts)) for acts in admissible]
            budget = self.token_budget(sampling, max(t.depth for t in tries))
        with torch.no_grad():
            tokens, logps, finished = self._decode(input_ids, attn, sampling, budget, tries, seeds)
        results = []
        for b in range(len(prompts)):
            action = tokens[b]
            results.append(
                GenerationOutput(
                    prompt_ids=prompt_ids[b],
                    action_ids=action,
                    logprobs=logps[b],
                    text=self.tokenizer.decode(action, skip_special_tokens=True),
                    finished=finished[b],
                )
            )
        return results

    def _decode(
        self,
        input_ids: torch.Tensor,
        attn: torch.Tensor,
        sampling: SamplingConfig,
        budget: int,
        tries: list[ActionTrie] | None,
        seeds: list[int] | None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample up to ``budget`` tokens per row with a KV cache; return tokens, log-probs, finished flags."""
        bsz = input_ids.shape[0]
        stops = set(self.stop_token_ids)
        generators = None
        if seeds is not None:
            generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        tokens: list[list[int]] = [[] for _ in range(bsz)]
        logps: list[list[float]] = [[] for _ in range(bsz)]
        done = [False] * bsz
        finished = [False] * bsz
        position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attn,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        for _ in range(budget):
            logits = out.logits[:, -1, :]
            allowed = None
            if tries is not None:
                allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
                for b, trie in enumerate(tries):
                    if not done[b]:
                        allowed[b, trie.allowed(tokens[b])] = True
            nxt = self._sample(logits, sampling.temperature, allowed, generators, done)
            logp, _ = scaled_logprobs(logits, nxt, temperature=sampling.temperature, allowed=allowed)
            for b, (tok, lp) in enumerate(zip(nxt.tolist(), logp.tolist(), strict=True)):
                if done[b]:
                    continue
                tokens[b].append(tok)
                logps[b].append(lp)
                # constrained: the action ends when the trie does (with the end token); free: on a stop token
                ended = not tries[b].allowed(tokens[b]) if tries is not None else tok in stops
                if ended:
                    done[b] = finished[b] = True
            if all(done):
                break
            nxt = torch.where(torch.tensor(done, device=nxt.device), self.pad_token_id, nxt)
            attn = torch.cat([attn, torch.ones((bsz, 1), dtype=attn.dtype, device=attn.device)], dim=1)
            position_ids = position_ids[:, -1:] + 1
            out = self.model(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=attn,
                position_ids=position_ids,
                use_cache=True,
                **{self._cache_kw: _kv_cache(out)},
            )
        return tokens, logps, finished

    def _sample(
        self,
        logits: torch.Tensor,
        temperature: float,
        allowed: torch.Tensor | None,
        generators: list[torch.Generator] | None,
        done: list[bool],
    ) -> torch.Tensor:
        """One token per row from softmax(logits / T) over the allowed set; row b uses generator b.

        Gumbel-max: argmax(scores + Gumbel noise) is an exact draw from softmax(scores), and one uniform per
        vocabulary entry and row is cheaper than a per-row multinomial over a large vocabulary.
        """
        scaled = logits.float() / float(temperature)
        if allowed is not None:
            allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
            scaled = scaled.masked_fill(~allowed, float("-inf"))
        if generators is None:
            uniform = torch.rand(scaled.shape, device=scaled.device)
        else:
            uniform = torch.full(scaled.shape, 0.5, device=scaled.device)
            for b, gen in enumerate(generators):
                if not done[b]:  # a finished row draws nothing, so its stream stays its own
                    uniform[b] = torch.rand(scaled.shape[-1], generator=gen, device=scaled.device)
        return (scaled - torch.log(-torch.log(uniform))).argmax(dim=-1)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        try:
            self.model.load_state_dict(dict(state_dict), strict=True)
        except RuntimeError as err:
            raise ValueError(f"state_dict: does not match the rollout model: {err}") from err

    def reset_cache(self) -> None:
        """The decoding loop keeps no cache between calls; nothing to drop."""


def _kv_cache(out: Any) -> Any:
    """The KV cache of a forward's output (``cache`` in newer transformers, ``past_key_values`` before)."""
    cache = out.get("cache", None)
    return out.get("past_key_values", None) if cache is None else cache
