"""The learner's gradient against another version of the code, on the same sampled episodes.

A learner change that should not change the loss (packing, slicing, chunking) must leave the gradient of an update
where it was, up to float rounding. This samples episodes on the tiny corridor task once, then runs one full-batch
update with each tree's code (the working tree and, e.g., a ``git worktree`` of an older commit, each imported in a
process of its own) for GAGPO (saved and recomputed old log-probs), PPO with its critic and LoRA, with free and
constrained decoding, and prints the relative norm of the gradient difference per case.

    git worktree add /tmp/before <commit>
    python benchmarks/compare_learner_gradients.py --other /tmp/before
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, dict] = {
    "gagpo": {},
    "gagpo, recomputed old log-probs": {"recompute_old_logprobs": True},
    "ppo (critic)": {"estimator": "ppo"},
    "lora r4": {"lora_rank": 4},
}


def _config(model: Path, constrained: bool):
    from tests.gagpo_rllib.toy_env import make_config

    config = make_config(model, groups_per_iteration=4, constrained_decoding=constrained, max_new_tokens=6)
    return config.training(minibatch_size=None, num_epochs=1)


def sample(work: Path) -> None:
    """The tiny policy and one iteration's episodes per decoding mode, pickled into ``work``."""
    from gagpo_rllib.policy.models import build_tiny_policy
    from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
    from gagpo_rllib.rllib.group_sampling import task_plan

    build_tiny_policy(work / "policy", seed=0)
    for constrained in (True, False):
        config = _config(work / "policy", constrained)
        config.validate()
        runner = GAGPOEnvRunner(config=config)
        plan = task_plan(
            runner.num_tasks(), groups=4, group_size=config.group_size, seed=config.seed, iteration=0
        )
        episodes, _ = runner.sample_groups(plan, gen_seed=0)
        (work / f"episodes_{constrained}.pkl").write_bytes(pickle.dumps(episodes))


def gradients(work: Path, out: Path) -> None:
    """Each case's gradient after one update, saved to ``out``."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from gagpo_rllib.rllib.config import configure
    from tests.gagpo_rllib.toy_env import CorridorEnv

    results = {}
    for constrained in (True, False):
        episodes = pickle.loads((work / f"episodes_{constrained}.pkl").read_bytes())
        for name, fields in VARIANTS.items():
            config = configure(_config(work / "policy", constrained).copy(copy_frozen=False), **fields)
            config.validate()
            torch.manual_seed(0)
            learner = config.build_learner(env=CorridorEnv())
            learner.update(episodes=episodes, num_epochs=1, minibatch_size=None)
            module = learner.module[DEFAULT_MODULE_ID]
            results[f"{name}, {'constrained' if constrained else 'free'}"] = {
                n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None
            }
    torch.save(results, out)


def _run(tree: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree), *args], env=env, check=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--other", type=Path, help="the other tree (a checkout of the code to compare against)"
    )
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--step", choices=("sample", "gradients"), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:  # a child: the tree's code is first on sys.path
        sys.path.insert(0, str(args.tree))
        sample(args.work) if args.step == "sample" else gradients(args.work, args.out)
        return
    if args.other is None:
        parser.error("--other is required")
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _run(ROOT, "--step", "sample", "--work", str(work))
        _run(ROOT, "--step", "gradients", "--work", str(work), "--out", str(work / "this.pt"))
        _run(
            args.other.resolve(), "--step", "gradients", "--work", str(work), "--out", str(work / "other.pt")
        )
        this, other = torch.load(work / "this.pt"), torch.load(work / "other.pt")
    print(f"gradient of one update, this tree ({ROOT}) against {args.other}: relative norm of the difference")
    print("| case | tensors | relative difference |\n| --- | --- | --- |")
    for case, theirs in other.items():
        ours = this[case]
        if ours.keys() != theirs.keys():
            print(f"| {case} | parameter names differ: {sorted(ours.keys() ^ theirs.keys())[:3]} | - |")
            continue
        a = torch.cat([ours[n].double().flatten() for n in theirs])
        b = torch.cat([theirs[n].double().flatten() for n in theirs])
        print(f"| {case} | {len(theirs)} | {float((a - b).norm() / b.norm()):.2e} |")


if __name__ == "__main__":
    main()
