"""The LLM RLModule: a Hugging Face causal LM acting as an RLlib policy over text.

On an EnvRunner (``inference_only``) the module samples through a generation backend: all prompts of one step go
into one batched call, and the module returns the generated text as the action plus, per prompt, the prompt's
token ids, the action's token ids and the behaviour log-prob of each action token. On the Learner the module
computes the current and the frozen reference log-probs of those action tokens. The reference copy is kept out of
the module's parameters and state (it is neither trained, checkpointed nor shipped to the EnvRunners); it is the
initial weights, reloaded from ``model_path``.

Precision: ``dtype`` is the compute and rollout dtype. On the learner the trained weights (and so the optimizer
state) stay in float32 and the forwards run in ``dtype`` under autocast (FSDP: its mixed-precision policy); only the
frozen reference is loaded in ``dtype``. EnvRunners load and receive the weights in ``dtype``. With
``pure_low_precision`` the learner keeps its weights in ``dtype`` too (an Adam step below bf16's resolution is
then lost).

LoRA (``model_config["lora"]``, ``gagpo_rllib.policy.lora``): the learner loads the base in ``dtype``, frozen, and trains
peft adapters (float32 unless ``pure_low_precision``). The reference is that base with the adapters disabled (no
second copy). The module's state holds only the trained parameters (checkpoints: adapters and their optimizer
state, not the base); what EnvRunners receive is the merged policy under the plain Hugging Face names, or, for
vLLM engines with adapter sync (``lora["sync"] == "adapter"``), the adapters alone, which the engine loads as its
own LoRA adapter over its unchanged base.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.core.rl_module.apis.inference_only_api import InferenceOnlyAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.numpy import convert_to_numpy

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.distributed import agree_max
from gagpo_rllib.policy.generation.base import GenerationBackend, SamplingConfig
from gagpo_rllib.policy.logprobs import (
    LAYOUTS,
    ReferenceLogprobCache,
    action_logprobs,
    back_in_order,
    checkpointing,
    row_keys,
    row_keys_of,
    shared_prompt_logprobs,
    token_chunks,
    unique_rows,
)
from gagpo_rllib.policy.lora import (
    VLLM_LORA_RANKS,
    adapters_disabled,
    apply_lora,
    merged_state,
    trainable_names,
)
from gagpo_rllib.policy.models import DTYPES, load_policy

logger = logging.getLogger(__name__)

__all__ = ["LLMRLModule", "object_array"]


# The policy's parameters in this module's state: "model." + the Hugging Face name.
_POLICY_PREFIX = "model."


def object_array(items: Any) -> np.ndarray:
    """A 1-D object array (RLlib keeps those whole; a list of lists or strings would be split)."""
    items = list(items)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _forward_columns(outs: list[Any]) -> dict[str, np.ndarray]:
    """A forward's output columns from the backend's answers (one row per answer)."""
    return {
        RLlibColumns.ACTIONS: object_array(o.text for o in outs),
        Columns.PROMPT_IDS: object_array(list(o.prompt_ids) for o in outs),
        Columns.ACTION_IDS: object_array(list(o.action_ids) for o in outs),
        Columns.ACTION_LOGP: object_array(list(o.logprobs) for o in outs),
    }


class LLMRLModule(TorchRLModule):
    """A causal LM policy whose action is the generated text of one turn.

    ``model_config`` keys: ``model_path`` (required), ``dtype`` ("float32"), ``backend`` ("hf" or "vllm"),
    ``backend_kwargs`` (dict), ``sampling`` (``SamplingConfig`` fields for exploration), ``eval_sampling``
    (for ``forward_inference``; defaults to ``sampling``), ``reference`` (True: keep the frozen reference copy on
    the learner; False when the KL coefficient is 0, which saves its memory and forward pass),
    ``pure_low_precision`` (False: fp32 master weights on the learner), ``gradient_checkpointing`` (False),
    ``lora`` (None, or ``{"rank", "alpha", "dropout", "target_modules", "sync"}``: train LoRA adapters on the
    learner; ``sync`` "adapter" or "merged": what vLLM engines receive),
    ``rollout_engine`` (True: an inference-only vLLM module starts its engine; False: it keeps only the tokenizer,
    drops the weights it is sent and refuses to sample).
    """

    def setup(self) -> None:
        cfg = dict(self.model_config or {})
        path = cfg.get("model_path")
        if not path:
            raise ValueError("model_config['model_path'] is required: a causal LM folder or hub id")
        dtype_name = cfg.get("dtype", "float32")
        if dtype_name not in DTYPES:
            raise ValueError(f"model_config['dtype'] must be one of {sorted(DTYPES)}, got {dtype_name!r}")
        self.model_path = str(path)
        self.dtype = DTYPES[dtype_name]
        pure = bool(cfg.get("pure_low_precision", False))
        self.param_dtype = self.dtype if (self.inference_only or pure) else torch.float32
        self.sharded = False  # set by shard_fsdp() on FSDP learners
        self._gathered: dict[str, torch.Tensor] | None = None
        self.sampling = SamplingConfig(**cfg.get("sampling", {}))
        self.eval_sampling = SamplingConfig(**cfg.get("eval_sampling", cfg.get("sampling", {})))
        self.backend_name = cfg.get("backend", "hf")
        self.backend_kwargs = dict(cfg.get("backend_kwargs", {}))
        if self.backend_name not in ("hf", "vllm"):
            raise ValueError(f"model_config['backend'] must be 'hf' or 'vllm', got {self.backend_name!r}")
        self._backend: GenerationBackend | None = None
        # An EnvRunner with the vLLM backend keeps no Hugging Face copy of the policy (7B in fp32 is ~30 GB of
        # host memory): the engine holds the weights, set_state hands them straight to it, the module keeps the
        # tokenizer. The engine starts here, before training, sized to max_prompt_tokens + max_new_tokens, and only
        # where ``model_config["rollout_engine"]`` allows it: GAGPOEnvRunner sets it to False on every group's
        # local runner (the driver's or the Algorithm's process, which holds no GPU for an engine).
        self.weights_in_engine = bool(self.inference_only and self.backend_name == "vllm")
        self.engine_allowed = bool(cfg.get("rollout_engine", True))
        # Weight syncs an engine-less runner received and dropped (nothing in it samples).
        self.dropped_syncs = 0
        if self.backend_name == "vllm":
            # The engine samples in the policy's dtype: vLLM's "auto" would run a float32 checkpoint in 16 bits.
            self.backend_kwargs.setdefault("dtype", dtype_name)
        lora_cfg = cfg.get("lora") or {}
        # vLLM's own LoRA: the runners' engines keep the base and receive only the adapters.
        self.adapter_sync = (
            bool(lora_cfg) and lora_cfg.get("sync") == "adapter" and self.backend_name == "vllm"
        )
        if self.adapter_sync and self.weights_in_engine:
            rank = int(lora_cfg["rank"])
            self.backend_kwargs.setdefault("enable_lora", True)
            self.backend_kwargs.setdefault("max_loras", 1)
            self.backend_kwargs.setdefault("max_lora_rank", min(r for r in VLLM_LORA_RANKS if r >= rank))
        self.lora_scale = (int(lora_cfg["rank"]), float(lora_cfg["alpha"])) if lora_cfg else None
        if self.weights_in_engine:
            if cfg.get("max_prompt_tokens") is not None:
                longest = max(self.sampling.max_new_tokens, self.eval_sampling.max_new_tokens)
                self.backend_kwargs.setdefault("max_model_len", int(cfg["max_prompt_tokens"]) + longest)
            self.model = None
            if self.engine_allowed:
                self.tokenizer = self.backend.tokenizer
            else:
                from gagpo_rllib.policy.generation.vllm import load_rollout_tokenizer

                self.tokenizer = load_rollout_tokenizer(self.model_path)
        else:
            lora = cfg.get("lora") if not self.inference_only else None
            # Under LoRA the base is frozen (and is the reference): it is loaded in the compute dtype.
            self.model, self.tokenizer = load_policy(
                self.model_path, dtype=self.dtype if lora else self.param_dtype
            )
            if lora:
                peft_model = apply_lora(
                    self.model,
                    rank=lora["rank"],
                    alpha=lora["alpha"],
                    dropout=lora["dropout"],
                    target_modules=lora["target_modules"],
                )
                if self.param_dtype != torch.float32:  # pure_low_precision: adapters in dtype too
                    for p in self.model.parameters():
                        if p.requires_grad:
                            p.data = p.data.to(self.param_dtype)
                # Kept unregistered: it wraps self.model, whose parameters the module already holds.
                object.__setattr__(self, "_peft", peft_model)
            if not self.inference_only and cfg.get("gradient_checkpointing", False):
                # Activations are recomputed in backward: memory per token of a layer's input, not its internals.
                enable_checkpointing(self.model)
        # Learner forwards: tokens per chunk, and how many rows of reference log-probs to keep across updates.
        self.train_chunk_tokens = int(cfg.get("train_chunk_tokens", 16384))
        if self.train_chunk_tokens < 1:
            raise ValueError(
                f"model_config['train_chunk_tokens'] must be >= 1, got {self.train_chunk_tokens}"
            )
        # How a chunk's rows are laid out (``action_logprobs``): packed ("varlen") where the attention kernel
        # takes packed sequences (flash attention), else right-padded rows sorted by total length.
        self.layout = cfg.get("layout") or (
            "varlen" if self.model is not None and _varlen_attention(self.model) else "rows"
        )
        if self.layout not in LAYOUTS:
            raise ValueError(f"model_config['layout'] must be one of {LAYOUTS}, got {self.layout!r}")
        # LM-head slice (``token_scores``): None sizes it from the vocabulary.
        self.slice_tokens = cfg.get("slice_tokens")
        # Forward a prompt shared by several rows once, through the KV cache (off under checkpointing and FSDP).
        self.share_prompts = bool(cfg.get("share_prompts", True))
        self.reference_cache = ReferenceLogprobCache(int(cfg.get("reference_cache_rows", 100_000)))
        # Seconds spent in the backend so far (EnvRunners report the time split per iteration from it).
        self.generation_time_s = 0.0
        # Kept outside nn.Module registration: not a parameter, not in the state, not sent to EnvRunners.
        object.__setattr__(self, "_reference", None)
        self.reference_is_base = bool(self.lora and cfg.get("reference", True))
        if not self.inference_only and cfg.get("reference", True) and not self.lora:
            ref, _ = load_policy(self.model_path, dtype=self.dtype)
            ref.requires_grad_(False)
            object.__setattr__(self, "_reference", ref)

    # ----------------------------------------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        """Size of the logits' last dimension (may exceed ``len(tokenizer)``)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def lora(self) -> bool:
        """Whether the learner trains LoRA adapters (``model_config["lora"]``)."""
        return getattr(self, "_peft", None) is not None

    @property
    def peft_model(self) -> Any:
        """The ``PeftModel`` around ``model`` under LoRA (else None): for disabling, merging, saving adapters."""
        return getattr(self, "_peft", None)

    @property
    def reference_model(self) -> torch.nn.Module | None:
        """The frozen reference copy; None without one, and under LoRA, whose reference is ``model`` with its
        adapters disabled (``reference_context``)."""
        return self._reference

    @property
    def has_reference(self) -> bool:
        return self._reference is not None or self.reference_is_base

    def reference_context(self) -> tuple[torch.nn.Module, contextlib.AbstractContextManager]:
        """(model, context) whose forwards inside the context are the reference policy's."""
        if self.reference_is_base:
            return self.model, adapters_disabled(self._peft)
        if self._reference is None:
            raise RuntimeError("this module keeps no reference policy (model_config['reference'] is False)")
        return self._reference, contextlib.nullcontext()

    @property
    def started_backend(self) -> GenerationBackend | None:
        """The rollout backend if it was built, else None (reading ``backend`` would start an engine)."""
        return self._backend

    @property
    def backend(self) -> GenerationBackend:
        """The rollout backend, built on first use (HF shares this module's model, so weight sync is free)."""
        if self._backend is None:
            from gagpo_rllib.policy.generation import make_backend

            if self.backend_name == "hf":
                device = next(self.model.parameters()).device
                self._backend = make_backend("hf", (self.model, self.tokenizer), device=device)
            else:
                if self.weights_in_engine and not self.engine_allowed:
                    raise RuntimeError(
                        "this EnvRunner holds no vLLM engine: it is a local runner (in the driver's or the "
                        "Algorithm's process, which holds no GPU for one); vLLM samples on remote EnvRunners "
                        "(num_env_runners >= 1, evaluation_num_env_runners >= 1 for validation)"
                    )
                self._backend = make_backend("vllm", self.model_path, **self.backend_kwargs)
        return self._backend

    # ------------------------------------------------------------------------------------------------ forwards
    @staticmethod
    def _prompts(batch: dict[str, Any], sampling: SamplingConfig) -> tuple[list[str], list[list[str]] | None]:
        """The batch's prompts and, when constrained, one admissible-action list per prompt."""
        prompts = [str(p) for p in batch[Columns.PROMPTS]]
        if not sampling.constrained:
            return prompts, None
        admissible = batch.get(Columns.ADMISSIBLE)
        if admissible is None:
            raise ValueError("constrained decoding needs the batch's 'admissible' action lists")
        return prompts, [list(a) for a in admissible]

    def _generate(self, batch: dict[str, Any], sampling: SamplingConfig) -> dict[str, Any]:
        prompts, admissible = self._prompts(batch, sampling)
        start = time.perf_counter()
        outs = self.backend.generate(
            prompts, sampling=sampling, admissible=admissible, seed=batch.get(Columns.GEN_SEED)
        )
        self.generation_time_s += time.perf_counter() - start
        return _forward_columns(outs)

    def submit_generation(self, batch: dict[str, Any], keys: list[Any], *, explore: bool = True) -> None:
        """Hand the rows of ``batch`` (an env-to-module batch) to the backend as separate requests named by
        ``keys``; their answers come back from ``collect_generation`` as each ends (per-episode generation)."""
        from gagpo_rllib.policy.generation.base import GenerationRequest

        sampling = self.sampling if explore else self.eval_sampling
        prompts, admissible = self._prompts(batch, sampling)
        seeds = batch.get(Columns.GEN_SEED)
        if len(keys) != len(prompts):
            raise ValueError(f"keys: {len(keys)} keys for {len(prompts)} prompts")
        requests = [
            GenerationRequest(
                key=key,
                prompt=prompt,
                admissible=None if admissible is None else admissible[i],
                seed=None if seeds is None else int(seeds[i]),
            )
            for i, (key, prompt) in enumerate(zip(keys, prompts, strict=True))
        ]
        start = time.perf_counter()
        self.backend.submit(requests, sampling=sampling)
        self.generation_time_s += time.perf_counter() - start

    def collect_generation(self) -> tuple[list[Any], dict[str, Any]]:
        """The keys of the requests that ended and their forward outputs (the columns ``_generate`` returns)."""
        start = time.perf_counter()
        with torch.no_grad():
            answers = self.backend.collect()
        self.generation_time_s += time.perf_counter() - start
        return [k for k, _ in answers], _forward_columns([o for _, o in answers])

    def _forward_exploration(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        with torch.no_grad():
            return self._generate(batch, self.sampling)

    def _forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        with torch.no_grad():
            return self._generate(batch, self.eval_sampling)

    def compute_context(self) -> contextlib.AbstractContextManager:
        """The learner forwards' precision: autocast to ``dtype`` over fp32 masters (FSDP casts by itself)."""
        if self.param_dtype == self.dtype or self.sharded or self.model is None:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def train_chunks(self, batch: dict[str, Any]) -> list[np.ndarray]:
        """The learner's chunks of a minibatch: batch row indices per chunk of at most ``train_chunk_tokens``
        tokens, prompt and answer counted (``token_chunks``: rows sorted by total length, so padding is what
        neighbouring lengths leave). All rows of a prompt share a chunk, so repeats and shared prompts are still
        forwarded once. ``forward_train`` of one chunk's rows runs one forward."""
        prompt_ids = _numpy(batch[Columns.PROMPT_IDS])
        width = prompt_ids.shape[1]
        prompt_len = _numpy(batch[Columns.PROMPT_LEN]).tolist()
        action_len = _numpy(batch[Columns.ACTION_LEN]).tolist()
        prompts = [tuple(prompt_ids[i, width - n :].tolist()) for i, n in enumerate(prompt_len)]
        shared = unique_rows(prompts)
        rows_of: list[list[int]] = [[] for _ in shared.index]
        for row, j in enumerate(shared.inverse.tolist()):
            rows_of[j].append(row)
        units = [(len(rows), max(prompt_len[r] + action_len[r] for r in rows)) for rows in rows_of]
        return [
            np.array(sorted(r for j in chunk for r in rows_of[j]), dtype=np.int64)
            for chunk in token_chunks(units, self.train_chunk_tokens)
        ]

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        with self.compute_context():
            return self._train_outputs(batch)

    def _train_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Current log-probs (with grad), reference log-probs (no grad) and entropy of the action tokens.

        The forwards run once per distinct row (``gagpo_rllib.policy.logprobs``), in length-sorted chunks of at most
        ``train_chunk_tokens`` tokens, and the results are gathered back to the batch's rows; reference values of
        rows seen in an earlier update come from ``reference_cache``.
        """
        keys = row_keys(
            _numpy(batch[Columns.PROMPT_IDS]),
            _numpy(batch[Columns.PROMPT_LEN]).tolist(),
            _numpy(batch[Columns.ACTION_IDS]),
            _numpy(batch[Columns.ACTION_LEN]).tolist(),
            _numpy(batch[Columns.ALLOWED_IDS]) if Columns.ALLOWED_IDS in batch else None,
        )
        uniq = unique_rows(keys)
        prompts, actions, masks = unpad_token_batch(batch, self.vocab_size, rows=uniq.index)
        width = max(len(a) for a in actions)
        logp, mask, entropy = self._chunked_logprobs(self.model, prompts, actions, masks, width, True)
        inverse = uniq.inverse.to(logp.device)
        out = {
            Columns.LOGP: logp[inverse],
            Columns.MASK: mask[inverse],
            Columns.ENTROPY: entropy[inverse],
            Columns.UNIQUE_ROW_SHARE: torch.tensor(uniq.share),
        }
        if Columns.REF_LOGP in batch:  # from the update's no-grad pass (``no_grad_logprobs``)
            out[Columns.REF_LOGP] = torch.as_tensor(batch[Columns.REF_LOGP])[:, :width].to(logp.device)
            if Columns.REFERENCE_CACHE_HIT_SHARE in batch:
                hits = torch.as_tensor(batch[Columns.REFERENCE_CACHE_HIT_SHARE], dtype=torch.float32)
                out[Columns.REFERENCE_CACHE_HIT_SHARE] = hits.mean() if len(hits) else torch.tensor(0.0)
        elif self.has_reference:
            ref_logp, hit_share = self._reference_logprobs(uniq.keys, prompts, actions, masks, width)
            out[Columns.REF_LOGP] = ref_logp[inverse]
            out[Columns.REFERENCE_CACHE_HIT_SHARE] = torch.tensor(hit_share)
        return out

    def no_grad_logprobs(
        self,
        prompts: list[list[int]],
        actions: list[list[int]],
        masks: list[torch.Tensor | None] | None,
        *,
        policy: bool,
        reference: bool,
    ) -> tuple[dict[str, list[list[float]]], float]:
        """The update's one pass without grad, before its first step: per row, the current policy's log-probs
        (``policy``: the ratio's old log-probs) and the reference's (``reference``: the KL term's, for every
        minibatch and epoch of the update), over the same distinct rows and chunks as training.

        Returns ({Columns.OLD_LOGP: ..., Columns.REF_LOGP: ...} as asked, reference cache hit share). Under FSDP
        every learner runs as many forwards (each is a collective).
        """
        out: dict[str, list[list[float]]] = {}
        if not (policy or reference) or (not prompts and not self.sharded):
            return out, 0.0  # under FSDP a learner without rows still joins every forward
        keys = row_keys_of(prompts, actions, masks)
        uniq = unique_rows(keys)
        u_prompts = [prompts[i] for i in uniq.index]
        u_actions = [actions[i] for i in uniq.index]
        u_masks = [masks[i] for i in uniq.index] if masks is not None else None
        width = max((len(a) for a in u_actions), default=1)
        inverse = uniq.inverse.tolist()
        lengths = [len(a) for a in actions]

        def rows(values: torch.Tensor) -> list[list[float]]:
            values = values.float().cpu()
            return [values[j, :n].tolist() for j, n in zip(inverse, lengths, strict=True)]

        hit_share = 0.0
        with torch.no_grad(), self.compute_context():
            if policy:
                logp, _, _ = self._chunked_logprobs(
                    self.model, u_prompts, u_actions, u_masks, width, False, collective=True
                )
                out[Columns.OLD_LOGP] = rows(logp)
            if reference:
                ref, hit_share = self._reference_logprobs(
                    uniq.keys, u_prompts, u_actions, u_masks, width, collective=True
                )
                out[Columns.REF_LOGP] = rows(ref)
        return out, hit_share

    def _reference_logprobs(
        self,
        keys: list[bytes],
        prompts: list[list[int]],
        actions: list[list[int]],
        masks: list[torch.Tensor | None] | None,
        width: int,
        *,
        collective: bool = False,
    ) -> tuple[torch.Tensor, float]:
        """Reference log-probs [U, width] of the distinct rows (cached rows gathered, the others computed) and
        the share of them the cache held."""
        model, context = self.reference_context()
        device = next(self.model.parameters()).device
        if next(model.parameters()).device != device:
            model.to(device)
        cache = self.reference_cache
        missing = cache.missing(keys)
        todo = set(missing)
        hit = [j for j in range(len(keys)) if j not in todo]
        ref = torch.zeros((len(keys), width), dtype=torch.float32, device=device)
        if hit:
            ref[hit] = cache.gather([keys[j] for j in hit], width, device)
        if missing or (collective and self.sharded):  # FSDP: a learner with nothing to do still joins
            sub = [masks[j] for j in missing] if masks is not None else None
            with torch.no_grad(), context:
                values, _, _ = self._chunked_logprobs(
                    model,
                    [prompts[j] for j in missing],
                    [actions[j] for j in missing],
                    sub,
                    width,
                    False,
                    collective=collective,
                )
            if missing:
                ref[missing] = values.float()
                cache.put([keys[j] for j in missing], values, [len(actions[j]) for j in missing])
        return ref, len(hit) / max(1, len(keys))

    def _chunked_logprobs(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        actions: list[list[int]],
        masks: list[torch.Tensor | None] | None,
        width: int,
        with_entropy: bool,
        *,
        collective: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Log-probs of the rows over chunks of at most ``train_chunk_tokens`` tokens (``token_chunks``), back in
        row order and right-padded to ``width``.

        Without gradient checkpointing and FSDP, a prompt shared by several rows (one state, different actions) is
        forwarded once (``shared_prompt_logprobs``, through the KV cache); otherwise every row is its prompt and
        answer (``action_logprobs``, laid out as ``self.layout``). ``collective`` (FSDP): every learner runs as
        many forwards, a learner with fewer chunks adding one-token stand-ins.
        """
        shared = unique_rows([tuple(p) for p in prompts])
        prompt_of = shared.inverse.tolist()
        distinct = [prompts[i] for i in shared.index]
        rows_of: list[list[int]] = [[] for _ in distinct]
        for row, j in enumerate(prompt_of):
            rows_of[j].append(row)
        # Sharing needs the KV cache, which gradient checkpointing turns off; under FSDP every learner must run
        # the same number of forwards, and sharing skips the prompt forward of one-token prompts.
        share = self.share_prompts and not checkpointing(model) and not self.sharded
        common = dict(
            pad_token_id=self.pad_token_id,
            temperature=self.sampling.temperature,
            with_entropy=with_entropy,
            slice_tokens=self.slice_tokens,
        )
        units = [(len(r), max(len(distinct[j]) + len(actions[i]) for i in r)) for j, r in enumerate(rows_of)]
        chunks = token_chunks(units, self.train_chunk_tokens) if prompts else []
        rounds = self.forward_rounds(len(chunks)) if collective else len(chunks)
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        order: list[int] = []
        for chunk in chunks:
            rows = [row for j in chunk for row in rows_of[j]]
            sub = [masks[r] for r in rows] if masks is not None else None
            if share:
                local = {j: k for k, j in enumerate(chunk)}
                out = shared_prompt_logprobs(
                    model,
                    [distinct[j] for j in chunk],
                    [local[prompt_of[r]] for r in rows],
                    [actions[r] for r in rows],
                    allowed_masks=sub,
                    **common,
                )
            else:
                out = action_logprobs(
                    model,
                    [prompts[r] for r in rows],
                    [actions[r] for r in rows],
                    allowed_masks=sub,
                    layout=self.layout,
                    **common,
                )
            parts.append(tuple(_pad_right(t, width) if t is not None else None for t in out))
            order += rows
        for _ in range(rounds - len(chunks)):  # FSDP stand-ins: keep this learner in the collectives
            action_logprobs(model, [[self.pad_token_id]], [[self.pad_token_id]], **common)
        device = next(self.model.parameters()).device
        if not parts:
            empty = torch.zeros((0, width), device=device)
            return empty, empty, empty if with_entropy else None
        back = back_in_order(order).to(parts[0][0].device)
        logp = torch.cat([p[0] for p in parts])[back]
        mask = torch.cat([p[1] for p in parts])[back]
        entropy = torch.cat([p[2] for p in parts])[back] if with_entropy else None
        return logp, mask, entropy

    # ---------------------------------------------------------------------------------------------------- FSDP
    def fsdp_parts(self) -> list[torch.nn.Module]:
        """The trained models FSDP shards (each with its decoder layers); a critic adds its own."""
        return [self.model]

    def shard_fsdp(self) -> None:
        """Shard the trained models and the reference over the learners (``gagpo_rllib.policy.fsdp``).

        The reference cache is turned off: which rows it holds differs per learner, and so would the number of
        reference forwards, each a collective under FSDP.
        """
        from gagpo_rllib.policy import fsdp

        for part in self.fsdp_parts():
            fsdp.shard(part, compute_dtype=self.dtype)
        if self._reference is not None:
            self._reference.to(next(self.model.parameters()).device)
            fsdp.shard(self._reference, compute_dtype=self.dtype, frozen=True)
        if self.reference_cache.max_rows:
            logger.info("FSDP learner: reference log-prob cache off (its hits differ per learner)")
        self.reference_cache = ReferenceLogprobCache(0)
        self.sharded = True

    def forward_rounds(self, count: int) -> int:
        """How many forwards to run for ``count`` of this learner's: ``count``, or under FSDP, where each forward
        is a collective, the largest count over the learners (itself a collective: call it before any forward)."""
        if not self.sharded:
            return count
        return int(agree_max(count, next(self.model.parameters()).device))

    def set_gradient_sync(self, enabled: bool) -> None:
        """FSDP: reduce the gradients in this backward (the step's last chunk) or accumulate them."""
        from gagpo_rllib.policy.fsdp import set_gradient_sync

        for part in self.fsdp_parts():
            set_gradient_sync(part, enabled)

    def gather_full_state(self) -> None:
        """FSDP: gather the full weights to learner 0, where ``get_state`` serves them (a checkpoint). A
        collective. The weight sync does not need it: it gathers one bucket at a time (``weight_sync``)."""
        from gagpo_rllib.policy.fsdp import full_model_state

        self._gathered = full_model_state(self)

    def release_full_state(self) -> None:
        """FSDP: drop the gathered host copy (the whole model in float32 on learner 0) once it has served."""
        self._gathered = None

    # ----------------------------------------------------------------------------------------------- state sync
    def get_state(self, *args: Any, inference_only: bool = False, **kwargs: Any) -> dict[str, Any]:
        """RLlib's state; ``inference_only`` (what EnvRunners receive): without learner-only parts, weights cast
        to the rollout ``dtype``. bfloat16 tensors, which numpy cannot hold, stay CPU tensors."""
        if self.lora and not self.sharded:
            state = self._lora_tensors(inference_only)
        elif inference_only and not self.inference_only:
            # Cast where the weights live (on a GPU: before the copy to the host).
            state = {
                k: (v.detach().to(self.dtype) if v.is_floating_point() else v.detach()).cpu()
                for k, v in self.inference_tensors()
            }
        else:
            state = {k: v.detach().cpu() for k, v in self._full_tensors().items()}
        if any(v.dtype == torch.bfloat16 for v in state.values()):
            return state
        return convert_to_numpy(state)

    def inference_tensors(self, *, shards: bool = False) -> list[tuple[str, torch.Tensor]]:
        """What EnvRunners load, as (name, tensor) pairs where the weights live and in their own dtype (the
        sender casts them to ``dtype`` on the way): the policy without learner-only parts; under LoRA the
        adapters (adapter sync) or the merged policy, already in ``dtype``. ``shards`` (FSDP): this learner's
        sharded tensors (DTensors with the full shape), which every learner gathers together tensor by tensor,
        instead of the gathered host copy."""
        if self.lora and not self.sharded:
            return list(self._lora_tensors(True).items())
        if self.sharded and shards:
            state = {k: v.detach() for k, v in self.state_dict().items()}
        else:
            state = self._full_tensors()
        if not self.inference_only and isinstance(self, InferenceOnlyAPI):
            learner_only = tuple(self.get_non_inference_attributes())
            return [
                (k, v)
                for k, v in state.items()
                if not any(k == a or k.startswith(a + ".") for a in learner_only)
            ]
        return list(state.items())

    def _full_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the state: the gathered host copy under FSDP, the module's own otherwise."""
        if not self.sharded:
            return {k: v.detach() for k, v in self.state_dict().items()}
        if not self._gathered:
            raise RuntimeError(
                "FSDP learner: the full weights are gathered on learner 0 only, by gather_full_state on every "
                "learner (GAGPO.save_to_path does); get_state was called on another learner or before a gather"
            )
        return dict(self._gathered)

    def nonfinite_weights(self) -> list[str]:
        """Names of the floating-point weights holding a NaN or an infinity, checked where the weights live
        (on a GPU one host sync for the whole model; under FSDP this learner's shards)."""
        named = [
            (n, p) for n, p in self.state_dict(keep_vars=True).items() if p.is_floating_point() and p.numel()
        ]
        if not named:
            return []
        local = [p.to_local() if hasattr(p, "to_local") else p for _, p in named]
        with torch.no_grad():
            finite = torch.stack([torch.isfinite(p).all() for p in local]).cpu()
        return [n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok]

    def _lora_tensors(self, inference_only: bool) -> dict[str, torch.Tensor]:
        """Under LoRA, ``inference_only`` (what EnvRunners load, in the rollout dtype): the policy's adapters for
        vLLM engines with adapter sync, else the merged policy under Hugging Face names. Otherwise (checkpoints)
        only the trained parameters (adapters, a critic's head): the base never changes."""
        if inference_only and self.adapter_sync:
            return {
                _POLICY_PREFIX + k: v.detach().cpu().to(self.dtype)
                for k, v in self.model.named_parameters()
                if ".lora_" in k
            }
        if inference_only:
            return {_POLICY_PREFIX + k: v.to(self.dtype) for k, v in merged_state(self.model).items()}
        keep = trainable_names(self)
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if k in keep}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Load new weights and push them to the rollout backend (a no-op copy for HF, which shares the model).

        With the weights in a vLLM engine, the policy's tensors (this module's ``model.`` names minus that prefix:
        the Hugging Face names) go to the engine one at a time, in its dtype; nothing else keeps a copy. ``state``
        may be any mapping (the weight sync's lazily fetched buckets): it is read in its own key order.
        """
        if self.weights_in_engine:
            if self._backend is None:  # an engine-less local runner: nothing here samples, keep nothing
                self.dropped_syncs += 1
                return
            names = [k for k in state if k.startswith(_POLICY_PREFIX)]
            adapters = [k for k in names if ".lora_" in k]
            if adapters:  # LoRA with adapter sync: the engine keeps its base weights
                rank, alpha = self.lora_scale
                self.backend.update_lora(
                    {k[len(_POLICY_PREFIX) :]: state[k] for k in adapters}, rank=rank, alpha=alpha
                )
            elif names:
                self.backend.update_weights((k[len(_POLICY_PREFIX) :], state[k]) for k in names)
            return
        if not isinstance(state, dict):
            state = dict(state.items())
        if self.sharded:
            from gagpo_rllib.policy.fsdp import load_full_model_state

            load_full_model_state(self, state)  # every learner loads (a collective)
        else:
            if self.lora:
                missing = sorted(trainable_names(self) - set(state))
                if missing:
                    raise ValueError(
                        f"LoRA learner: the state lacks {len(missing)} trained parameters (e.g. {missing[:3]}); "
                        "it was not saved by a LoRA run with the same lora_rank / lora_target_modules"
                    )
            super().set_state(state)
        if self._backend is not None:
            if self.backend_name != "hf":
                self._backend.update_weights(self.model.state_dict())
            self._backend.reset_cache()


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer in backward (non-reentrant; named activation_checkpointing in newer
    transformers, gradient_checkpointing before)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def unpad_token_batch(
    batch: dict[str, Any], vocab_size: int, rows: list[int] | None = None
) -> tuple[list[list[int]], list[list[int]], list[torch.Tensor | None] | None]:
    """Turn the learner batch's padded token tensors back into per-step lists (and allowed-token masks).

    Layout (written by the grouped-advantage connector): ``prompt_ids`` [B, P] left-padded with ``prompt_len``;
    ``action_ids`` [B, A] right-padded with ``action_len``; optional ``allowed_ids`` [B, A, K] holding, per action
    position, the allowed token ids padded with -1. ``rows`` selects (and orders) the rows returned; None: all.
    """
    prompt_ids = torch.as_tensor(batch[Columns.PROMPT_IDS])
    prompt_len = torch.as_tensor(batch[Columns.PROMPT_LEN])
    action_ids = torch.as_tensor(batch[Columns.ACTION_IDS])
    action_len = torch.as_tensor(batch[Columns.ACTION_LEN])
    allowed = torch.as_tensor(batch[Columns.ALLOWED_IDS]) if Columns.ALLOWED_IDS in batch else None
    if rows is not None:
        pick = torch.as_tensor(rows, dtype=torch.long)
        prompt_ids, prompt_len, action_ids, action_len = (
            t[pick] for t in (prompt_ids, prompt_len, action_ids, action_len)
        )
        allowed = allowed[pick] if allowed is not None else None
    prompt_len, action_len = prompt_len.tolist(), action_len.tolist()
    width = prompt_ids.shape[1]
    prompts = [prompt_ids[i, width - n :].tolist() for i, n in enumerate(prompt_len)]
    actions = [action_ids[i, :n].tolist() for i, n in enumerate(action_len)]
    masks = None
    if allowed is not None:
        # one scatter for the whole batch: padding (-1) goes to an extra column that is dropped
        ids = torch.where(allowed >= 0, allowed, vocab_size).long()
        every = torch.zeros((*ids.shape[:2], vocab_size + 1), dtype=torch.bool)
        every.scatter_(-1, ids, True)
        masks = [every[i, :n, :vocab_size] for i, n in enumerate(action_len)]
    return prompts, actions, masks


def _varlen_attention(model: torch.nn.Module) -> bool:
    """Whether the model's attention kernel runs packed sequences without a dense mask (flash attention)."""
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    return impl.startswith("flash")


def _numpy(column: Any) -> np.ndarray:
    return column.detach().cpu().numpy() if isinstance(column, torch.Tensor) else np.asarray(column)


def _pad_right(t: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] -> [n, width] with zeros (masked positions) on the right."""
    return t if t.shape[1] == width else torch.nn.functional.pad(t, (0, width - t.shape[1]))
