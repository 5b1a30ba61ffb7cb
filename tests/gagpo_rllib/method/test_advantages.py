"""The estimators against hand-computed cases, the GAE identities, and every rejected input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagpo_rllib.method.advantages import ESTIMATORS, compute_advantages, critic_gae, grouping_diagnostics

G = 0.95
# The estimators that need no critic values (PPO's own tests are at the end).
GROUPED = tuple(e for e in ESTIMATORS if e != "ppo")


def two_episode_group() -> dict:
    """One group: episode a visits s0, s1, s2 and wins (10 at the end); episode b visits s0, s1 and fails."""
    return {
        "group_id": [0, 0, 0, 0, 0],
        "episode_id": ["a", "a", "a", "b", "b"],
        "reward": [0.0, 0.0, 10.0, 0.0, 0.0],
        "state_key": ["s0", "s1", "s2", "s0", "s1"],
    }


def test_gagpo_hand_computed_without_normalisation():
    # Returns-to-go: a = [9.025, 9.5, 10], b = [0, 0].  V(s0) = 4.5125, V(s1) = 4.75, V(s2) = 10.
    # TD residuals: a = [0.95*4.75 - 4.5125, 0.95*10 - 4.75, 10 - 10] = [0, 4.75, 0]; b = [0, -4.75].
    # GAE with gamma*lam = 0.9025: a = [0.9025*4.75, 4.75, 0], b = [-0.9025*4.75, -4.75].
    adv = compute_advantages(two_episode_group(), estimator="gagpo", gamma=G, lam=G, norm="none")
    np.testing.assert_allclose(adv, [4.286875, 4.75, 0.0, -4.286875, -4.75], atol=1e-12)


def test_gagpo_group_normalisation_uses_unbiased_std():
    raw = np.array([4.286875, 4.75, 0.0, -4.286875, -4.75])
    adv = compute_advantages(two_episode_group(), estimator="gagpo", gamma=G, lam=G, norm="mean_std")
    np.testing.assert_allclose(adv, (raw - raw.mean()) / (raw.std(ddof=1) + 1e-6), atol=1e-12)
    centred = compute_advantages(two_episode_group(), estimator="gagpo", gamma=G, lam=G, norm="mean")
    np.testing.assert_allclose(centred, raw - raw.mean(), atol=1e-12)


def test_gagpo_value_pools_revisits_and_any_time_index():
    # One episode revisits s0 at steps 0 and 2; the other sees s0 at step 1. V(s0) pools all three.
    cols = {
        "group_id": [7, 7, 7, 7, 7],
        "episode_id": [1, 1, 1, 2, 2],
        "reward": [0.0, 0.0, 1.0, 0.0, 0.0],
        "state_key": ["s0", "x", "s0", "y", "s0"],
    }
    gamma = 0.5
    # Returns-to-go: ep1 = [0.25, 0.5, 1.0], ep2 = [0, 0]. V(s0) = (0.25 + 1.0 + 0) / 3.
    v_s0 = (0.25 + 1.0 + 0.0) / 3
    v_x, v_y = 0.5, 0.0
    delta = [
        0 + gamma * v_x - v_s0,
        0 + gamma * v_s0 - v_x,
        1.0 - v_s0,
        0 + gamma * v_s0 - v_y,
        0 - v_s0,
    ]
    adv = compute_advantages(cols, estimator="gagpo", gamma=gamma, lam=0.0, norm="none")
    np.testing.assert_allclose(adv, delta, atol=1e-12)


def test_grpo_hand_computed():
    adv = compute_advantages(two_episode_group(), estimator="grpo")
    # Episode returns 10 and 0: mean 5, unbiased std sqrt(50).
    z = 5.0 / (np.sqrt(50.0) + 1e-6)
    np.testing.assert_allclose(adv, [z, z, z, -z, -z], atol=1e-12)


def test_rloo_hand_computed():
    cols = {
        "group_id": [0, 0, 0, 0],
        "episode_id": [0, 1, 2, 2],
        "reward": [3.0, 6.0, 1.0, 8.0],
        "state_key": ["a", "a", "a", "b"],
    }
    # Returns 3, 6, 9: leave-one-out baselines 7.5, 6, 4.5.
    adv = compute_advantages(cols, estimator="rloo")
    np.testing.assert_allclose(adv, [-4.5, 0.0, 4.5, 4.5], atol=1e-12)


def test_gigpo_hand_computed():
    cols = two_episode_group()
    episode_term = 5.0 / (np.sqrt(50.0) + 1e-6) * np.array([1, 1, 1, -1, -1])
    # Step groups: s0 -> returns {9.025, 0}, s1 -> {9.5, 0}, s2 singleton -> 0.
    step_mean = np.array([9.025 / 2, 9.5 / 2, 0.0, -9.025 / 2, -9.5 / 2])
    adv = compute_advantages(cols, estimator="gigpo", gamma=G, norm="mean", omega=1.0)
    np.testing.assert_allclose(adv, episode_term + step_mean, atol=1e-12)
    std0, std1 = np.std([9.025, 0], ddof=1), np.std([9.5, 0], ddof=1)
    step_std = step_mean / (np.array([std0, std1, 1.0, std0, std1]) + 1e-6)
    adv = compute_advantages(cols, estimator="gigpo", gamma=G, norm="mean_std", omega=0.5)
    np.testing.assert_allclose(adv, episode_term + 0.5 * step_std, atol=1e-12)


def test_state_keys_of_different_groups_never_mix():
    cols = {
        "group_id": [0, 0, 1, 1],
        "episode_id": [0, 1, 2, 3],
        "reward": [10.0, 0.0, 0.0, 0.0],
        "state_key": ["s", "s", "s", "s"],
    }
    adv = compute_advantages(cols, estimator="gagpo", norm="none")
    # Group 0: V(s) = 5, A = [5, -5]. Group 1: V(s) = 0, A = [0, 0].
    np.testing.assert_allclose(adv, [5.0, -5.0, 0.0, 0.0], atol=1e-12)


def test_accepts_pyarrow_bytes_and_int_keys():
    base = two_episode_group()
    expected = compute_advantages(base, norm="none")
    as_bytes = dict(base, state_key=[k.encode() for k in base["state_key"]])
    as_int = dict(base, state_key=[int(k[1]) for k in base["state_key"]])
    np.testing.assert_allclose(compute_advantages(as_bytes, norm="none"), expected)
    np.testing.assert_allclose(compute_advantages(as_int, norm="none"), expected)
    np.testing.assert_allclose(compute_advantages(pa.table(base), norm="none"), expected)


@pytest.mark.parametrize("estimator", GROUPED)
@pytest.mark.parametrize(
    "cols",
    [
        {"group_id": [0], "episode_id": [0], "reward": [10.0], "state_key": ["s"]},  # group of one, one step
        {
            "group_id": [0, 0],
            "episode_id": [0, 1],
            "reward": [1.0, 1.0],
            "state_key": ["a", "b"],
        },  # all equal
        {"group_id": [0, 0, 0], "episode_id": [0, 0, 1], "reward": [0.0, 0.0, 0.0], "state_key": [1, 2, 3]},
    ],
    ids=["single", "equal-returns", "all-unique"],
)
def test_edge_cases_are_finite(estimator, cols):
    adv = compute_advantages(cols, estimator=estimator, norm="mean" if estimator == "gigpo" else "mean_std")
    assert adv.shape == (len(cols["reward"]),)
    assert np.all(np.isfinite(adv))


def test_equal_returns_and_unique_states_give_zero():
    cols = {"group_id": [0, 0], "episode_id": [0, 1], "reward": [1.0, 1.0], "state_key": ["a", "b"]}
    for estimator in GROUPED:
        norm = "mean" if estimator == "gigpo" else "mean_std"
        np.testing.assert_allclose(
            compute_advantages(cols, estimator=estimator, norm=norm), [0.0, 0.0], atol=1e-9
        )


def test_empty_input_gives_empty_array():
    cols = {"group_id": [], "episode_id": [], "reward": [], "state_key": []}
    for estimator in GROUPED:
        norm = "mean" if estimator == "gigpo" else "mean_std"
        out = compute_advantages(cols, estimator=estimator, norm=norm)
        assert out.shape == (0,)


# --- properties -------------------------------------------------------------------------------------------


@st.composite
def grouped_batches(draw):
    """Random groups of episodes with states from a small pool, so states repeat within and across episodes."""
    n_groups = draw(st.integers(1, 4))
    group_id, episode_id, reward, state_key = [], [], [], []
    episode = 0
    for g in range(n_groups):
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 6))
            for _ in range(length):
                group_id.append(g * 10 + 3)
                episode_id.append(episode)
                reward.append(draw(st.sampled_from([0.0, 0.0, 1.0, -0.5, 10.0])))
                state_key.append(f"s{draw(st.integers(0, 3))}")
            episode += 1
    return {"group_id": group_id, "episode_id": episode_id, "reward": reward, "state_key": state_key}


def reference_terms(cols, gamma):
    """R_t and V(s_t) computed the slow obvious way."""
    n = len(cols["reward"])
    returns = np.zeros(n)
    for i in range(n - 1, -1, -1):
        last = i == n - 1 or cols["episode_id"][i + 1] != cols["episode_id"][i]
        returns[i] = cols["reward"][i] + (0.0 if last else gamma * returns[i + 1])
    keys = list(zip(cols["group_id"], cols["state_key"], strict=True))
    value = np.array([np.mean([returns[j] for j in range(n) if keys[j] == keys[i]]) for i in range(n)])
    last = np.array([i == n - 1 or cols["episode_id"][i + 1] != cols["episode_id"][i] for i in range(n)])
    return returns, value, last


@settings(max_examples=60, deadline=None)
@given(batch=grouped_batches(), gamma=st.floats(0.0, 1.0))
def test_lambda_one_gives_return_minus_value(batch, gamma):
    returns, value, _ = reference_terms(batch, gamma)
    adv = compute_advantages(batch, estimator="gagpo", gamma=gamma, lam=1.0, norm="none")
    np.testing.assert_allclose(adv, returns - value, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(batch=grouped_batches(), gamma=st.floats(0.0, 1.0))
def test_lambda_zero_gives_one_step_td_residual(batch, gamma):
    _, value, last = reference_terms(batch, gamma)
    next_value = np.where(last, 0.0, np.r_[value[1:], 0.0])
    delta = np.asarray(batch["reward"]) + gamma * next_value - value
    adv = compute_advantages(batch, estimator="gagpo", gamma=gamma, lam=0.0, norm="none")
    np.testing.assert_allclose(adv, delta, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(batch=grouped_batches(), data=st.data())
def test_invariant_to_the_order_of_groups(batch, data):
    groups = sorted(set(batch["group_id"]))
    order = data.draw(st.permutations(groups))
    rows = [i for g in order for i in range(len(batch["reward"])) if batch["group_id"][i] == g]
    permuted = {k: [v[i] for i in rows] for k, v in batch.items()}
    for estimator in GROUPED:
        norm = "mean_std"
        expected = compute_advantages(batch, estimator=estimator, norm=norm)[rows]
        np.testing.assert_allclose(
            compute_advantages(permuted, estimator=estimator, norm=norm), expected, atol=1e-9
        )


@settings(max_examples=40, deadline=None)
@given(batch=grouped_batches())
def test_normalised_advantages_have_zero_mean_per_group(batch):
    adv = compute_advantages(batch, estimator="gagpo", norm="mean_std")
    groups = np.asarray(batch["group_id"])
    for g in set(batch["group_id"]):
        assert abs(adv[groups == g].mean()) < 1e-9


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"estimator": "a2c"}, "unknown estimator"),
        ({"norm": "zscore"}, "unknown norm"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"lam": 1.01}, "lam"),
        ({"lam": float("nan")}, "lam"),
        ({"estimator": "gigpo", "norm": "none"}, "gigpo"),
    ],
)
def test_bad_options_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_advantages(two_episode_group(), **kwargs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reward": [0.0, 1.0]}, "different lengths"),
        ({"reward": [0.0, float("nan"), 0.0, 0.0, 0.0]}, "NaN/inf"),
        ({"reward": [0.0, float("inf"), 0.0, 0.0, 0.0]}, "NaN/inf"),
        ({"episode_id": ["a", "b", "a", "b", "b"]}, "contiguous"),
        ({"group_id": [0, 0, 1, 1, 1]}, "split across two groups"),
        ({"group_id": [0.5, 0, 0, 0, 0]}, "group_id"),
    ],
)
def test_bad_columns_raise(change, message):
    with pytest.raises(ValueError, match=message):
        compute_advantages({**two_episode_group(), **change})


@pytest.mark.parametrize("missing", ["group_id", "episode_id", "reward", "state_key"])
def test_missing_column_is_named(missing):
    cols = {k: v for k, v in two_episode_group().items() if k != missing}
    with pytest.raises(ValueError, match=f"missing column '{missing}'"):
        compute_advantages(cols)


def test_grouping_diagnostics():
    cols = two_episode_group()
    adv = np.array([0.5, 2.0, -1.5, 0.0, 0.1])
    diag = grouping_diagnostics(cols, adv)
    assert diag["singleton_share"] == pytest.approx(1 / 5)  # only s2 is seen once
    assert diag["state_group_size_mean"] == pytest.approx(5 / 3)
    assert diag["state_group_size_max"] == 2
    assert diag["adv_abs_gt1_share"] == pytest.approx(2 / 5)
    assert diag["adv_iqr"] == pytest.approx(np.percentile(adv, 75) - np.percentile(adv, 25))
    with pytest.raises(ValueError, match="one value per row"):
        grouping_diagnostics(cols, adv[:3])


def test_matches_the_per_step_dict_implementation_on_a_realistic_batch():
    from benchmarks.bench_advantages import dict_gagpo, make_batch

    table = make_batch(20_000, seed=3)
    columns = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    np.testing.assert_allclose(compute_advantages(table), dict_gagpo(**columns), atol=1e-9)


# --- PPO: GAE with a learned critic ---------------------------------------------------------------------------


def critic_episode() -> dict:
    """One winning episode of three steps and one failing episode of two, with critic values per step."""
    return {
        "group_id": [0, 0, 0, 1, 1],
        "episode_id": ["a", "a", "a", "b", "b"],
        "reward": [0.0, 1.0, 10.0, 0.0, -0.1],
        "state_key": ["s0", "s1", "s2", "s0", "s1"],
        "value": [2.0, 4.0, 8.0, 1.0, 0.5],
    }


def test_critic_gae_lam_one_is_return_to_go_minus_value():
    cols = critic_episode()
    adv, targets = critic_gae(cols, gamma=G, lam=1.0)
    returns = [0.0 + G * 1.0 + G * G * 10.0, 1.0 + G * 10.0, 10.0, 0.0 + G * -0.1, -0.1]
    np.testing.assert_allclose(adv, np.subtract(returns, cols["value"]), atol=1e-12)
    np.testing.assert_allclose(targets, returns, atol=1e-12)


def test_critic_gae_lam_zero_is_the_td_residual_with_zero_after_the_last_step():
    cols = critic_episode()
    adv, targets = critic_gae(cols, gamma=G, lam=0.0)
    v = cols["value"]
    expected = [
        0.0 + G * v[1] - v[0],
        1.0 + G * v[2] - v[1],
        10.0 - v[2],  # V after the last step = 0
        0.0 + G * v[4] - v[3],
        -0.1 - v[4],
    ]
    np.testing.assert_allclose(adv, expected, atol=1e-12)
    np.testing.assert_allclose(targets, np.add(expected, v), atol=1e-12)


def test_critic_gae_general_lambda_and_batch_whitening():
    cols = critic_episode()
    lam = 0.5
    v, r = cols["value"], cols["reward"]
    d = [r[0] + G * v[1] - v[0], r[1] + G * v[2] - v[1], r[2] - v[2], r[3] + G * v[4] - v[3], r[4] - v[4]]
    a2 = d[2]
    a1 = d[1] + G * lam * a2
    a0 = d[0] + G * lam * a1
    b1 = d[4]
    b0 = d[3] + G * lam * b1
    raw = np.array([a0, a1, a2, b0, b1])
    np.testing.assert_allclose(critic_gae(cols, gamma=G, lam=lam)[0], raw, atol=1e-12)
    # Whitening is over the whole batch (both groups together), not per group.
    whitened = (raw - raw.mean()) / (raw.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(compute_advantages(cols, estimator="ppo", lam=lam), whitened, atol=1e-12)
    np.testing.assert_allclose(
        compute_advantages(cols, estimator="ppo", lam=lam, norm="none"), raw, atol=1e-12
    )


def test_ppo_needs_a_finite_value_column():
    cols = critic_episode()
    del cols["value"]
    with pytest.raises(ValueError, match="'value'"):
        compute_advantages(cols, estimator="ppo")
    with pytest.raises(ValueError, match="'value' has 1 NaN"):
        compute_advantages({**critic_episode(), "value": [0.0, np.nan, 0.0, 0.0, 0.0]}, estimator="ppo")


def test_any_hashable_state_key_groups_like_its_string_form():
    base = two_episode_group()
    as_tuples = dict(base, state_key=[("room", k) for k in base["state_key"]])
    np.testing.assert_allclose(
        compute_advantages(as_tuples, norm="none"), compute_advantages(base, norm="none"), atol=1e-12
    )
    with pytest.raises(ValueError, match="non-hashable list at row 0"):
        compute_advantages(dict(base, state_key=[["x"]] * 5))
