"""Generation through vLLM (GPU only, optional): the backend GPU users run for rollouts.

Written against vLLM's documented offline API (``LLM``, ``SamplingParams(logprobs=0)``, ``logprobs_mode``,
``collective_rpc``, ``reset_prefix_cache``, structured outputs with a choice list). vLLM is imported on first
construction only, so the package imports without it. It is not exercised by the CPU test-suite.

Constrained decoding uses vLLM's structured-output "choice": the grammar allows every tokenisation of each
admissible string, which is a superset of the learner's trie over the canonical tokenisation. Constrained outputs
are therefore returned with the canonical token ids of the chosen action, and ``exact_logprobs_constrained`` is
False: the learner must recompute the old log-probs with its own masked forward (its first-minibatch ratio is
then 1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from gagpo_rllib.generation.base import GenerationBackend, GenerationOutput, SamplingConfig
from gagpo_rllib.generation.constraints import action_token_ids, end_token_id

__all__ = ["VLLMGenerationBackend"]

logger = logging.getLogger(__name__)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "backend 'vllm' needs the optional vllm package (GPU only): pip install 'gagpo-rllib[vllm]'"
        ) from err
    return vllm


def _choice_params(choices: list[str]) -> dict[str, Any]:
    """Keyword for SamplingParams restricting the output to one of ``choices`` (new and older vLLM names)."""
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(choice=list(choices))}
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(choice=list(choices))}


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker (passed to collective_rpc as a callable taking the worker as ``self``)."""
    worker.model_runner.model.load_weights(weights=weights)


class VLLMGenerationBackend(GenerationBackend):
    """One ``LLM.generate`` call per step for all prompts; weights follow the learner via ``update_weights``."""

    exact_logprobs_constrained = False

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cuda",
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        **llm_kwargs: Any,
    ):
        vllm = _import_vllm()
        if not str(device).startswith("cuda"):
            raise ValueError(
                f"device: the vLLM backend runs on CUDA only, got {device!r}; use backend 'hf' on CPU"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.eos_token_id = end_token_id(self.tokenizer)
        # processed_logprobs: log-probs after temperature (and the structured-output mask), i.e. of the
        # distribution actually sampled; the default raw_logprobs ignores the temperature.
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self._vllm = vllm

    def _params(self, sampling: SamplingConfig, seed: int | None, choices: list[str] | None) -> Any:
        extra = _choice_params(choices) if choices is not None else {}
        return self._vllm.SamplingParams(
            n=1,
            temperature=float(sampling.temperature),
            top_p=1.0,
            top_k=-1,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=int(sampling.max_new_tokens),
            stop_token_ids=[self.eos_token_id],
            logprobs=0,
            seed=seed,
            skip_special_tokens=True,
            **extra,
        )

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
        from vllm.inputs import TokensPrompt

        prompt_ids = [list(p) for p in self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
        params = [
            self._params(
                sampling,
                None if seed is None else int(seed) + i,
                admissible[i] if sampling.constrained else None,
            )
            for i in range(len(prompts))
        ]
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        results = []
        for i, out in enumerate(outputs):
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            logprobs = [float(step[tok].logprob) for tok, step in zip(ids, comp.logprobs or [], strict=False)]
            if len(logprobs) != len(ids):
                raise RuntimeError(
                    f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens (prompt {i})"
                )
            finished = comp.finish_reason == "stop"
            if finished and (not ids or ids[-1] != self.eos_token_id):
                ids.append(self.eos_token_id)  # stop tokens may be left out of token_ids
                logprobs.append(float("nan"))
            text = comp.text
            if sampling.constrained:
                ids, logprobs, text = self._canonical(admissible[i], ids, logprobs, comp.text)
            results.append(GenerationOutput(prompt_ids[i], ids, logprobs, text, finished))
        return results

    def _canonical(
        self, admissible: list[str], ids: list[int], logprobs: list[float], text: str
    ) -> tuple[list[int], list[float], str]:
        """Map a structured-output answer onto the canonical tokenisation the learner's trie uses."""
        choice = text.strip()
        if choice not in admissible:
            logger.warning("vLLM constrained output %r is not an admissible action", text[:80])
            return ids, logprobs, text
        canonical = action_token_ids(self.tokenizer, [choice])[0]
        if canonical != ids:
            logprobs = [float("nan")] * len(canonical)
        return canonical, logprobs, choice

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        weights = [(name, t.detach().to("cpu")) for name, t in state_dict.items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.reset_cache()

    def reset_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for the learner when both share one GPU (needs enable_sleep_mode=True)."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()
