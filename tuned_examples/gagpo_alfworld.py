"""GAGPO on ALFWorld: the paper's set-up when a model is given, the embedded CPU default otherwise.

With ``GAGPO_MODEL=/path/to/Qwen2.5-1.5B-Instruct`` (or ``--model``) this is the paper's configuration:
16 games x 8 rollouts per iteration, at most 50 steps, history 2, gamma 0.95, lr 1e-6, k3 KL 0.01 to the initial
model, sampling at temperature 1.0, free-form ``<think>/<action>`` answers, vLLM rollouts and bf16 on a GPU
(``GAGPO_GPUS`` GPUs; the Hugging Face backend and float32 without one), and validation every 5 iterations on
all of valid_unseen at temperature 0.4 (``evaluation/valid/...`` in the results; ``rllib evaluate`` does the
same on a checkpoint).

Without a model it is the embedded CPU default: a tiny random-init policy whose tokenizer is trained on texts of the
bundled games, constrained decoding over the admissible commands, 4 games x 4 rollouts, 30 steps, 5 iterations,
then a validation on 6 valid_unseen games.

    rllib train file tuned_examples/gagpo_alfworld.py --stop '{"training_iteration": 2}'
    GAGPO_MODEL=/models/Qwen2.5-1.5B-Instruct python tuned_examples/gagpo_alfworld.py --iterations 150
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from envs.alfworld import TASK_TYPES
from envs.alfworld.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE
from gagpo_rllib.algorithm import GAGPOConfig
from gagpo_rllib.evaluation import EvalSettings, with_validation
from gagpo_rllib.models import build_tiny_policy

VALID_SPLIT = "valid_unseen"
POLICY_DIR = Path(
    os.environ.get("GAGPO_TINY_ALFWORLD_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_alfworld_policy")
)


def env_class() -> type:
    """AlfworldEnv, imported lazily (its package imports alfworld only when the env is built)."""
    from envs.alfworld import AlfworldEnv

    return AlfworldEnv


def alfworld_corpus(steps_per_game: int = 4) -> list[str]:
    """Observations, goals and admissible commands of one bundled game per task type (a few steps deep)."""
    env = env_class()({"split": "train"})
    texts: list[str] = []
    for task_type in TASK_TYPES:
        task_id = next(i for i, g in enumerate(env.games) if g.task_type == task_type)
        obs, info = env.reset(seed=0, options={"task_id": task_id})
        texts += [obs, info["task"], *info["admissible_actions"]]
        for step in range(steps_per_game):
            actions = info["admissible_actions"]
            if not actions:
                break
            obs, _, terminated, truncated, info = env.step(actions[step % len(actions)])
            texts += [obs, *info["admissible_actions"]]
            if terminated or truncated:
                break
    return sorted(set(texts))


def alfworld_policy(out_dir: Path = POLICY_DIR, *, seed: int = 0) -> Path:
    """A tiny policy for the CPU default, built once (delete the folder to rebuild it)."""
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer_config.json").is_file():
        return out_dir
    corpus = alfworld_corpus() + [FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, "user assistant system"]
    return build_tiny_policy(out_dir, corpus=corpus, vocab_size=1024, seed=seed)


def paper_config(model_path: str, *, num_gpus: int | None = None, seed: int = 0) -> GAGPOConfig:
    """The paper's ALFWorld set-up (Qwen2.5-1.5B-Instruct): vLLM rollouts and bf16 when a GPU is there."""
    gpus = int(os.environ.get("GAGPO_GPUS", "0")) if num_gpus is None else num_gpus
    on_gpu = gpus > 0
    config = (
        GAGPOConfig()
        .environment(env_class(), env_config={"split": "train"})
        .env_runners(num_env_runners=1, num_gpus_per_env_runner=0.5 if on_gpu else 0)
        .learners(num_learners=0, num_gpus_per_learner=0.5 if on_gpu else 0)
        .gagpo(
            model_path=model_path,
            estimator="gagpo",
            group_size=8,
            groups_per_iteration=16,
            max_steps=50,
            history_length=2,
            gamma=0.95,
            lam=0.95,
            kl_coeff=0.01,
            entropy_coeff=0.001,
            temperature=1.0,
            eval_temperature=0.4,
            max_new_tokens=512,
            max_prompt_tokens=2048,
            constrained_decoding=False,
            backend="vllm" if on_gpu else "hf",
            backend_kwargs={"gpu_memory_utilization": 0.4, "dtype": "bfloat16"} if on_gpu else {},
            dtype="bfloat16" if on_gpu else "float32",
        )
        .training(lr=1e-6, num_epochs=1, minibatch_size=64, grad_clip=1.0)
        .debugging(seed=seed)
    )
    # Validation every 5 iterations on all of valid_unseen at eval_temperature (its own, smaller vLLM engine).
    return with_validation(
        config,
        split=VALID_SPLIT,
        interval=5,
        settings=EvalSettings(split=VALID_SPLIT, seed=seed),
        **({"backend_kwargs": {"gpu_memory_utilization": 0.15, "dtype": "bfloat16"}} if on_gpu else {}),
    )


def cpu_config(*, policy_dir: Path = POLICY_DIR, num_env_runners: int = 1, seed: int = 0) -> GAGPOConfig:
    """The embedded default: a tiny policy on the bundled games, constrained decoding, CPU only."""
    config = (
        GAGPOConfig()
        .environment(env_class(), env_config={"split": "train"})
        .env_runners(num_env_runners=num_env_runners)
        .gagpo(
            model_path=str(alfworld_policy(policy_dir)),
            estimator="gagpo",
            group_size=4,
            groups_per_iteration=4,
            max_steps=30,
            history_length=2,
            constrained_decoding=True,
            max_new_tokens=16,
            kl_coeff=0.01,
            entropy_coeff=0.01,
        )
        .training(lr=5e-4, num_epochs=1, minibatch_size=512, grad_clip=1.0)
        .debugging(seed=seed)
    )
    # Validation after every 5 iterations on 6 tasks of valid_unseen.
    return with_validation(
        config,
        split=VALID_SPLIT,
        interval=5,
        settings=EvalSettings(split=VALID_SPLIT, num_tasks=6, seed=seed),
    )


def make_config(model_path: str | None = None, **kwargs) -> GAGPOConfig:
    """The paper's set-up for a model path, the CPU default without one."""
    return paper_config(model_path, **kwargs) if model_path else cpu_config(**kwargs)


MODEL = os.environ.get("GAGPO_MODEL")
config = make_config(MODEL)
stop = {"training_iteration": 150 if MODEL else 5}


if __name__ == "__main__":
    from gagpo_rllib.train import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=MODEL, help="model folder (default $GAGPO_MODEL; none: CPU default)"
    )
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default $GAGPO_GPUS or 0)")
    parser.add_argument("--iterations", type=int, default=None, help="iteration budget")
    parser.add_argument("--storage", default="results", help="folder for results and checkpoints")
    parser.add_argument("--checkpoint-freq", type=int, default=10, help="checkpoint every N iterations")
    args = parser.parse_args()
    config = paper_config(args.model, num_gpus=args.gpus) if args.model else cpu_config()
    train(
        config,
        stop={**stop, "training_iteration": args.iterations or (150 if args.model else 5)},
        storage_path=args.storage,
        name="gagpo_alfworld",
        checkpoint_freq=args.checkpoint_freq,
    )
