"""The embedded default: GAGPO with a tiny policy on the built-in maze, on CPU, with constrained decoding.

Run ``python tuned_examples/gagpo_builtin.py`` (or ``rllib train file tuned_examples/gagpo_builtin.py``): when
training starts it builds (cached) a tiny random-init Qwen2-style policy with a tokenizer trained on the maze's own
texts (no download), trains until 80% of an iteration's rollouts succeed, the iteration budget is spent or success
has plateaued (its 5-iteration mean has not risen for ``PLATEAU_PATIENCE`` iterations), prints one progress line
per iteration, then why it stopped and where the results and the checkpoint are. Settings: 8 task instances x 8
rollouts per iteration, lr 5e-4, entropy bonus 0.01, one epoch in minibatches of 512 steps.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.tools.tiny_policies import TinyPolicy, maze_tiny_policy

# Where the tiny policy is built (cached: later runs reuse it).
POLICY_DIR = Path(
    os.environ.get("GAGPO_TINY_POLICY_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_maze_policy")
)


def maze_policy(out_dir: Path = POLICY_DIR, *, seed: int = 0) -> Path:
    """The tiny policy, built now (cached); the config builds it when training starts."""
    return maze_tiny_policy(out_dir, seed=seed)


def make_config(
    *, estimator: str = "gagpo", seed: int = 0, num_env_runners: int = 1, policy_dir: Path = POLICY_DIR
) -> GAGPOConfig:
    """The built-in configuration; ``estimator`` switches the advantage (gagpo, gigpo, grpo, rloo, ppo)."""
    return (
        GAGPOConfig()
        .environment(MazeEnv, env_config={"split": "train", "num_tasks": 8})
        .env_runners(num_env_runners=num_env_runners)
        .llm(
            model_path=str(policy_dir),
            constrained_decoding=True,
            max_new_tokens=8,
            history_length=2,
        )
        .gagpo(estimator=estimator, group_size=8, groups_per_iteration=8)
        .training(lr=5e-4, num_epochs=1, minibatch_size=512, grad_clip=1.0, kl_coeff=0.01, entropy_coeff=0.01)
        .callbacks(on_setup_start=TinyPolicy(maze_tiny_policy, policy_dir))
        .debugging(seed=seed)
    )


config = make_config()
stop = {"gagpo/success_rate": 0.8, "training_iteration": 150}
PLATEAU_PATIENCE = 30


if __name__ == "__main__":
    from gagpo_rllib.tools.train import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=150, help="iteration budget")
    parser.add_argument("--storage", default="results", help="folder for results and checkpoints")
    parser.add_argument(
        "--patience",
        type=int,
        default=PLATEAU_PATIENCE,
        help="stop when success has not risen for this many iterations (0: never)",
    )
    parser.add_argument("--estimator", default="gagpo", choices=["gagpo", "gigpo", "grpo", "rloo", "ppo"])
    args = parser.parse_args()
    config = make_config(estimator=args.estimator)
    train(
        config,
        stop={**stop, "training_iteration": args.iterations},
        storage_path=args.storage,
        name=f"{args.estimator}_builtin_maze",
        num_cpus=2,
        plateau_patience=args.patience or None,
    )
