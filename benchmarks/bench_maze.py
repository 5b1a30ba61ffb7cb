"""The built-in maze against its targets: step and reset latency, random-policy success, shortest solutions.

Targets (issue 3): <= 1 ms per step; a uniformly random policy over the admissible actions succeeds in at most 20%
of episodes; every shortest solution takes at least 4 steps. The measured random-policy rate is printed next to
the exact expectation computed when the task set is built.

    python benchmarks/bench_maze.py [--episodes 2000] [--seed 0] [--num-tasks 8]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from envs.maze import MazeEnv
from envs.maze.layout import MazeParams, build_tasks

STEP_TARGET_S = 1e-3
RANDOM_SUCCESS_TARGET = 0.20
MIN_SHORTEST = 4


def random_policy(env: MazeEnv, episodes: int, seed: int) -> dict[str, np.ndarray]:
    """Play `episodes` seeded episodes with a uniformly random policy; time every reset and step."""
    rng = np.random.default_rng(seed)
    reset_s, step_s, won, lengths = [], [], [], []
    for episode in range(episodes):
        t0 = time.perf_counter()
        _, info = env.reset(seed=seed * 1_000_003 + episode)
        reset_s.append(time.perf_counter() - t0)
        done = False
        while not done:
            actions = info["admissible_actions"]
            action = actions[rng.integers(len(actions))]
            t0 = time.perf_counter()
            _, _, terminated, truncated, info = env.step(action)
            step_s.append(time.perf_counter() - t0)
            done = terminated or truncated
        won.append(info["won"])
        lengths.append(info["steps"])
    return {
        "reset_s": np.array(reset_s),
        "step_s": np.array(step_s),
        "won": np.array(won, dtype=bool),
        "length": np.array(lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="task-set seed (env config) and policy seed")
    parser.add_argument("--num-tasks", type=int, default=8)
    args = parser.parse_args()

    build_tasks.cache_clear()
    t0 = time.perf_counter()
    build_tasks(MazeParams(seed=args.seed))
    print(f"task set build (cold): {1e3 * (time.perf_counter() - t0):.1f} ms")

    for split in ("train", "eval"):
        env = MazeEnv({"split": split, "seed": args.seed, "num_tasks": args.num_tasks})
        out = random_policy(env, args.episodes, args.seed)
        step_med = float(np.median(out["step_s"]))
        reset_med = float(np.median(out["reset_s"]))
        rate = float(out["won"].mean())
        stderr = float(np.sqrt(rate * (1 - rate) / len(out["won"])))
        exact = float(np.mean([env.task(i).random_success for i in range(env.num_tasks)]))
        shortest = [env.task(i).shortest_path for i in range(env.num_tasks)]
        limits = [env.task(i).max_steps for i in range(env.num_tasks)]
        print(
            f"\n[{split}] {env.num_tasks} tasks, {args.episodes} random-policy episodes, {len(out['step_s'])} steps"
        )
        print(
            f"  step  median {1e6 * step_med:7.2f} us  p99 {1e6 * np.quantile(out['step_s'], 0.99):7.2f} us"
            f"  = {step_med / STEP_TARGET_S:.4f} x the 1 ms target"
        )
        print(
            f"  reset median {1e6 * reset_med:7.2f} us  p99 {1e6 * np.quantile(out['reset_s'], 0.99):7.2f} us"
        )
        print(
            f"  random-policy success {rate:.3f} +- {stderr:.3f} (exact expectation {exact:.3f})"
            f"  = {rate / RANDOM_SUCCESS_TARGET:.2f} x the 20% ceiling"
        )
        print(
            f"  episode length mean {out['length'].mean():.1f}, step limits {sorted(Counter(limits).items())}"
        )
        print(
            f"  shortest solutions {sorted(Counter(shortest).items())} (length: count), min {min(shortest)}"
            f" = {min(shortest) / MIN_SHORTEST:.2f} x the 4-step floor"
        )


if __name__ == "__main__":
    main()
