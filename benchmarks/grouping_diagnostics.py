"""How much the state groups share on ALFWorld and WebShop, per state-key choice, on the CPU default's rollouts.

For each env the script samples the CPU default's first iteration (``tuned_examples/gagpo_<env>.py``: the tiny
policy, constrained decoding, 4 task instances x 4 rollouts; ALFWorld on the bundled train games without the warm
start unless ``--warm-start``, WebShop on the bundled catalogue) on a local EnvRunner, then computes every step's
key under each choice (``gagpo_rllib.rllib.connectors.rollout``: env, normalized, history with H = 2) and with similarity
grouping of the env keys (``gagpo_rllib.method.similarity``, thresholds 0.95 and 0.9), all from the same episodes, and
prints ``grouping_diagnostics`` of each: the share of steps whose state is seen once in its group (the paper
reports about 45% on ALFWorld and 34% on WebShop under exact matching, for trained 1.5B policies), the number of
(group, state) pairs and their mean and largest size.

    python benchmarks/grouping_diagnostics.py [--envs alfworld webshop] [--iterations 1] [--warm-start]
"""

from __future__ import annotations

import argparse
import os
import runpy
import time
from pathlib import Path

import numpy as np

from gagpo_rllib.method.advantages import grouping_diagnostics
from gagpo_rllib.method.seeds import derive_seed
from gagpo_rllib.method.similarity import anchor_keys
from gagpo_rllib.rllib.connectors.rollout import episode_state_keys, resolve_state_key
from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.groups import episode_rows

ROOT = Path(__file__).resolve().parents[1]
CHOICES = ("env", "normalized", "history")
THRESHOLDS = (0.95, 0.9)


def cpu_default(env: str, warm_start: bool):
    """The env's CPU default config, on the local runner, without its periodic validation."""
    # The example builds its default config when loaded: keep that one from running the warm start too.
    os.environ["GAGPO_ALFWORLD_WARM_START"] = "1" if warm_start else "0"
    example = runpy.run_path(
        str(ROOT / "tuned_examples" / f"gagpo_{env}.py"), run_name="grouping_diagnostics"
    )
    kwargs = {"num_env_runners": 0}
    if env == "alfworld":
        kwargs["warm"] = warm_start
    config = example["cpu_config"](**kwargs)
    config.evaluation_interval = None
    config.custom_evaluation_function = None
    config.callbacks_on_algorithm_init = None
    return config


def sample(config, iterations: int) -> list:
    """The CPU default's first ``iterations`` plans, played by one local EnvRunner with the initial policy."""
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    seed = config.seed or 0
    episodes = []
    for it in range(iterations):
        plan = task_plan(
            runner.num_tasks(),
            groups=config.groups_per_iteration,
            group_size=config.group_size,
            seed=seed,
            iteration=it,
        )
        done, _ = runner.sample_groups(plan, gen_seed=derive_seed(seed, it, 0))
        episodes.extend(done)
    return episodes


def diagnostics_by_key(episodes: list, history: int = 2) -> dict[str, dict[str, float]]:
    """``grouping_diagnostics`` of the same episodes under every key choice and similarity threshold."""
    rows = episode_rows(episodes, invalid_penalty=0.0)
    out = {}
    keys_of = {}
    for choice in CHOICES:
        fn = resolve_state_key(choice, history=history)
        keys_of[choice] = [k for ep in episodes for k in episode_state_keys(fn, ep, choice)]
        out[choice] = grouping_diagnostics({**rows.columns(), "state_key": keys_of[choice]})
    for threshold in THRESHOLDS:
        anchored = anchor_keys(rows.group_id, keys_of["env"], threshold)
        out[f"env ~{threshold:g}"] = grouping_diagnostics({**rows.columns(), "state_key": anchored})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["alfworld", "webshop"], choices=["alfworld", "webshop"])
    parser.add_argument("--iterations", type=int, default=1, help="iterations of the CPU default to sample")
    parser.add_argument("--warm-start", action="store_true", help="ALFWorld: the warm-started policy")
    args = parser.parse_args(argv)
    print("| env | key | steps | singleton share | state groups | mean size | max size |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for env in args.envs:
        start = time.perf_counter()
        episodes = sample(cpu_default(env, args.warm_start), args.iterations)
        steps = sum(len(ep) for ep in episodes)
        for name, d in diagnostics_by_key(episodes).items():
            print(
                f"| {env} | {name} | {steps} | {d['singleton_share']:.3f} | {d['num_state_groups']:.0f} "
                f"| {d['state_group_size_mean']:.2f} | {d['state_group_size_max']:.0f} |",
                flush=True,
            )
        wins = np.mean([bool(ep.get_infos(-1).get("won", False)) for ep in episodes])
        print(
            f"<!-- {env}: {len(episodes)} episodes, success {wins:.2f}, "
            f"{time.perf_counter() - start:.0f} s -->",
            flush=True,
        )


if __name__ == "__main__":
    main()
