"""Similarity grouping: threshold 1 is exact matching, one object id apart groups at 0.9 and not at 1, the same
batch always gives the same groups (in any row order), chains resolve by anchors, groups never mix."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from rapidfuzz.distance import Indel
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from benchmarks.bench_advantages import make_text_batch
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages, grouping_diagnostics
from gagpo_rllib.method.similarity import anchor_keys
from gagpo_rllib.rllib.connectors.grouped_advantages import GroupedAdvantages

A = "You arrive at drawer 3. On the drawer 3, you see a keychain 2, a pen 1, and a creditcard 1."
B = A.replace("keychain 2", "keychain 1")  # one object id apart


def partition(keys: list) -> list[int]:
    codes: dict = {}
    return [codes.setdefault(k, len(codes)) for k in keys]


def test_threshold_one_equals_exact_matching_on_the_benchmark_batch() -> None:
    table = make_text_batch(3_000, seed=1)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    anchored = anchor_keys(cols["group_id"], cols["state_key"], 1.0)
    assert anchored == cols["state_key"]
    np.testing.assert_array_equal(
        compute_advantages({**cols, "state_key": anchored}), compute_advantages(cols)
    )
    # At 0.9 the near-identical texts of the batch merge: fewer, larger state groups.
    exact = grouping_diagnostics(cols)
    merged = grouping_diagnostics(
        {**cols, "state_key": anchor_keys(cols["group_id"], cols["state_key"], 0.9)}
    )
    assert merged["num_state_groups"] < exact["num_state_groups"]
    assert merged["singleton_share"] < exact["singleton_share"]


def test_one_object_id_apart_groups_at_0_9_not_at_1() -> None:
    groups, keys = [0, 0, 0], [A, B, A]
    assert anchor_keys(groups, keys, 0.9) == [A, A, A]  # A is seen twice: it is the anchor
    assert anchor_keys(groups, keys, 1.0) == [A, B, A]
    # GAGPO's V pools the two states at 0.9: the step at B gets the shared V, so its advantage changes.
    cols = {"group_id": groups, "episode_id": [0, 1, 2], "reward": [10.0, 0.0, 0.0], "state_key": keys}
    exact = compute_advantages(cols, norm="none")
    merged = compute_advantages({**cols, "state_key": anchor_keys(groups, keys, 0.9)}, norm="none")
    np.testing.assert_allclose(exact, [5.0, 0.0, -5.0])
    np.testing.assert_allclose(merged, [10 - 10 / 3, -10 / 3, -10 / 3])


def test_same_batch_same_groups_in_any_row_order() -> None:
    table = make_text_batch(2_000, seed=4)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    first = anchor_keys(cols["group_id"], cols["state_key"], 0.85)
    assert anchor_keys(cols["group_id"], cols["state_key"], 0.85) == first
    order = np.random.default_rng(0).permutation(len(first))
    shuffled = anchor_keys([cols["group_id"][i] for i in order], [cols["state_key"][i] for i in order], 0.85)
    assert shuffled == [first[i] for i in order]


def test_chain_resolves_to_the_anchor_not_transitively() -> None:
    a, b, c = "abcdefghij", "abcdefghXY", "abcdefVWXY"

    assert Indel.normalized_similarity(a, b) == Indel.normalized_similarity(b, c) == pytest.approx(0.8)
    assert Indel.normalized_similarity(a, c) == pytest.approx(0.6)
    # a is the most frequent text, so the first anchor; c (visited before b: "V" < "g") is not similar to a and
    # becomes an anchor; b is as similar to both anchors and joins the earlier one, a.
    assert anchor_keys([0] * 4, [a, a, b, c], 0.75) == [a, a, a, c]
    # Equal counts: visited in text order c, b, a; b joins c; a is not similar to c: its own anchor.
    assert anchor_keys([0] * 3, [a, b, c], 0.75) == [a, c, c]


def test_groups_never_mix_and_bad_thresholds_name_the_field() -> None:
    assert anchor_keys([0, 1], [A, B], 0.5) == [A, B]
    for bad in (0.0, 1.5, "0.9", True, -1):
        with pytest.raises(ValueError, match="similarity_threshold"):
            GAGPOConfig().llm(model_path="m").gagpo(similarity_threshold=bad).validate_gagpo()


def _episode(group: int, states: list[str], rewards: list[float]) -> SingleAgentEpisode:
    ep = SingleAgentEpisode()
    ep.add_env_reset(observation=states[0], infos={"state_key": states[0]})
    for t, r in enumerate(rewards):
        ep.add_env_step(
            observation=states[t + 1],
            action="x",
            reward=r,
            infos={"state_key": states[t + 1]},
            terminated=t == len(rewards) - 1,
            extra_model_outputs={
                Columns.PROMPT_IDS: [3, 4],
                Columns.ACTION_IDS: [5],
                Columns.ACTION_LOGP: [-0.1],
                Columns.INVALID: False,
            },
        )
    ep.custom_data["group_id"] = group
    return ep


def test_the_learner_connector_groups_by_similarity_when_configured() -> None:
    episodes = [_episode(0, [A, "x", "end"], [0.0, 10.0]), _episode(0, [B, "y"], [0.0])]
    module = SimpleNamespace(pad_token_id=0, tokenizer=None, vocab_size=10)
    module.unwrapped = lambda: module
    config = GAGPOConfig().gagpo(similarity_threshold=0.9, norm="none", lam=1.0)

    def adv(connector: GroupedAdvantages) -> list[float]:
        batch = connector(rl_module=module, batch={}, episodes=episodes)
        return batch[DEFAULT_MODULE_ID]["advantages"].tolist()

    # lam = 1: A_t = R_t - V(s_t). Merged: V(A~B) = mean(0.95 * 10, 0) = 4.75.
    assert adv(config.grouped_advantages()) == pytest.approx([9.5 - 4.75, 0.0, 0.0 - 4.75])
    config.gagpo(similarity_threshold=None)
    assert adv(config.grouped_advantages()) == pytest.approx([0.0, 0.0, 0.0])
