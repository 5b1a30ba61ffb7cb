"""The PPO baseline on the embedded default, nothing tuned but ``estimator="ppo"``: its critic learns the values of
the maze's states, not only their mean.

Thresholds, from 3 seeds of this run (see docs/learning.md, "PPO's critic"): the median over iterations 20-29 of
the update's explained variance was 0.25-0.37 (with the former defaults, critic_lr 1e-5 and vf_clip 0.5, it stayed
at -0.09 to +0.01: the critic tracked the mean return); the median, not the mean, because an iteration with few
wins has targets of almost no variance, where any spread of the values gives a large negative figure.
"""

from __future__ import annotations

import copy
import os
import runpy
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from gagpo_rllib.method.advantages import critic_gae
from gagpo_rllib.rllib.connectors.grouped_advantages import episode_rows
from gagpo_rllib.rllib.rllib_internals import local_learner

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("GAGPO_PPO_TEST_SEED", "0"))
ITERATIONS = 30
EXPLAINED_VARIANCE = 0.1  # median over iterations 20-29
HELD_OUT_PLAN = 10_000  # an iteration index training never reaches: its groups are a held-out batch


@pytest.mark.timeout(1200)
def test_the_critic_learns_the_state_values_on_the_builtin_maze(tmp_path: Path) -> None:
    example = runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="test_builtin_ppo")
    config = example["make_config"](
        estimator="ppo", seed=SEED, num_env_runners=0, policy_dir=tmp_path / "policy"
    )
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        algo = config.build_algo()
        module = local_learner(algo.learner_group).module["default_policy"]
        initial_critic = copy.deepcopy(module.critic.state_dict())
        explained = [
            algo.train()["learners"]["default_policy"].get("vf_explained_var", np.nan)
            for _ in range(ITERATIONS)
        ]
        # A held-out batch played by the trained policy; its targets are the returns-to-go (lam = 1, no critic).
        episodes, _, _ = algo.sample_groups(algo.iteration_plan(HELD_OUT_PLAN), HELD_OUT_PLAN)
        rows = episode_rows(episodes, config.invalid_penalty)
        returns = critic_gae(
            {**rows.columns(), "value": np.zeros(len(rows.reward))}, gamma=config.gamma, lam=1.0
        )[1]

        def critic_error() -> float:
            with torch.no_grad():
                values = module.state_values(rows.prompt_ids).double().numpy()
            return float(np.mean((values - returns) ** 2))

        trained = critic_error()
        module.critic.load_state_dict(initial_critic)
        untrained = critic_error()
        algo.stop()
    finally:
        ray.shutdown()
    late = float(np.nanmedian(explained[20:30]))
    print(f"seed {SEED}: explained variance {np.round(explained, 3).tolist()}, median over 20-29 {late:.3f}")
    print(
        f"held-out value error: untrained {untrained:.3f}, trained {trained:.3f}, returns' variance {np.var(returns):.3f}"
    )
    assert late > EXPLAINED_VARIANCE, explained
    # The trained critic predicts the held-out returns better than the one it started from, and better than
    # their mean (an explained variance above 0 on episodes it never trained on).
    assert trained < untrained
    assert trained < np.var(returns)
