"""Learner connector: grouped episodes -> compute_advantages on (shaped) step rows -> padded token batch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from transformers import AutoTokenizer

from envs.spaces import TextSpace
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages
from gagpo_rllib.policy.generation.base import action_token_ids, allowed_token_masks
from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages
from gagpo_rllib.rllib.groups import episode_rows, stamp_training_groups, uniform_groups

ADMISSIBLE = ["go left", "go right", "look"]


@pytest.fixture(scope="module")
def module(tiny_policy_path: Path) -> SimpleNamespace:
    tok = AutoTokenizer.from_pretrained(tiny_policy_path)
    return SimpleNamespace(tokenizer=tok, pad_token_id=tok.pad_token_id, vocab_size=len(tok))


def _episode(module, group: int, states: list[str], rewards: list[float], invalid: list[bool], seed: int):
    """An episode through ``states`` (one more than steps), actions drawn from the admissible ones."""
    rng = np.random.default_rng(seed)
    ids = action_token_ids(module.tokenizer, ADMISSIBLE)
    ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    info = {"task": "t", "admissible_actions": ADMISSIBLE}
    ep.add_env_reset(observation=states[0], infos={**info, "state_key": states[0]})
    for t, r in enumerate(rewards):
        act = ids[int(rng.integers(len(ids)))]
        prompt = rng.integers(3, 500, size=int(rng.integers(2, 9))).tolist()
        ep.add_env_step(
            observation=states[t + 1],
            action="x",
            reward=r,
            infos={**info, "state_key": states[t + 1]},
            terminated=t == len(rewards) - 1,
            extra_model_outputs={
                Columns.PROMPT_IDS: prompt,
                Columns.ACTION_IDS: act,
                Columns.ACTION_LOGP: (-rng.random(len(act))).tolist(),
                Columns.INVALID: invalid[t],
            },
        )
    ep.custom_data["group_id"] = group
    return ep


@pytest.fixture
def episodes(module) -> list[SingleAgentEpisode]:
    return [
        _episode(module, 7, ["s0", "s1", "s2"], [0.0, 10.0], [False, False], 0),
        _episode(module, 7, ["s0", "s3", "s1", "s2"], [0.0, 0.0, 10.0], [True, False, False], 1),
        _episode(module, 7, ["s0", "s3", "s5", "s4"], [0.0, 0.0, 0.0], [False, True, False], 2),
        _episode(module, 9, ["u0", "u1"], [0.0], [False], 3),
        _episode(module, 9, ["u0", "u1"], [0.0], [False], 4),
    ]


def _expected(episodes, estimator: str, penalty: float) -> np.ndarray:
    cols = {"group_id": [], "episode_id": [], "reward": [], "state_key": []}
    for ep in episodes:
        inv = ep.get_extra_model_outputs(Columns.INVALID)
        for t in range(len(ep)):
            cols["group_id"].append(ep.custom_data["group_id"])
            cols["episode_id"].append(ep.id_)
            cols["reward"].append(ep.get_rewards(t) - penalty * inv[t])
            cols["state_key"].append(ep.get_infos(t)["state_key"])
    return compute_advantages(cols, estimator=estimator, gamma=0.9, lam=0.8)


@pytest.mark.parametrize("estimator", ["gagpo", "gigpo", "grpo", "rloo"])
def test_advantages_equal_compute_advantages_on_shaped_rewards(module, episodes, estimator: str) -> None:
    conn = GroupedAdvantages(estimator=estimator, gamma=0.9, lam=0.8, invalid_penalty=0.5)
    out = conn(rl_module=module, batch={}, episodes=episodes)[DEFAULT_MODULE_ID]
    expected = _expected(episodes, estimator, 0.5)
    np.testing.assert_allclose(out["advantages"].numpy(), expected, rtol=1e-6, atol=1e-6)
    # The penalty changes the learning signal: without it the advantages differ.
    assert not np.allclose(expected, _expected(episodes, estimator, 0.0))


def test_rows_and_padding(module, episodes) -> None:
    out = GroupedAdvantages()(rl_module=module, batch={}, episodes=episodes)[DEFAULT_MODULE_ID]
    rows = episode_rows(episodes, 0.1)
    n = sum(len(e) for e in episodes)
    assert out["prompt_ids"].shape[0] == out["action_ids"].shape[0] == len(out["advantages"]) == n
    pad = module.pad_token_id
    for i in range(n):
        p, a, lp = rows.prompt_ids[i], rows.action_ids[i], rows.old_logp[i]
        assert out["prompt_len"][i] == len(p) and out["action_len"][i] == len(a)
        width = out["prompt_ids"].shape[1]
        assert out["prompt_ids"][i, width - len(p) :].tolist() == p  # left padded
        assert (out["prompt_ids"][i, : width - len(p)] == pad).all()
        assert out["action_ids"][i, : len(a)].tolist() == a  # right padded
        torch.testing.assert_close(out["old_logp"][i, : len(a)], torch.tensor(lp, dtype=torch.float32))
        assert (out["old_logp"][i, len(a) :] == 0).all()
    assert out["invalid"].tolist() == [float(x) for x in rows.invalid]
    assert "allowed_ids" not in out


def test_constrained_batch_rebuilds_the_sampling_masks(module, episodes) -> None:
    out = GroupedAdvantages(constrained=True)(rl_module=module, batch={}, episodes=episodes)[
        DEFAULT_MODULE_ID
    ]
    rows = episode_rows(episodes, 0.1)
    for i, (adm, act) in enumerate(zip(rows.admissible, rows.action_ids, strict=True)):
        want = allowed_token_masks(module.tokenizer, adm, act, module.vocab_size)
        for k in range(len(act)):
            ids = out["allowed_ids"][i, k]
            got = torch.zeros(module.vocab_size, dtype=torch.bool)
            got[ids[ids >= 0]] = True
            assert torch.equal(got, want[k])


def test_skip_uniform_groups_drops_groups_with_equal_returns(module, episodes) -> None:
    rows = episode_rows(episodes, 0.1)
    assert uniform_groups(rows) == {9}
    metrics = MetricsLogger()
    conn = GroupedAdvantages(estimator="grpo", skip_uniform_groups=True)
    out = conn(rl_module=module, batch={}, episodes=episodes, metrics=metrics)[DEFAULT_MODULE_ID]
    assert len(out["advantages"]) == sum(len(e) for e in episodes[:3])
    np.testing.assert_allclose(out["advantages"].numpy(), _expected(episodes, "grpo", 0.1)[:8], atol=1e-6)
    assert metrics.peek(("gagpo", "num_groups_skipped")) == 1.0
    assert metrics.peek(("gagpo", "num_groups_in_batch")) == 2.0
    # Of the 10 steps only the one in s5 sees a state no other step of its group sees.
    assert 0.0 < metrics.peek(("gagpo", "singleton_share")) < 1.0


def test_the_drivers_stamp_decides_which_groups_train(module, episodes) -> None:
    decision = stamp_training_groups(episodes, invalid_penalty=0.1, skip_uniform_groups=True)
    assert decision.skipped == {9}
    metrics = MetricsLogger()
    # The connector's own setting is not consulted once the driver has decided.
    out = GroupedAdvantages(estimator="grpo")(rl_module=module, batch={}, episodes=episodes, metrics=metrics)
    assert len(out[DEFAULT_MODULE_ID]["advantages"]) == sum(len(e) for e in episodes[:3])
    assert metrics.peek(("gagpo", "num_groups_skipped")) == 1.0
    del episodes[0].custom_data[Columns.TRAINS]
    with pytest.raises(ValueError, match="1 of 5 episodes lack"):
        GroupedAdvantages()(rl_module=module, batch={}, episodes=episodes)


def test_missing_group_and_incomplete_episode_are_errors(module, episodes) -> None:
    del episodes[0].custom_data["group_id"]
    with pytest.raises(KeyError, match="group_id"):
        GroupedAdvantages()(rl_module=module, batch={}, episodes=episodes)
    ep = SingleAgentEpisode(observation_space=TextSpace(), action_space=TextSpace())
    ep.add_env_reset(observation="o", infos={"state_key": "o"})
    ep.custom_data["group_id"] = 1
    with pytest.raises(ValueError, match="not complete"):
        GroupedAdvantages()(rl_module=module, batch={}, episodes=[ep])


def test_an_info_without_state_key_names_the_key_and_the_step(module) -> None:
    ep = _episode(module, 0, ["a", "b", "c"], [0.0, 1.0], [False, False], seed=0)
    del ep.get_infos(1)["state_key"]
    with pytest.raises(
        KeyError, match=r"env info at step 1 of episode .* lacks required key\(s\) \['state_key'\]"
    ):
        episode_rows([ep], invalid_penalty=0.1)


@pytest.mark.parametrize("constrained", [False, True])
def test_recomputed_old_logprobs_come_from_the_learner_weights(tiny_policy_path: Path, episodes, constrained):
    """The update's no-grad pass: old log-probs from the learner's weights, reference log-probs from the
    frozen reference (here moved away from the policy, so the two differ), both per row of the batch."""
    from envs.spaces import TextSpace
    from gagpo_rllib.policy.logprobs import action_logprobs
    from gagpo_rllib.policy.rl_module import LLMRLModule

    module = LLMRLModule(
        observation_space=TextSpace(),
        action_space=TextSpace(),
        inference_only=False,
        model_config={"model_path": str(tiny_policy_path), "sampling": {"temperature": 0.7}},
    )
    with torch.no_grad():
        for p in module.reference_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model, tok = module.model, module.tokenizer
    rows = episode_rows(episodes, 0.1)
    masks = (
        [
            allowed_token_masks(tok, adm, act, module.vocab_size)
            for adm, act in zip(rows.admissible, rows.action_ids, strict=True)
        ]
        if constrained
        else None
    )
    with torch.no_grad():
        expected, mask, _ = action_logprobs(
            model,
            rows.prompt_ids,
            rows.action_ids,
            pad_token_id=tok.pad_token_id,
            temperature=0.7,
            allowed_masks=masks,
        )
    expected = expected * mask

    metrics = MetricsLogger()
    module.train_chunk_tokens = 24  # several chunks
    connector = GroupedAdvantages(constrained=constrained, recompute_old_logprobs=True)
    data = connector(rl_module=module, batch={}, episodes=episodes, metrics=metrics)[DEFAULT_MODULE_ID]
    width = data["old_logp"].shape[1]
    torch.testing.assert_close(data["old_logp"], expected[:, :width].float(), atol=1e-6, rtol=0)
    with torch.no_grad():
        ref, _, _ = action_logprobs(
            module.reference_model,
            rows.prompt_ids,
            rows.action_ids,
            pad_token_id=tok.pad_token_id,
            temperature=0.7,
            allowed_masks=masks,
        )
    assert (ref * mask - expected).abs().max() > 1e-3
    torch.testing.assert_close(data["ref_logp"], (ref * mask)[:, :width].float(), atol=1e-6, rtol=0)
    # The episodes' stored (rollout) log-probs are random numbers: the logged deviation shows they were replaced.
    assert metrics.peek(("gagpo", "old_logp_rollout_max_dev")) > 0.01

    kept = GroupedAdvantages(constrained=constrained)(rl_module=module, batch={}, episodes=episodes)
    stored = kept[DEFAULT_MODULE_ID]["old_logp"]
    assert stored[0, : len(rows.old_logp[0])].tolist() == pytest.approx(rows.old_logp[0])
