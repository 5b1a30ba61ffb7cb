"""Learner scaling: trained steps per second of one GAGPO update with 1 and with 2 RLlib learners (DDP), same batch.

The batch is sampled once (maze, tiny random-init policy unless ``--model``) and trained by a LearnerGroup of each
size: ``num_learners=1`` (one remote learner) and ``num_learners=2`` (whole groups per learner, gloo on CPU, NCCL
with one GPU per learner when the machine has them). Prints steps/s per size, their ratio, and the machine's CPU
cores and GPUs; on CPU each learner gets one core (Ray's ``num_cpus_per_learner="auto"``).

    python benchmarks/bench_scaling.py [--groups 8 --group-size 4 --updates 3 --minibatch-size 16]

What each learner holds (DDP or FSDP, per GPU) is ``benchmarks/bench_memory.py``'s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import ray
import torch

from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.policy.models import build_tiny_policy
from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.groups import GroupShardedTrainingData, stamp_training_groups

ENV_CONFIG = {"split": "train", "num_tasks": 8}


def make_config(model_path: str, args: argparse.Namespace) -> GAGPOConfig:
    return (
        GAGPOConfig()
        .environment(MazeEnv, env_config=dict(ENV_CONFIG))
        .env_runners(num_env_runners=0)
        .llm(model_path=model_path, constrained_decoding=True, max_new_tokens=8)
        .gagpo(group_size=args.group_size, groups_per_iteration=args.groups, max_steps=args.max_steps)
        .training(lr=1e-4, minibatch_size=args.minibatch_size, num_epochs=1)
        .debugging(seed=0)
    )


def sample_batch(config: GAGPOConfig) -> list:
    runner = GAGPOEnvRunner(config=config)
    plan = task_plan(
        runner.num_tasks(),
        groups=config.groups_per_iteration,
        group_size=config.group_size,
        seed=0,
        iteration=0,
    )
    episodes, _ = runner.sample_groups(plan, gen_seed=0)
    runner.stop()
    return episodes


def steps_per_second(
    config: GAGPOConfig, episodes: list, num_learners: int, gpus: int, updates: int
) -> float:
    cfg = config.copy(copy_frozen=False).learners(
        num_learners=num_learners, num_gpus_per_learner=1 if gpus >= 2 else 0
    )
    cfg.validate()
    group = cfg.build_learner_group(env=MazeEnv(dict(ENV_CONFIG)))

    def update() -> None:
        stamp_training_groups(episodes, invalid_penalty=cfg.invalid_penalty, skip_uniform_groups=False)
        data = GroupShardedTrainingData(episodes=episodes)
        group.update(training_data=data, num_epochs=1, minibatch_size=cfg.minibatch_size)

    update()  # warm-up: first forward/backward, optimizer state
    start = time.perf_counter()
    for _ in range(updates):
        update()
    elapsed = time.perf_counter() - start
    group.shutdown()
    return updates * sum(len(e) for e in episodes) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: a tiny random-init policy)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--minibatch-size", type=int, default=None, help="per learner (default: whole shard)")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per learner count")
    args = parser.parse_args()

    cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_policy(tmp, seed=0))
        config = make_config(model, args)
        config.validate()
        episodes = sample_batch(config)
        ray.init(num_cpus=max(cores, 2), include_dashboard=False, log_to_driver=False)
        try:
            rates = {n: steps_per_second(config, episodes, n, gpus, args.updates) for n in (1, 2)}
        finally:
            ray.shutdown()
    steps = sum(len(e) for e in episodes)
    device = f"{gpus} GPU(s), one per learner" if gpus >= 2 else "CPU, one core per learner"
    print(f"machine: {cores} CPU cores, {gpus} GPUs; learners on {device}")
    print(f"batch: {len(episodes)} episodes, {steps} steps; minibatch_size={args.minibatch_size}")
    for n, rate in rates.items():
        print(f"num_learners={n}: {rate:.1f} trained steps/s")
    print(f"ratio 2 learners / 1 learner: {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
