"""Generation through Hugging Face ``generate``: one batched call per step for all live sub-environments."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from gagpo_rllib.generation.base import GenerationBackend, GenerationOutput, SamplingConfig
from gagpo_rllib.generation.constraints import ActionTrie, action_token_ids, end_token_id
from gagpo_rllib.logprobs import scaled_logprobs

__all__ = ["HFGenerationBackend"]

logger = logging.getLogger(__name__)


class HFGenerationBackend(GenerationBackend):
    """Pure ancestral sampling with ``model.generate``; behaviour log-probs from the raw per-step logits.

    The model's own generation_config (top-k, top-p, repetition penalty, ...) is ignored on purpose: any logits
    processor other than temperature and the action constraint would make the stored log-probs differ from the
    distribution that was actually sampled.
    """

    def __init__(
        self,
        model_path: str | Path | tuple[PreTrainedModel, PreTrainedTokenizerBase],
        device: str | torch.device = "cpu",
        *,
        dtype: torch.dtype = torch.float32,
    ):
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
        # Free generation also stops on the model's own end tokens (chat models often end a turn with a token
        # other than the tokenizer's eos); constrained generation ends with eos_token_id by construction.
        model_eos = self.model.generation_config.eos_token_id
        model_eos = (
            [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
        )
        self.stop_token_ids = [self.eos_token_id] + sorted({int(t) for t in model_eos} - {self.eos_token_id})

    @contextlib.contextmanager
    def _plain_generation_config(self) -> Iterator[None]:
        """Hide the model's generation defaults for the duration of one call."""
        saved = self.model.generation_config
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.stop_token_ids, pad_token_id=self.pad_token_id
        )
        try:
            yield
        finally:
            self.model.generation_config = saved

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
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        if not prompts:
            return []
        self.check_admissible(prompts, sampling, admissible)
        input_ids, attn, prompt_ids = self._encode(prompts)
        width = input_ids.shape[1]
        tries: list[ActionTrie] | None = None
        kwargs = {}
        if sampling.constrained:
            tries = [ActionTrie(action_token_ids(self.tokenizer, acts)) for acts in admissible]
            eos = self.eos_token_id

            def allowed_fn(batch_id: int, ids: torch.Tensor) -> list[int]:
                allowed = tries[batch_id].allowed(ids[width:].tolist())
                return allowed or [eos]  # finished rows are padded by generate; keep their softmax finite

            kwargs["prefix_allowed_tokens_fn"] = allowed_fn
        config = GenerationConfig(
            do_sample=True,
            temperature=float(sampling.temperature),
            top_k=0,
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=int(sampling.max_new_tokens),
            min_new_tokens=0,
            num_beams=1,
            num_return_sequences=1,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        rng = self._rng_scope(seed)
        with rng, self._plain_generation_config(), torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attn, generation_config=config, **kwargs
            )
        new_tokens = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # [B, T, V] raw logits
        allowed = None
        if tries is not None:
            allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
            for b, trie in enumerate(tries):
                seq = new_tokens[b].tolist()
                for k in range(len(seq)):
                    ok = trie.allowed(seq[:k])
                    if not ok:
                        break
                    allowed[b, k, ok] = True
        logp, _ = scaled_logprobs(logits, new_tokens, temperature=sampling.temperature, allowed=allowed)
        stops = set(self.stop_token_ids)
        results = []
        for b in range(len(prompts)):
            seq = new_tokens[b].tolist()
            n = next((k + 1 for k, t in enumerate(seq) if t in stops), len(seq))
            finished = n <= len(seq) and seq[n - 1] in stops
            action = seq[:n]
            results.append(
                GenerationOutput(
                    prompt_ids=prompt_ids[b],
                    action_ids=action,
                    logprobs=logp[b, :n].tolist(),
                    text=self.tokenizer.decode(action, skip_special_tokens=True),
                    finished=finished,
                )
            )
        return results

    def _rng_scope(self, seed: int | None) -> contextlib.AbstractContextManager:
        """A seeded, isolated RNG when ``seed`` is given; the global torch RNG otherwise."""
        if seed is None:
            return contextlib.nullcontext()
        devices = [self.device] if self.device.type == "cuda" else []
        return _seeded(int(seed), devices)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        try:
            self.model.load_state_dict(dict(state_dict), strict=True)
        except RuntimeError as err:
            raise ValueError(f"state_dict: does not match the rollout model: {err}") from err

    def reset_cache(self) -> None:
        """HF generate keeps no cache between calls; nothing to drop."""


@contextlib.contextmanager
def _seeded(seed: int, devices: list[torch.device]) -> Iterator[None]:
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
