"""The paper's training set-up (Qwen2.5-1.5B-Instruct), shared by its ALFWorld and WebShop configurations.

The two benchmarks use the same hyperparameters: groups of 8, 16 groups per iteration, gamma = lam = 0.95, KL 0.01
to the reference, entropy 0.001, lr 1e-6, free-form answers of up to 512 tokens, and validation every 5 iterations
at temperature 0.4. Only the environment, its horizon and its prompt budget differ. On GPUs the rollouts run on
vLLM in bf16 and the learners train fp32 master weights with bf16 compute and gradient checkpointing; the GPUs
are split by ``gpu_plan`` (a whole GPU per NCCL learner; a validation EnvRunner of its own beside the training
runners). ``GAGPO_LEARNER_SHARDING=fsdp`` shards the learners (FSDP2) instead of
replicating them (DDP), which the 7B model needs on 80 GB GPUs (``benchmarks/bench_memory.py``).
"""

from __future__ import annotations

import math
import os
from typing import Any

from gagpo_rllib.rllib.config import GAGPOConfig
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation

__all__ = ["count_from_env", "gpu_plan", "paper_config", "scale_out_from_env", "sharding_from_env"]

TRAIN_ENGINE_MEMORY = 0.4  # share of a GPU for the training rollouts' vLLM engine
VALID_ENGINE_MEMORY = 0.15  # and for the validation engine, which plays beside it
VALID_GPU_SHARE = 0.2  # of each training runner's GPU share, left for the validation runner's placement


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
    from gagpo_rllib.rllib.config import SHARDINGS

    value = os.environ.get("GAGPO_LEARNER_SHARDING", "ddp")
    if value not in SHARDINGS:
        raise ValueError(f"GAGPO_LEARNER_SHARDING: one of {SHARDINGS}, got {value!r}")
    return value


def gpu_plan(num_gpus: int, num_learners: int, num_env_runners: int) -> tuple[float, float, float]:
    """GPUs per learner, per training EnvRunner and for the one validation EnvRunner.

    Two or more learners: a whole GPU each (NCCL refuses two ranks on one device), the GPUs left for the
    runners. Otherwise the local or single learner and the runners split the GPUs evenly. A share is 1/k of a
    GPU (k slots per GPU), so Ray can pack the actors exactly; each runner keeps a fifth of its share free for the
    validation runner, which fits beside any of them. Raises ValueError naming the variables when it cannot fit.
    """
    if num_gpus <= 0:
        return 0.0, 0.0, 0.0
    if num_env_runners < 1:
        raise ValueError(
            f"GAGPO_NUM_ENV_RUNNERS={num_env_runners} with GAGPO_GPUS={num_gpus}: the vLLM rollouts run on remote"
            " EnvRunners only (one with a GPU share at least); set GAGPO_NUM_ENV_RUNNERS >= 1"
        )
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


def _engine(memory: float) -> dict:
    """vLLM engine arguments: a share of the GPU's memory, bf16 weights."""
    return {"gpu_memory_utilization": memory, "dtype": "bfloat16"}


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
    seed: int = 0,
) -> GAGPOConfig:
    """The paper's set-up on ``env``; ``num_gpus`` None reads ``GAGPO_GPUS`` (0: CPU, HF rollouts, float32),
    ``learner_sharding`` None reads ``GAGPO_LEARNER_SHARDING``."""
    gpus = count_from_env("GAGPO_GPUS", 0, "the number of GPUs") if num_gpus is None else num_gpus
    sharding = sharding_from_env() if learner_sharding is None else learner_sharding
    on_gpu = gpus > 0
    per_learner, per_runner, per_valid = gpu_plan(gpus, num_learners, num_env_runners)
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
            backend_kwargs=_engine(TRAIN_ENGINE_MEMORY) if on_gpu else {},
        )
        .learners(learner_sharding=sharding)
        .debugging(seed=seed)
    )
    return with_validation(
        config,
        split=valid_split,
        interval=5,
        settings=EvalSettings(split=valid_split, seed=seed),
        **(
            {"backend_kwargs": _engine(VALID_ENGINE_MEMORY), "num_gpus_per_env_runner": per_valid}
            if on_gpu
            else {}
        ),
    )
