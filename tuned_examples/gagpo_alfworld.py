"""GAGPO on ALFWorld: the paper's set-up when a model is given, the embedded CPU default otherwise.

With ``GAGPO_MODEL=/path/to/Qwen2.5-1.5B-Instruct`` (or ``--model``): the paper's configuration
(``gagpo_rllib.rllib.paper_setup``), at most 50 steps, prompts of at most 2048 tokens, validation every 5 iterations
on all of valid_unseen at temperature 0.4.

Without a model, the embedded CPU default: when training starts, a tiny policy (tokenizer trained on the bundled
train games) is warm-started by behaviour cloning on the walkthroughs of most of them, cached on disk
(``gagpo_rllib.tools.alfworld_warm_start``; reading this file builds nothing); then GAGPO, constrained decoding, on
6 train games the warm start did not see (one per task type), 4 rollouts each at temperature 0.7, 30 steps,
30 iterations; validation on valid_unseen before training and every 8 iterations, printed next to the warm
start's. ``GAGPO_ALFWORLD_WARM_START=0``: the bare tiny policy on all train games, 4 x 4 rollouts, 5 iterations.

    rllib train file tuned_examples/gagpo_alfworld.py --stop '{"training_iteration": 2}'
    GAGPO_MODEL=/models/Qwen2.5-1.5B-Instruct python tuned_examples/gagpo_alfworld.py --iterations 150
"""

from __future__ import annotations

import os
from pathlib import Path

from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib import paper_setup
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation
from gagpo_rllib.tools.alfworld_warm_start import (
    VALID_SPLIT,
    WARM_START_SETTINGS,
    AlfworldWarmStart,
    ValidationAgainstWarmStart,
    validate_warm_start,
)
from gagpo_rllib.tools.sft import SFTSettings

POLICY_DIR = Path(
    os.environ.get("GAGPO_TINY_ALFWORLD_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_alfworld_policy")
)
# Learners (DDP, whole groups each) and EnvRunners (one rollout backend each): README "Scaling out".
NUM_LEARNERS, NUM_ENV_RUNNERS = paper_setup.scale_out_from_env()
WARM_START = os.environ.get("GAGPO_ALFWORLD_WARM_START", "1") != "0"
CPU_GROUP_SIZE, CPU_TEMPERATURE, VALID_INTERVAL = 4, 0.7, 8


def env_class() -> type:
    """AlfworldEnv, imported lazily (its package imports alfworld only when the env is built)."""
    from envs.alfworld import AlfworldEnv

    return AlfworldEnv


def paper_config(model_path: str, *, num_gpus: int | None = None, seed: int = 0) -> GAGPOConfig:
    """The paper's ALFWorld set-up (Qwen2.5-1.5B-Instruct); validation every 5 iterations on valid_unseen."""
    return paper_setup.paper_config(
        env_class(),
        {"split": "train"},
        model_path=model_path,
        max_steps=50,
        max_prompt_tokens=2048,
        valid_split=VALID_SPLIT,
        num_learners=NUM_LEARNERS,
        num_env_runners=NUM_ENV_RUNNERS,
        num_gpus=num_gpus,
        seed=seed,
    )


def cpu_config(
    *,
    policy_dir: Path = POLICY_DIR,
    num_env_runners: int = NUM_ENV_RUNNERS,
    seed: int = 0,
    warm: bool = WARM_START,
    warm_settings: SFTSettings = WARM_START_SETTINGS,
    train_games_per_type: int = 1,
    group_size: int = CPU_GROUP_SIZE,
    temperature: float = CPU_TEMPERATURE,
) -> GAGPOConfig:
    """The embedded default: a tiny policy on the bundled games, constrained decoding, CPU only; the warm start
    (``warm``) runs when training starts."""
    stage = AlfworldWarmStart(
        policy_dir, warm=warm, settings=warm_settings, train_games_per_type=train_games_per_type
    )
    env_config: dict = {"split": "train"}
    groups, rollouts = 4, 4
    if warm:
        env_config["data_dir"] = str(stage.data_dir)
        groups, rollouts = len(stage.gagpo_games()), group_size
    config = (
        GAGPOConfig()
        .environment(env_class(), env_config=env_config)
        .llm(
            model_path=str(stage.model_dir),
            history_length=2,
            constrained_decoding=True,
            max_new_tokens=16,
            temperature=temperature if warm else 1.0,
        )
        .gagpo(estimator="gagpo", group_size=rollouts, groups_per_iteration=groups, max_steps=30)
        .training(lr=5e-4, num_epochs=1, minibatch_size=512, grad_clip=1.0, kl_coeff=0.01, entropy_coeff=0.01)
        .env_runners(num_env_runners=num_env_runners)
        .learners(num_learners=NUM_LEARNERS)
        .callbacks(on_setup_start=stage)
        .debugging(seed=seed)
    )
    if not warm:  # validation after every 5 iterations on 6 tasks of valid_unseen
        settings = EvalSettings(split=VALID_SPLIT, num_tasks=6, seed=seed)
        return with_validation(config, split=VALID_SPLIT, interval=5, settings=settings)
    # Validation before training and every VALID_INTERVAL iterations, each next to the warm start's.
    settings = EvalSettings(split=VALID_SPLIT, seed=seed)
    config = with_validation(config, split=VALID_SPLIT, interval=VALID_INTERVAL, settings=settings)
    config.evaluation(
        custom_evaluation_function=ValidationAgainstWarmStart(config.custom_evaluation_function)
    )
    return config.callbacks(on_algorithm_init=validate_warm_start)


MODEL = os.environ.get("GAGPO_MODEL")
config = paper_config(MODEL) if MODEL else cpu_config()
CPU_ITERATIONS = 30 if WARM_START else 5
stop = {"training_iteration": 150 if MODEL else CPU_ITERATIONS}


if __name__ == "__main__":
    from gagpo_rllib.tools.train import example_main

    example_main(
        __doc__,
        paper_config=paper_config,
        cpu_config=cpu_config,
        cpu_iterations=CPU_ITERATIONS,
        name="gagpo_alfworld",
    )
