"""The GAGPO Learner on episodes played by a GAGPOEnvRunner (both local, no Ray cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from gagpo_rllib.algorithm import task_plan
from gagpo_rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.learner import GAGPOTorchLearner
from tests.gagpo_rllib.toy_env import CorridorEnv, make_config


def _setup(path: Path, **gagpo):
    config = make_config(path, **gagpo)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    learner = config.build_learner(env=CorridorEnv())
    return config, runner, learner


def _episodes(runner: GAGPOEnvRunner, config, iteration: int = 0):
    plan = task_plan(
        runner.num_tasks(),
        groups=config.groups_per_iteration,
        group_size=config.group_size,
        seed=config.seed,
        iteration=iteration,
    )
    episodes, _ = runner.sample_groups(plan, gen_seed=iteration)
    return episodes


@pytest.mark.parametrize("constrained", [True, False])
def test_first_minibatch_ratio_is_one(tiny_policy_path: Path, constrained: bool) -> None:
    config, runner, learner = _setup(tiny_policy_path, constrained_decoding=constrained, max_new_tokens=6)
    assert isinstance(learner, GAGPOTorchLearner)
    episodes = _episodes(runner, config)
    # Prompts of different lengths in one batch: the learner's forward runs on left-padded prompts.
    lengths = {len(p) for e in episodes for p in e.get_extra_model_outputs("prompt_ids")}
    assert len(lengths) > 1
    results = learner.update(episodes=episodes, minibatch_size=4, num_epochs=2, shuffle_batch_per_epoch=True)
    stats = results[DEFAULT_MODULE_ID]
    assert stats["first_minibatch_ratio_max_dev"] < 1e-4
    # Later minibatches see a moved policy: the ratio leaves 1.
    assert stats["ratio_max"] > 1.0 + 1e-4 or stats["ratio_min"] < 1.0 - 1e-4
    for key in ("policy_loss", "kl", "entropy", "clip_fraction", "gradients_default_optimizer_global_norm"):
        assert key in stats


def test_update_raises_the_probability_of_positive_advantage_actions(tiny_policy_path: Path) -> None:
    config, runner, learner = _setup(tiny_policy_path, estimator="grpo", kl_coeff=0.0, entropy_coeff=0.0)
    episodes = _episodes(runner, config)
    connector = config.grouped_advantages()
    module = learner.module[DEFAULT_MODULE_ID]
    batch = connector(rl_module=learner.module, batch={}, episodes=episodes)[DEFAULT_MODULE_ID]
    assert (batch["advantages"] != 0).any(), "the sampled groups must differ for this check"
    with torch.no_grad():
        before = module.forward_train(batch)
    learner.update(episodes=episodes, num_epochs=1)
    with torch.no_grad():
        after = module.forward_train(batch)
    step_logp = lambda f: (f["logp"] * f["mask"]).sum(-1)  # noqa: E731
    delta = step_logp(after) - step_logp(before)
    adv = batch["advantages"]
    assert delta[adv > 0].mean() > 0 > delta[adv < 0].mean()


def test_weights_reach_the_runner(tiny_policy_path: Path) -> None:
    config, runner, learner = _setup(tiny_policy_path)
    learner.update(episodes=_episodes(runner, config), num_epochs=1)
    runner.set_state(
        {"rl_module": learner.get_state(components="rl_module", inference_only=True)["rl_module"]}
    )
    new = learner.module[DEFAULT_MODULE_ID].model.state_dict()
    for k, v in runner.module.model.state_dict().items():
        torch.testing.assert_close(v, new[k])
