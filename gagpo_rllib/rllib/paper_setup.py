"""The paper's training set-up (Qwen2.5-1.5B-Instruct), shared by its ALFWorld and WebShop configurations.

The two benchmarks use the same hyperparameters: groups of 8, 16 groups per iteration, gamma = lam = 0.95, KL 0.01
to the reference, entropy 0.001, lr 1e-6, free-form answers of up to 512 tokens, and validation every 5 iterations
at temperature 0.4. Only the environment, its horizon and its prompt budget differ. On GPUs the rollouts run on
vLLM in bf16 and the learners train fp32 master weights with bf16 compute and gradient checkpointing.

The GPUs are shared by default (``GAGPO_COLOCATE=1``, ``gpu_plan(colocate=True)``): each GPU holds one learner and
one training engine, the engines asleep during the update (weights to host memory, KV cache freed), so every GPU
works in both phases; the validation runner's engine sits beside one of them, sized from the model
(``colocated_memory``: its weights and a KV cache, never a fixed slice smaller than the weights). ``GAGPO_COLOCATE=0``
gives the learners whole GPUs and the engines the GPUs left. ``GAGPO_LEARNER_SHARDING=fsdp`` shards the learners
(FSDP2) instead of replicating them (DDP), which the 7B model needs on 80 GB GPUs (``benchmarks/bench_memory.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from gagpo_rllib.rllib.config import GAGPOConfig
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation

__all__ = [
    "ColocatedMemory",
    "colocated_memory",
    "count_from_env",
    "decoder_param_count",
    "gpu_plan",
    "model_param_count",
    "paper_config",
    "scale_out_from_env",
    "sharding_from_env",
]

TRAIN_ENGINE_MEMORY = 0.4  # share of a GPU for the training rollouts' vLLM engine (separate placement)
VALID_ENGINE_MEMORY = 0.15  # and for the validation engine, which plays beside it
VALID_GPU_SHARE = 0.2  # of each training runner's GPU share, left for the validation runner's placement
# Colocated: a learner's share is over half a GPU, so two learners (NCCL ranks) never land on one GPU and the
# runners fill what the learners leave, one training engine beside each learner.
COLOCATED_LEARNER_SHARE = 0.51
GIB = 1024**3
# Per-process GPU memory outside the tensors (CUDA context, allocator slack), and an engine's own working memory
# (activations, sampler, CUDA graphs) beyond its weights and KV cache.
CUDA_CONTEXT_GIB = 1.0
ENGINE_WORKING_GIB = 1.5
# What a learner holds per parameter through the rollout: fp32 weights, fp32 gradients, Adam's two fp32 moments and
# the bf16 reference (measured against this in benchmarks/bench_memory.py).
LEARNER_STATE_BYTES_PER_PARAM = 4 + 4 + 8 + 2
# KV cache the colocated engines need at least (training, validation), and how the rest is shared (training 2/3).
MIN_KV_GIB = (4.0, 1.0)
TRAIN_KV_SHARE = 2 / 3


def count_from_env(name: str, default: int, what: str) -> int:
    """The environment variable ``name`` (unset: ``default``) as a count, an error naming it when it is not a
    whole number >= 0 (``int()`` alone would give a bare "invalid literal" error, and a negative count a bad set-up)."""
    raw = os.environ.get(name, str(default))
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"{name}: {what}, an int >= 0, got {raw!r}")
    return count


def scale_out_from_env() -> tuple[int, int]:
    """(remote learners, EnvRunners) from ``GAGPO_NUM_LEARNERS`` (unset: 0) and ``GAGPO_NUM_ENV_RUNNERS`` (unset: 1),
    the counts the paper-setup tuned examples scale out to (README "Scaling out")."""
    return (
        count_from_env("GAGPO_NUM_LEARNERS", 0, "the number of remote learners"),
        count_from_env("GAGPO_NUM_ENV_RUNNERS", 1, "the number of EnvRunners"),
    )


def sharding_from_env() -> str:
    """``GAGPO_LEARNER_SHARDING`` (unset: "ddp"): how the paper-setup learners hold the model, "ddp" or "fsdp"."""
    from gagpo_rllib.rllib.fields import SHARDINGS

    value = os.environ.get("GAGPO_LEARNER_SHARDING", "ddp")
    if value not in SHARDINGS:
        raise ValueError(f"GAGPO_LEARNER_SHARDING: one of {SHARDINGS}, got {value!r}")
    return value


def gpu_plan(
    num_gpus: int, num_learners: int, num_env_runners: int, *, colocate: bool = False
) -> tuple[float, float, float]:
    """GPUs per learner, per training EnvRunner and for the one validation EnvRunner.

    ``colocate``: every GPU holds at most one learner (a share over half a GPU) and the runners share what the
    learners leave (ceil(runners / GPUs) per GPU), so with as many runners as GPUs each learner has an engine
    beside it. Otherwise two or more learners get a whole GPU each (NCCL refuses two ranks on one device), the GPUs
    left go to the runners, and a local or single learner and the runners split the GPUs evenly. A runner's share
    is 1/k of what is free, so Ray can pack the actors exactly; each runner keeps a fifth of its share free for
    the validation runner, which fits beside any of them. Raises ValueError naming the variables when it cannot
    fit.
    """
    if num_gpus <= 0:
        return 0.0, 0.0, 0.0
    if num_env_runners < 1:
        raise ValueError(
            f"GAGPO_NUM_ENV_RUNNERS={num_env_runners} with GAGPO_GPUS={num_gpus}: the vLLM rollouts run on remote"
            " EnvRunners only (one with a GPU share at least); set GAGPO_NUM_ENV_RUNNERS >= 1"
        )
    if colocate:
        if num_learners > num_gpus:
            raise ValueError(
                f"GAGPO_GPUS={num_gpus} with GAGPO_NUM_LEARNERS={num_learners} and GAGPO_COLOCATE=1: one learner per"
                f" GPU at most (NCCL refuses two ranks on one device); use GAGPO_NUM_LEARNERS <= {num_gpus}"
            )
        runner = (1.0 - COLOCATED_LEARNER_SHARE) / math.ceil(num_env_runners / num_gpus)
        return COLOCATED_LEARNER_SHARE, runner * (1 - VALID_GPU_SHARE), runner * VALID_GPU_SHARE
    if num_learners >= 2:
        left = num_gpus - num_learners
        if left < 1:
            raise ValueError(
                f"GAGPO_GPUS={num_gpus} with GAGPO_NUM_LEARNERS={num_learners}: each NCCL learner needs a whole GPU"
                f" and the {num_env_runners} EnvRunner(s) at least one more ({num_learners + 1} GPUs); use"
                f" GAGPO_NUM_LEARNERS <= {max(0, num_gpus - 1)} or more GPUs"
            )
        learner = 1.0
        runner = 1.0 / math.ceil(num_env_runners / left)
    else:
        learner = runner = 1.0 / math.ceil((1 + num_env_runners) / num_gpus)
    return learner, runner * (1 - VALID_GPU_SHARE), runner * VALID_GPU_SHARE


def _engine(memory: float, *, sleep: bool = False) -> dict:
    """vLLM engine arguments: a share of the GPU's memory, bf16 weights (and sleep mode when engines sleep)."""
    return {
        "gpu_memory_utilization": memory,
        "dtype": "bfloat16",
        **({"enable_sleep_mode": True} if sleep else {}),
    }


def decoder_param_count(
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    tied: bool,
    head_dim: int | None = None,
) -> int:
    """Parameters of a Qwen2-layout decoder: per layer attention (q, k, v with biases, o), a gated MLP and two
    norms; the embeddings, the final norm, and the output head unless tied (a Llama-like model without q/k/v biases
    has that many fewer)."""
    kv = kv_heads * (head_dim or hidden // heads)
    per_layer = (
        hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden + 3 * hidden * intermediate
    )
    return layers * (per_layer + 2 * hidden) + vocab * hidden * (1 if tied else 2) + hidden


def model_param_count(model_path: str) -> int:
    """``decoder_param_count`` of the model's ``config.json`` (a local folder or a cached hub id; nothing is
    downloaded)."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"model_path {model_path!r}: cannot read its config.json to size the colocated engines ({err}); use a "
            "local model folder or set GAGPO_COLOCATE=0"
        ) from err
    heads = cfg.num_attention_heads
    return decoder_param_count(
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.intermediate_size,
        heads,
        getattr(cfg, "num_key_value_heads", None) or heads,
        cfg.vocab_size,
        bool(getattr(cfg, "tie_word_embeddings", False)),
        getattr(cfg, "head_dim", None),
    )


@dataclass(frozen=True)
class ColocatedMemory:
    """One GPU of a colocated plan during the rollout, in GiB: the learner's resident state, the training engine
    and the validation engine (weights + KV cache + working memory each), the processes' CUDA contexts. During
    the update the engines sleep and the learner adds its activations (``benchmarks/bench_memory.py``)."""

    gpu_gib: float
    learner_state_gib: float
    weights_gib: float
    train_kv_gib: float
    valid_kv_gib: float
    train_engine_share: float
    valid_engine_share: float

    @property
    def rollout_gib(self) -> float:
        engines = (self.train_engine_share + self.valid_engine_share) * self.gpu_gib
        return self.learner_state_gib + engines + 3 * CUDA_CONTEXT_GIB


def colocated_memory(params: int, *, num_learners: int, sharding: str, gpu_gib: float) -> ColocatedMemory:
    """Size the colocated engines of one GPU (the one that also holds the validation engine): the learner keeps
    its fp32 weights, gradients and Adam moments and the bf16 reference (4P + 4P + 8P + 2P bytes, over the learners
    under FSDP) through the rollout; each engine holds the bf16 weights (2P), its working memory and a KV cache;
    what is left after the minimum KV caches goes to the caches, 2/3 to the training engine. Raises ValueError
    naming what does not fit."""
    shards = max(1, num_learners) if sharding == "fsdp" else 1
    state = LEARNER_STATE_BYTES_PER_PARAM * params / shards / GIB
    weights = 2 * params / GIB
    fixed = state + 3 * CUDA_CONTEXT_GIB + 2 * (weights + ENGINE_WORKING_GIB)
    spare = gpu_gib - fixed - sum(MIN_KV_GIB)
    if spare < 0:
        raise ValueError(
            f"colocated plan: a {params / 1e9:.2f}B model does not fit a {gpu_gib:.0f} GiB GPU: learner state "
            f"{state:.1f} GiB ({sharding}, {shards} shard(s)) + 2 engines x {weights:.1f} GiB of weights + KV caches "
            f"of at least {MIN_KV_GIB[0]:.0f} + {MIN_KV_GIB[1]:.0f} GiB + working memory = "
            f"{fixed + sum(MIN_KV_GIB):.1f} GiB; shard the learners (GAGPO_LEARNER_SHARDING=fsdp), use more GPUs "
            "or GAGPO_COLOCATE=0"
        )
    train_kv = MIN_KV_GIB[0] + TRAIN_KV_SHARE * spare
    valid_kv = MIN_KV_GIB[1] + (1 - TRAIN_KV_SHARE) * spare
    return ColocatedMemory(
        gpu_gib=gpu_gib,
        learner_state_gib=state,
        weights_gib=weights,
        train_kv_gib=train_kv,
        valid_kv_gib=valid_kv,
        # vLLM's gpu_memory_utilization is a share of the GPU's total memory; rounded down, never over.
        train_engine_share=math.floor((weights + ENGINE_WORKING_GIB + train_kv) / gpu_gib * 1000) / 1000,
        valid_engine_share=math.floor((weights + ENGINE_WORKING_GIB + valid_kv) / gpu_gib * 1000) / 1000,
    )


def paper_config(
    env: Any,
    env_config: dict,
    *,
    model_path: str,
    max_steps: int,
    max_prompt_tokens: int,
    valid_split: str,
    num_learners: int,
    num_env_runners: int,
    num_gpus: int | None = None,
    learner_sharding: str | None = None,
    colocate: bool | None = None,
    seed: int = 0,
) -> GAGPOConfig:
    """The paper's set-up on ``env``; ``num_gpus`` None reads ``GAGPO_GPUS`` (0: CPU, HF rollouts, float32),
    ``learner_sharding`` None reads ``GAGPO_LEARNER_SHARDING``, ``colocate`` None reads ``GAGPO_COLOCATE`` (1
    unless set: learners and engines share every GPU, the engines sized by ``colocated_memory`` for a GPU of
    ``GAGPO_GPU_MEMORY_GIB`` GiB, 80 GB = 74 GiB unless set)."""
    gpus = count_from_env("GAGPO_GPUS", 0, "the number of GPUs") if num_gpus is None else num_gpus
    sharding = sharding_from_env() if learner_sharding is None else learner_sharding
    on_gpu = gpus > 0
    shared = (
        bool(count_from_env("GAGPO_COLOCATE", 1, "1 to share every GPU, 0 not to"))
        if colocate is None
        else colocate
    )
    shared = shared and on_gpu
    per_learner, per_runner, per_valid = gpu_plan(gpus, num_learners, num_env_runners, colocate=shared)
    train_memory, valid_memory = TRAIN_ENGINE_MEMORY, VALID_ENGINE_MEMORY
    if shared:
        gpu_gib = count_from_env("GAGPO_GPU_MEMORY_GIB", 74, "GiB of memory per GPU")
        plan = colocated_memory(
            model_param_count(model_path), num_learners=num_learners, sharding=sharding, gpu_gib=gpu_gib
        )
        train_memory, valid_memory = plan.train_engine_share, plan.valid_engine_share
    # RLlib gives a GPU learner 0 CPUs, which leaves its host work (casts, copies, checks) one torch thread; its
    # bundle takes GAGPO_CPUS_PER_LEARNER CPUs instead (threads.py sets torch's threads from them).
    learner_cpus = count_from_env("GAGPO_CPUS_PER_LEARNER", 4, "CPUs per GPU learner") if on_gpu else None
    config = (
        GAGPOConfig()
        .environment(env, env_config=dict(env_config))
        .env_runners(num_env_runners=num_env_runners, num_gpus_per_env_runner=per_runner)
        .learners(num_learners=num_learners, num_gpus_per_learner=per_learner)
        .learners(**({"num_cpus_per_learner": learner_cpus} if learner_cpus else {}))
        .llm(
            model_path=model_path,
            history_length=2,
            temperature=1.0,
            eval_temperature=0.4,
            max_new_tokens=512,
            max_prompt_tokens=max_prompt_tokens,
            constrained_decoding=False,
            dtype="bfloat16" if on_gpu else "float32",
        )
        .gagpo(
            estimator="gagpo",
            group_size=8,
            groups_per_iteration=16,
            max_steps=max_steps,
            gamma=0.95,
            lam=0.95,
        )
        .training(lr=1e-6, num_epochs=1, minibatch_size=64, grad_clip=1.0, kl_coeff=0.01, entropy_coeff=0.001)
        # The PPO baseline's pretrained critic trains at verl-agent's critic rate (10x the actor's).
        .training(critic_lr=1e-5)
        .env_runners(
            backend="vllm" if on_gpu else "hf",
            backend_kwargs=_engine(train_memory, sleep=shared) if on_gpu else {},
        )
        .learners(learner_sharding=sharding)
        # Colocated: the engines free the GPU for the update (engine_sleep.py).
        .env_runners(sleep_engines_during_update=shared)
        .debugging(seed=seed)
    )
    return with_validation(
        config,
        split=valid_split,
        interval=5,
        settings=EvalSettings(split=valid_split, seed=seed),
        # On GPUs the validation engine plays beside training; its metrics arrive an iteration or more later.
        background=on_gpu,
        **(
            {"backend_kwargs": _engine(valid_memory, sleep=shared), "num_gpus_per_env_runner": per_valid}
            if on_gpu
            else {}
        ),
    )
