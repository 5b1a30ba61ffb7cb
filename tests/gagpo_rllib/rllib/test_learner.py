"""The GAGPO Learner on episodes played by a GAGPOEnvRunner (both local, no Ray cluster needed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.learner import NONFINITE_SKIPPED, GAGPOTorchLearner
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


class RowRecordingLearner(GAGPOTorchLearner):
    """The GAGPO learner, keeping the rows each loss call saw."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        self.seen = [*getattr(self, "seen", []), _row_keys(batch)]
        return super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )


def _row_keys(batch) -> list[tuple]:
    cols = ("prompt_ids", "action_ids", "old_logp", "advantages")
    return [
        tuple(tuple(torch.as_tensor(batch[c][i]).flatten().tolist()) for c in cols)
        for i in range(len(batch["advantages"]))
    ]


def _recording_learner(tiny_policy_path: Path) -> tuple[RowRecordingLearner, list, dict]:
    """A row-recording learner, one iteration's episodes of the corridor task and their learner batch."""
    config = make_config(tiny_policy_path).training(learner_class=RowRecordingLearner)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    learner = config.build_learner(env=CorridorEnv())
    episodes = _episodes(runner, config)
    batch = config.grouped_advantages()(rl_module=learner.module, batch={}, episodes=episodes)[
        DEFAULT_MODULE_ID
    ]
    return learner, episodes, batch


def test_every_step_is_in_exactly_one_minibatch_per_epoch(tiny_policy_path: Path) -> None:
    learner, episodes, batch = _recording_learner(tiny_policy_path)
    everything = Counter(_row_keys(batch))
    n = len(batch["advantages"])
    size = next(m for m in range(4, n) if n % m)  # RLlib's int(n / size) minibatches would drop n % size rows
    results = learner.update(
        episodes=episodes, minibatch_size=size, num_epochs=2, shuffle_batch_per_epoch=True
    )
    per_epoch = -(-n // size)
    assert len(learner.seen) == 2 * per_epoch
    for epoch in range(2):
        seen = learner.seen[epoch * per_epoch : (epoch + 1) * per_epoch]
        assert all(len(rows) <= size for rows in seen)
        assert Counter(row for rows in seen for row in rows) == everything
    assert results[DEFAULT_MODULE_ID]["num_module_steps_trained"] == 2 * n


def test_one_epoch_deals_the_steps_at_random_only_when_asked(tiny_policy_path: Path) -> None:
    """shuffle_batch_per_epoch holds for a single epoch too (the PPO critic's default): still every step once."""
    learner, episodes, batch = _recording_learner(tiny_policy_path)
    everything = Counter(_row_keys(batch))
    size = max(2, len(everything) // 3)
    dealt = {}
    for shuffle in (False, True):
        learner.seen = []
        learner.update(episodes=episodes, minibatch_size=size, num_epochs=1, shuffle_batch_per_epoch=shuffle)
        assert Counter(row for rows in learner.seen for row in rows) == everything
        dealt[shuffle] = [sorted(rows) for rows in learner.seen]
    assert dealt[True] != dealt[False]


def _optimizer_state(learner) -> list[torch.Tensor]:
    optim = next(iter(learner._named_optimizers.values()))
    return [t.clone() for s in optim.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


def test_nonfinite_loss_skips_the_step_and_the_next_update_trains(tiny_policy_path: Path) -> None:
    config, runner, learner = _setup(tiny_policy_path)
    episodes = _episodes(runner, config)
    learner.update(episodes=episodes, num_epochs=1)  # the optimizer has a state to keep
    model = learner.module[DEFAULT_MODULE_ID].model
    weights, state = {k: v.clone() for k, v in model.state_dict().items()}, _optimizer_state(learner)
    batch = config.grouped_advantages()(rl_module=learner.module, batch={}, episodes=episodes)[
        DEFAULT_MODULE_ID
    ]
    poisoned = {**batch, "advantages": torch.full_like(batch["advantages"], float("nan"))}
    n = len(batch["advantages"])
    results = learner.update(
        batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(poisoned)}, n), num_epochs=1
    )
    assert results[DEFAULT_MODULE_ID][NONFINITE_SKIPPED] == 1
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    after = _optimizer_state(learner)
    assert len(after) == len(state) and all(torch.equal(a, b) for a, b in zip(after, state, strict=True))
    # The next update trains, and the weights handed out are finite.
    results = learner.update(episodes=episodes, num_epochs=1)
    assert results[DEFAULT_MODULE_ID][NONFINITE_SKIPPED] == 0
    assert any(not torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    learner.get_state(components="rl_module")
    # Weights that are not finite are never handed out (no checkpoint, no weight sync).
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(RuntimeError, match="not finite"):
        learner.get_state(components="rl_module")
