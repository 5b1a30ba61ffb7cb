"""GAGPO on ALFWorld: the paper's set-up when a model is given, the embedded CPU default otherwise.

With ``GAGPO_MODEL=/path/to/Qwen2.5-1.5B-Instruct`` (or ``--model``) this is the paper's configuration:
16 games x 8 rollouts per iteration, at most 50 steps, history 2, gamma 0.95, lr 1e-6, k3 KL 0.01 to the initial
model, sampling at temperature 1.0, free-form ``<think>/<action>`` answers, vLLM rollouts and bf16 on a GPU
(``GAGPO_GPUS`` GPUs; the Hugging Face backend and float32 without one), and validation every 5 iterations on
all of valid_unseen at temperature 0.4 (``evaluation/valid/...`` in the results; ``rllib evaluate`` does the
same on a checkpoint).

Without a model it is the embedded CPU default: a tiny random-init policy whose tokenizer is trained on the texts of
every bundled train game, warm-started by behaviour cloning on the walkthroughs of most of them (cached next to the
policy; ``rllib sft`` does the same for any model), then GAGPO with constrained decoding over the admissible
commands on 6 train games the warm start did not see (one per task type), every game in every iteration with
4 rollouts at temperature 0.7, 30 steps, 30 iterations; validation on all of valid_unseen before training and
every 8 iterations, each one printing the success per task type next to the warm start's.
``GAGPO_ALFWORLD_WARM_START=0``: the bare tiny policy on all train games, 4 games x 4 rollouts at temperature 1.0,
5 iterations and a validation on 6 valid_unseen games, as before the warm start existed.

    rllib train file tuned_examples/gagpo_alfworld.py --stop '{"training_iteration": 2}'
    GAGPO_MODEL=/models/Qwen2.5-1.5B-Instruct python tuned_examples/gagpo_alfworld.py --iterations 150
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from envs.alfworld import SHORT_NAMES, TASK_TYPES
from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.prompts import (
    CONSTRAINED_FIRST_PROMPT_TEMPLATE,
    CONSTRAINED_PROMPT_TEMPLATE,
    FIRST_PROMPT_TEMPLATE,
    PROMPT_TEMPLATE,
)
from gagpo_rllib.policy.models import alfworld_tiny_policy, inputs_digest
from gagpo_rllib.rllib import paper_setup
from gagpo_rllib.rllib.algorithm import GAGPOConfig
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation
from gagpo_rllib.tools.demonstrations import DemoSet, alfworld_demonstrations
from gagpo_rllib.tools.sft import SFTSettings, finetune

VALID_SPLIT = "valid_unseen"
POLICY_DIR = Path(
    os.environ.get("GAGPO_TINY_ALFWORLD_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_alfworld_policy")
)
# Learners (DDP, whole groups each) and EnvRunners (one rollout backend each): README "Scaling out".
NUM_LEARNERS, NUM_ENV_RUNNERS = paper_setup.scale_out_from_env()


def env_class() -> type:
    """AlfworldEnv, imported lazily (its package imports alfworld only when the env is built)."""
    from envs.alfworld import AlfworldEnv

    return AlfworldEnv


# The CPU default's warm start: behaviour cloning of the walkthroughs of most bundled train games; GAGPO then
# trains on games kept out of it (GAGPO_TRAIN_GAMES_PER_TYPE of the GAGPO_GAMES_PER_TYPE held out of each task
# type), every one of them in every iteration, validation on valid_unseen.
WARM_START = os.environ.get("GAGPO_ALFWORLD_WARM_START", "1") != "0"
GAGPO_GAMES_PER_TYPE = 3
GAGPO_TRAIN_GAMES_PER_TYPE = 1
CPU_GROUP_SIZE = 4
# Sampling temperature of the CPU default's training rollouts (validation stays at 0.4).
CPU_TEMPERATURE = 0.7
VALID_INTERVAL = 8
WARM_START_SETTINGS = SFTSettings(epochs=30, lr=2e-3, batch_size=16, heldout_fraction=0.1, history_length=2)


def bundled_train_games() -> list[Path]:
    """Game files of the bundled train split, in the env's task-id order."""
    return [Path(g.game_file) for g in find_games(BUNDLED_DATA, "train").games]


@functools.cache
def train_demonstrations() -> DemoSet:
    """Every bundled train game's walkthrough replayed through the env (about a minute; done once a process)."""
    return alfworld_demonstrations({"split": "train"})


def alfworld_policy(out_dir: Path = POLICY_DIR, *, seed: int = 0) -> Path:
    """A tiny policy for the CPU default, its tokenizer trained on all bundled train games (cached)."""
    return alfworld_tiny_policy(out_dir, vocab_size=1024, seed=seed, demonstrations=train_demonstrations)


def split_games(per_type: int = GAGPO_GAMES_PER_TYPE, *, seed: int = 0) -> tuple[list[int], list[int]]:
    """(warm-start games, GAGPO games): task ids of the bundled train split; ``per_type`` games of each task
    type, drawn from ``seed``, are kept out of the warm start for GAGPO."""
    games = find_games(BUNDLED_DATA, "train").games
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA1F]))
    gagpo: list[int] = []
    for task_type in TASK_TYPES:
        ids = [i for i, g in enumerate(games) if g.task_type == task_type]
        gagpo += sorted(int(i) for i in rng.permutation(ids)[:per_type])
    held = set(gagpo)
    return [i for i in range(len(games)) if i not in held], sorted(gagpo)


def gagpo_train_games(held_out: list[int], per_type: int = GAGPO_TRAIN_GAMES_PER_TYPE) -> list[int]:
    """The first ``per_type`` held-out games of each task type (all of them when ``per_type`` is larger)."""
    games = find_games(BUNDLED_DATA, "train").games
    chosen: list[int] = []
    for task_type in TASK_TYPES:
        chosen += [i for i in sorted(held_out) if games[i].task_type == task_type][:per_type]
    return sorted(chosen)


def gagpo_data_dir(task_ids: list[int], out_dir: Path) -> Path:
    """A data folder in ALFWorld's layout whose train split holds only ``task_ids`` (copies of the bundled
    games) and whose valid_unseen is the bundled one; rewritten when the selection changes."""
    games = bundled_train_games()
    chosen = [games[i].parent for i in task_ids]
    marker = out_dir / "selection.json"
    selection = [str(p.relative_to(BUNDLED_DATA)) for p in chosen]
    if marker.is_file() and json.loads(marker.read_text()) == selection:
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for folder, rel in zip(chosen, selection, strict=True):
        shutil.copytree(folder, out_dir / rel)
    shutil.copytree(BUNDLED_DATA / VALID_SPLIT, out_dir / VALID_SPLIT)
    marker.write_text(json.dumps(selection))
    return out_dir


def warm_start(
    policy: Path, task_ids: list[int], out_dir: Path, *, settings: SFTSettings = WARM_START_SETTINGS
) -> Path:
    """The tiny policy fine-tuned on the walkthroughs of ``task_ids`` (cached by its inputs)."""
    games = bundled_train_games()
    # The templates RL uses with this decoding mode (constrained: the tag-free ones).
    first, later = (
        (CONSTRAINED_FIRST_PROMPT_TEMPLATE, CONSTRAINED_PROMPT_TEMPLATE)
        if settings.constrained
        else (FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE)
    )
    key = inputs_digest(
        files=[policy / "model.safetensors", policy / "tokenizer.json", *(games[i] for i in task_ids)],
        texts=[
            json.dumps(asdict(settings), sort_keys=True),
            first,
            later,
        ],
    )
    wanted = set(task_ids)

    def demos() -> DemoSet:
        demo_set = train_demonstrations()
        return DemoSet([d for d in demo_set.demonstrations if d.task_id in wanted], demo_set.skipped)

    finetune(
        policy,
        demos,
        out_dir,
        first_template=first,
        template=later,
        settings=settings,
        cache_key=key,
    )
    return out_dir


def format_before_after(before: dict[str, float], after: dict[str, float], label: str) -> str:
    """Success per task type (percent) of the warm start and of ``label``, from two validation results."""
    names = [*(SHORT_NAMES[t] for t in TASK_TYPES), "All"]

    def cell(table: dict[str, float], name: str) -> str:
        value = table.get("success" if name == "All" else f"by_type/{name}", math.nan)
        return "-" if math.isnan(value) else f"{100 * value:.1f}"

    rows = [
        ["", *names],
        ["warm start", *(cell(before, n) for n in names)],
        [label, *(cell(after, n) for n in names)],
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(names) + 1)]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


class ValidationAgainstWarmStart:
    """The validation function, printing after each validation the per-task-type success of the warm start
    (the validation played when the algorithm starts) next to the latest one."""

    def __init__(self, validate):
        self.validate = validate
        self.before: dict[str, float] | None = None

    def __call__(self, algorithm, eval_group):
        out = self.validate(algorithm, eval_group)
        table = out[0]["valid"]
        if self.before is None:
            self.before = dict(table)
        else:
            # Called inside the training step, before the algorithm counts the iteration just trained.
            label = f"iteration {algorithm.iteration + 1}"
            print(
                f"{VALID_SPLIT} success by task type:\n{format_before_after(self.before, table, label)}",
                flush=True,
            )
        return out


def validate_warm_start(algorithm, **kwargs) -> None:
    """Play the validation once before training, so the curve and the table start at the warm start."""
    algorithm.evaluate()


def paper_config(model_path: str, *, num_gpus: int | None = None, seed: int = 0) -> GAGPOConfig:
    """The paper's ALFWorld set-up (Qwen2.5-1.5B-Instruct): vLLM rollouts and bf16 when a GPU is there.

    Validation every 5 iterations on all of valid_unseen at eval_temperature (its own, smaller vLLM engine).
    """
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
    train_games_per_type: int = GAGPO_TRAIN_GAMES_PER_TYPE,
    group_size: int = CPU_GROUP_SIZE,
    temperature: float = CPU_TEMPERATURE,
) -> GAGPOConfig:
    """The embedded default: a tiny policy on the bundled games, constrained decoding, CPU only.

    With ``warm`` (default; ``GAGPO_ALFWORLD_WARM_START=0`` turns it off) the policy is first fine-tuned on the
    walkthroughs of most train games, and GAGPO trains ``group_size`` rollouts of each of
    ``train_games_per_type`` games per task type that the warm start did not see, every game in every iteration.
    Without it, 4 games x 4 rollouts of all train games.
    """
    policy = alfworld_policy(policy_dir)
    env_config: dict = {"split": "train"}
    groups, rollouts = 4, 4
    if warm:
        warm_ids, held_out = split_games()
        gagpo_ids = gagpo_train_games(held_out, train_games_per_type)
        groups, rollouts = len(gagpo_ids), group_size
        folder = policy_dir.with_name(policy_dir.name + "_warm_start")
        policy = warm_start(policy, warm_ids, folder, settings=warm_settings)
        data_dir = gagpo_data_dir(gagpo_ids, policy_dir.with_name(policy_dir.name + "_gagpo_games"))
        env_config["data_dir"] = str(data_dir)
    config = (
        GAGPOConfig()
        .environment(env_class(), env_config=env_config)
        .env_runners(num_env_runners=num_env_runners)
        .learners(num_learners=NUM_LEARNERS)
        .gagpo(
            model_path=str(policy),
            estimator="gagpo",
            group_size=rollouts,
            groups_per_iteration=groups,
            max_steps=30,
            history_length=2,
            constrained_decoding=True,
            max_new_tokens=16,
            kl_coeff=0.01,
            entropy_coeff=0.01,
            temperature=temperature if warm else 1.0,
        )
        .training(lr=5e-4, num_epochs=1, minibatch_size=512, grad_clip=1.0)
        .debugging(seed=seed)
    )
    if not warm:
        # Validation after every 5 iterations on 6 tasks of valid_unseen.
        return with_validation(
            config,
            split=VALID_SPLIT,
            interval=5,
            settings=EvalSettings(split=VALID_SPLIT, num_tasks=6, seed=seed),
        )
    # Validation on all of valid_unseen before training and every VALID_INTERVAL iterations, each one printing
    # the success per task type next to the warm start's.
    config = with_validation(
        config,
        split=VALID_SPLIT,
        interval=VALID_INTERVAL,
        settings=EvalSettings(split=VALID_SPLIT, seed=seed),
    )
    config.evaluation(
        custom_evaluation_function=ValidationAgainstWarmStart(config.custom_evaluation_function)
    )
    return config.callbacks(on_algorithm_init=validate_warm_start)


def make_config(model_path: str | None = None, **kwargs) -> GAGPOConfig:
    """The paper's set-up for a model path, the CPU default without one."""
    return paper_config(model_path, **kwargs) if model_path else cpu_config(**kwargs)


MODEL = os.environ.get("GAGPO_MODEL")
config = make_config(MODEL)
WARM_ITERATIONS = 30
CPU_ITERATIONS = WARM_ITERATIONS if WARM_START else 5
stop = {"training_iteration": 150 if MODEL else CPU_ITERATIONS}


if __name__ == "__main__":
    from gagpo_rllib.tools.train import train

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
        stop={**stop, "training_iteration": args.iterations or (150 if args.model else CPU_ITERATIONS)},
        storage_path=args.storage,
        name="gagpo_alfworld",
        checkpoint_freq=args.checkpoint_freq,
    )
