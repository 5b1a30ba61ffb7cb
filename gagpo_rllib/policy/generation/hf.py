"""Generation with a Hugging Face causal LM: one batched KV-cache decoding loop per step for all live sub-envs.

The loop is written here rather than taken from ``model.generate`` for two reasons:

- memory: ``generate(output_logits=True)`` keeps the full logits of every generated position, B x T x V floats
  (for Qwen2.5's 151,936-token vocabulary, 128 prompts x 512 new tokens in fp32 is about 40 GB). Here only the
  current position's [B, V] logits live at a time; the sampled token's log-prob is taken as decoding proceeds,
  so what is kept grows with B x T.
- exactness and seeds: the sampled distribution is ``scaled_logprobs`` (raw logits / T, over the trie's allowed
  set when constrained), the same function the learner calls, and each row draws from its own seeded generator,
  so a prompt's answer depends only on its own seed.
- shared prefill: K rollouts of a task start from the same state, so a step's prompts often repeat; each distinct
  prompt is prefilled once and its KV cache and last logits are copied to its rows, which then decode apart.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gagpo_rllib.policy.generation.base import (
    ActionTrie,
    GenerationBackend,
    GenerationOutput,
    SampleBatch,
    SamplingConfig,
    action_token_ids,
    end_token_id,
)
from gagpo_rllib.policy.logprobs import (
    cache_keyword,
    kv_cache,
    left_pad,
    padded_positions,
    prompt_cache,
    scaled_logprobs,
    unique_rows,
)

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
            from gagpo_rllib.policy.models import load_policy

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

    @property
    def stop_token_ids(self) -> list[int]:
        """The tokenizer's end token, then the model's generation-config end tokens (read at each call)."""
        model_eos = self.model.generation_config.eos_token_id
        model_eos = (
            [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
        )
        return [self.eos_token_id] + sorted({int(t) for t in model_eos} - {self.eos_token_id})

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        distinct = list(dict.fromkeys(prompts))  # repeated prompts are tokenized once
        encoded = dict(
            zip(distinct, self.tokenizer(distinct, add_special_tokens=False)["input_ids"], strict=True)
        )
        ids = [encoded[p] for p in prompts]
        for i, p in enumerate(ids):
            if not p:
                raise ValueError(f"prompts[{i}]: encodes to no tokens")
        return [list(p) for p in ids]

    def sample(self, batch: SampleBatch) -> list[GenerationOutput]:
        prompts, sampling, admissible, seeds = batch.prompts, batch.sampling, batch.admissible, batch.seeds
        prompt_ids = self._encode(prompts)
        # prefill each distinct prompt once; rows[b] is row b's distinct prompt (None: all distinct, no copy).
        # The padded width is the longest prompt's either way, so every row sees the mask it would undeduped.
        distinct = unique_rows([tuple(p) for p in prompt_ids])
        input_ids, attn = (
            t.to(self.device) for t in left_pad([prompt_ids[i] for i in distinct.index], self.pad_token_id)
        )
        rows = None if len(distinct.index) == len(prompts) else distinct.inverse.to(self.device)
        tries: list[ActionTrie] | None = None
        budget = int(sampling.max_new_tokens)
        if sampling.constrained:
            built: dict[tuple[str, ...], ActionTrie] = {}  # rows of one state list the same actions
            tries = [
                built.get(key)
                or built.setdefault(key, ActionTrie(action_token_ids(self.tokenizer, list(key))))
                for key in map(tuple, admissible)
            ]
            budget = self.token_budget(sampling, max(t.depth for t in tries))
        with torch.no_grad():
            tokens, logps, finished = self._decode(input_ids, attn, rows, sampling, budget, tries, seeds)
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
        rows: torch.Tensor | None,
        sampling: SamplingConfig,
        budget: int,
        tries: list[ActionTrie] | None,
        seeds: list[int] | None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample up to ``budget`` tokens per row with a KV cache; return tokens, log-probs, finished flags.

        ``input_ids``/``attn`` are the distinct prompts; ``rows`` (None: one row each) maps each row to its prompt,
        whose prefilled cache, logits, mask and positions the row starts from.
        """
        bsz = input_ids.shape[0] if rows is None else rows.numel()
        stops = set(self.stop_token_ids)
        generators = None
        if seeds is not None:
            generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        tokens: list[list[int]] = [[] for _ in range(bsz)]
        logps: list[list[float]] = [[] for _ in range(bsz)]
        done = [False] * bsz
        finished = [False] * bsz
        position_ids = padded_positions(attn)
        # the prefill as the learner's: all but the last prompt token into the cache, then the last token's logits
        out = self.model(
            input_ids=input_ids[:, -1:],
            attention_mask=attn,
            position_ids=position_ids[:, -1:],
            use_cache=True,
            **prompt_cache(self.model, input_ids, attn),
        )
        logits, cache = out.logits[:, -1, :], kv_cache(out)
        if rows is not None:
            # reorder_cache index_selects every layer's keys/values, so a repeated index copies a prompt's cache
            # to each of its rows (batch_select_indices would too, but only dynamic layers define it)
            cache.reorder_cache(rows)
            logits = logits.index_select(0, rows)
            attn = attn.index_select(0, rows)
            position_ids = position_ids.index_select(0, rows)
        for step in range(budget):
            allowed = None
            if tries is not None:
                live = [b for b in range(bsz) if not done[b]]
                nexts = [tries[b].allowed(tokens[b]) for b in live]
                allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
                allowed[
                    [b for b, ids in zip(live, nexts, strict=True) for _ in ids],
                    [t for ids in nexts for t in ids],
                ] = True
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
            if (
                tries is not None
                and step + 1 < budget
                and _finish_forced(tries, tokens, logps, done, finished)
            ):
                break
            nxt = torch.where(torch.tensor(done, device=nxt.device), self.pad_token_id, nxt)
            attn = torch.cat([attn, torch.ones((bsz, 1), dtype=attn.dtype, device=attn.device)], dim=1)
            position_ids = position_ids[:, -1:] + 1
            out = self.model(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=attn,
                position_ids=position_ids,
                use_cache=True,
                **{cache_keyword(self.model): cache},
            )
            logits, cache = out.logits[:, -1, :], kv_cache(out)
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


def _finish_forced(
    tries: list[ActionTrie],
    tokens: list[list[int]],
    logps: list[list[float]],
    done: list[bool],
    finished: list[bool],
) -> bool:
    """End every live row at once when each one's next token is forced and closes its action (e.g. the end token
    after a complete command): a single allowed token has probability 1 under the constrained softmax (log-prob
    exactly 0, as the learner computes it), so the forward that would score it is skipped. False (and nothing
    changed) when some row still has a choice or continues after its forced token."""
    live = [b for b in range(len(done)) if not done[b]]
    forced = []
    for b in live:
        nxt = tries[b].allowed(tokens[b])
        if len(nxt) != 1 or tries[b].allowed([*tokens[b], nxt[0]]):
            return False
        forced.append(nxt[0])
    for b, tok in zip(live, forced, strict=True):
        tokens[b].append(tok)
        logps[b].append(0.0)
        done[b] = finished[b] = True
    return True
