"""bf16 training on the learner: fp32 master weights that move at lr 1e-6, a bf16 rollout copy, exact checkpoints.

All on CPU (bf16 autocast), with a local EnvRunner and a local learner.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import task_plan
from gagpo_rllib.rllib.groups import episode_rows, uniform_groups
from tests.gagpo_rllib.toy_env import CorridorEnv, make_config


def _config(path: Path, **gagpo):
    return make_config(path, dtype="bfloat16", groups_per_iteration=3, **gagpo).training(
        lr=1e-6, minibatch_size=None, num_epochs=1
    )


def _episodes(runner: GAGPOEnvRunner, config) -> list:
    """Episodes with at least one group whose rollouts differ (non-zero advantages)."""
    for iteration in range(20):
        plan = task_plan(
            runner.num_tasks(), groups=3, group_size=config.group_size, seed=config.seed, iteration=iteration
        )
        episodes, _ = runner.sample_groups(plan, gen_seed=iteration)
        rows = episode_rows(episodes, config.invalid_penalty)
        if len(uniform_groups(rows)) < 3:
            return episodes
    raise AssertionError("no batch with a trainable group in 20 iterations")


def _projections(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("proj.weight")}


@pytest.fixture(scope="module")
def mixed(tiny_policy_path: Path):
    config = _config(tiny_policy_path)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    return config, runner, _episodes(runner, config)


def _changed_share(learner, episodes) -> float:
    model = learner.module[DEFAULT_MODULE_ID].model
    before = _projections(model)
    learner.update(episodes=episodes, num_epochs=1, minibatch_size=None)
    after = _projections(model)
    changed = sum(int((after[n] != w).sum()) for n, w in before.items())
    return changed / sum(w.numel() for w in before.values())


def test_one_bf16_update_at_lr_1e6_moves_the_fp32_masters(mixed) -> None:
    config, runner, episodes = mixed
    learner = config.build_learner(env=CorridorEnv())
    module = learner.module[DEFAULT_MODULE_ID]
    assert all(p.dtype == torch.float32 for p in module.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in module.reference_model.parameters())
    optim = next(iter(learner._named_optimizers.values()))
    assert _changed_share(learner, episodes) >= 0.9
    assert all(t.dtype == torch.float32 for s in optim.state.values() for t in s.values() if t.dim())

    # The EnvRunner's copy is the learner's weights cast to bf16.
    state = learner.get_state(components="rl_module", inference_only=True)["rl_module"]
    assert all(v.dtype == torch.bfloat16 for v in state[DEFAULT_MODULE_ID].values() if v.is_floating_point())
    runner.set_state({"rl_module": state})
    rollout = dict(runner.module.model.named_parameters())
    for name, param in module.model.named_parameters():
        assert rollout[name].dtype == torch.bfloat16
        assert torch.equal(rollout[name], param.detach().to(torch.bfloat16)), name


def test_pure_bf16_rounds_the_update_away_and_warns(mixed, tiny_policy_path: Path, caplog) -> None:
    _, _, episodes = mixed
    config = _config(tiny_policy_path, pure_low_precision=True)
    with caplog.at_level(logging.WARNING, logger="gagpo_rllib.rllib.algorithm"):
        config.validate()
    assert "pure_low_precision" in caplog.text
    learner = config.build_learner(env=CorridorEnv())
    assert all(p.dtype == torch.bfloat16 for p in learner.module[DEFAULT_MODULE_ID].model.parameters())
    assert _changed_share(learner, episodes) < 0.5


def _optimizer_state(learner) -> list[torch.Tensor]:
    optim = next(iter(learner._named_optimizers.values()))
    return [t.clone() for s in optim.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("pure", [False, True])
def test_bf16_checkpoints_restore_weights_and_optimizer_bit_exact(
    mixed, tiny_policy_path: Path, tmp_path: Path, pure: bool
) -> None:
    _, _, episodes = mixed
    config = _config(tiny_policy_path, pure_low_precision=pure)
    config.validate()
    learner = config.build_learner(env=CorridorEnv())
    learner.update(episodes=episodes, num_epochs=1, minibatch_size=None)
    weights = {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].state_dict().items()}
    state = _optimizer_state(learner)
    expected_dtype = torch.bfloat16 if pure else torch.float32
    assert any(t.dtype == expected_dtype and t.dim() for t in state)
    learner.save_to_path(tmp_path / "learner")

    fresh = config.build_learner(env=CorridorEnv())
    fresh.restore_from_path(tmp_path / "learner")
    restored = fresh.module[DEFAULT_MODULE_ID].state_dict()
    for k, v in weights.items():
        assert restored[k].dtype == v.dtype and torch.equal(restored[k], v), k
    again = _optimizer_state(fresh)
    assert len(again) == len(state)
    for a, b in zip(state, again, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
