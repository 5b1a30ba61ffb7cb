"""Step-level advantages for grouped multi-turn rollouts: GAGPO and the baselines GiGPO, GRPO, RLOO and PPO.

Framework-free (numpy, scipy, pyarrow): a pure function of per-step columns, so any trainer can call it and a
reader can check it against the method in a few minutes.

Input: one row per environment step with the columns

    group_id     int          the K rollouts of one task instance share it
    episode_id   int | str    rows of one episode are contiguous and in step order
    reward       float        the step's reward r_t
    state_key    str | bytes | int, or any hashable (e.g. a tuple)   equal keys = the same environment state
    value        float        only for "ppo": the critic's V(s_t), computed before the update

GAGPO (the method):
    R_t      = sum_{u >= t} gamma^(u-t) r_u                      return-to-go inside the episode
    V(s)     = mean of R_u over every (episode, step) of the group with s_u == s
    delta_t  = r_t + gamma * V(s_{t+1}) - V(s_t)                 V after an episode's last step = 0
    A_t      = delta_t + gamma * lam * A_{t+1}                   GAE over environment steps
    A        <- (A - mean_group) / (std_group + eps)             norm "mean_std" ("mean": A - mean; "none")

Baselines, in the same engine:
    GRPO   episode return (sum of rewards) normalised over the group's episodes (mean_std), on every step
    RLOO   R_i - mean_{j != i} R_j over the group's episodes, on every step (0 for a group of one)
    GiGPO  A^E + omega * A^S: A^E the GRPO term; A^S(i, t) = R_t - mean_{G(s_t)} R, divided by
           (std_{G(s_t)} + eps) for norm "mean_std"; a state seen once in its group gets A^S = 0
    PPO    GAE with a learned critic: delta_t = r_t + gamma * V(s_{t+1}) - V(s_t) with the ``value`` column
           (V after an episode's last step = 0), A_t = delta_t + gamma * lam * A_{t+1}; ``norm`` then applies over
           the whole batch (the default "mean_std" is PPO's advantage whitening). ``critic_gae`` also gives the
           value targets R_t = A_t + V(s_t) (before whitening). Groups and state keys play no part.

Conventions: std is the unbiased sample std (ddof = 1); a set of one element is normalised with std = 1;
eps = 1e-6. GRPO and RLOO ignore ``norm``; GiGPO's step term is always centred, so it takes "mean" or "mean_std".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "ESTIMATORS",
    "NORMS",
    "REQUIRED_COLUMNS",
    "compute_advantages",
    "critic_gae",
    "grouping_diagnostics",
]

ESTIMATORS = ("gagpo", "gigpo", "grpo", "rloo", "ppo")
NORMS = ("none", "mean", "mean_std")
REQUIRED_COLUMNS = ("group_id", "episode_id", "reward", "state_key")
EPS = 1e-6


@dataclass(frozen=True)
class _Steps:
    """Validated columns, with every key replaced by a dense integer code."""

    reward: np.ndarray  # float64 [n]
    group: np.ndarray  # int64 [n], dense group code
    episode: np.ndarray  # int64 [n], dense episode code in order of first appearance (= run index)
    starts: np.ndarray  # int64 [n_episodes], first row of each episode
    lengths: np.ndarray  # int64 [n_episodes]
    episode_group: np.ndarray  # int64 [n_episodes], group code of each episode
    state_group: np.ndarray  # int64 [n], dense code of the (group, state) pair

    @property
    def n(self) -> int:
        return len(self.reward)

    @cached_property
    def scan_layout(self) -> list[tuple[np.ndarray, np.ndarray, tuple[int, int]]]:
        return _scan_layout(self)


def _column(columns: Any, name: str) -> pa.Array:
    if isinstance(columns, pa.Table):
        if name not in columns.column_names:
            raise ValueError(f"missing column {name!r}; got {columns.column_names}")
        return columns.column(name).combine_chunks()
    if not isinstance(columns, Mapping):
        raise ValueError(
            f"columns must be a pyarrow.Table or a mapping of column name -> array, got {type(columns)}"
        )
    if name not in columns:
        raise ValueError(f"missing column {name!r}; got {sorted(columns)}")
    values = columns[name]
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"column {name!r} must be 1-D, got shape {values.shape}")
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(f"column {name!r} has values of mixed or unsupported types: {err}") from err


def _state_codes(columns: Any) -> np.ndarray:
    """Dense codes of the ``state_key`` column: arrow's hash encoding for str/bytes/int keys (the fast path),
    a Python dict for a sequence holding other hashable keys (tuples of a history key, a user's key function)."""
    raw = columns.get("state_key") if isinstance(columns, Mapping) else None
    sequence = raw is not None and not isinstance(raw, (pa.Array, pa.ChunkedArray))
    if sequence and not (isinstance(raw, np.ndarray) and raw.dtype != object):
        keys = list(raw)
        if not all(isinstance(k, (str, bytes, int, np.integer)) for k in keys):
            return _hashable_codes(keys)
    return _dense_codes(_column(columns, "state_key"))


def _hashable_codes(keys: list) -> np.ndarray:
    codes: dict[Any, int] = {}
    out = np.empty(len(keys), np.int64)
    for i, key in enumerate(keys):
        if key is None:
            raise ValueError(f"column 'state_key' has a missing (None) value at row {i}")
        try:
            out[i] = codes.setdefault(key, len(codes))
        except TypeError:
            raise ValueError(
                f"column 'state_key' holds a non-hashable {type(key).__name__} at row {i}: {key!r}"
            ) from None
    return out


def _dense_codes(values: pa.Array) -> np.ndarray:
    """Hash-based dense integer codes (0..k-1 in order of first appearance); equal values share a code."""
    encoded = pc.dictionary_encode(values)
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _prepare(columns: Any) -> _Steps:
    state = _state_codes(columns)
    cols = {name: _column(columns, name) for name in REQUIRED_COLUMNS if name != "state_key"}
    cols["state_key"] = pa.array(state)
    lengths = {name: len(col) for name, col in cols.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"columns have different lengths: {lengths}")
    for name, col in cols.items():
        if col.null_count:
            raise ValueError(f"column {name!r} has {col.null_count} missing (null) values")

    if not next(iter(lengths.values())):
        empty = np.zeros(0, np.int64)
        return _Steps(np.zeros(0), empty, empty, empty, empty, empty, empty)
    group_col = cols["group_id"]
    if not pa.types.is_integer(group_col.type):
        raise ValueError(f"column 'group_id' must hold integers, got {group_col.type}")
    if not (pa.types.is_integer(cols["reward"].type) or pa.types.is_floating(cols["reward"].type)):
        raise ValueError(f"column 'reward' must hold numbers, got {cols['reward'].type}")
    reward = cols["reward"].to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    bad = ~np.isfinite(reward)
    if bad.any():
        raise ValueError(
            f"column 'reward' has {int(bad.sum())} NaN/inf values (first at row {int(np.argmax(bad))})"
        )

    n = len(reward)
    episode_col = cols["episode_id"]
    is_start = np.empty(n, bool)
    is_start[0] = True
    is_start[1:] = pc.not_equal(episode_col.slice(1), episode_col.slice(0, n - 1)).to_numpy(
        zero_copy_only=False
    )
    starts = np.flatnonzero(is_start)
    episode = np.cumsum(is_start) - 1
    start_codes = _dense_codes(episode_col.take(pa.array(starts)))
    if int(start_codes.max()) + 1 != len(starts):
        runs = np.bincount(start_codes)
        row = int(starts[start_codes == np.flatnonzero(runs > 1)[0]][1])
        raise ValueError(
            f"rows of an episode must be contiguous: episode_id {episode_col[row].as_py()!r} appears again at "
            f"row {row} after other episodes"
        )
    group_raw = group_col.to_numpy(zero_copy_only=False)
    split = (group_raw[1:] != group_raw[:-1]) & ~is_start[1:]
    if split.any():
        row = int(np.argmax(split)) + 1
        raise ValueError(f"episode {episode_col[row].as_py()!r} is split across two groups (at row {row})")
    _, episode_group = np.unique(group_raw[starts], return_inverse=True)
    episode_group = episode_group.astype(np.int64)
    group = episode_group[episode]

    state_group = _dense_codes(pa.array(group * (int(state.max()) + 1) + state))
    lengths_ep = np.diff(np.r_[starts, n]).astype(np.int64)
    return _Steps(reward, group, episode, starts.astype(np.int64), lengths_ep, episode_group, state_group)


def _scan_layout(steps: _Steps) -> list[tuple[np.ndarray, np.ndarray, tuple[int, int]]]:
    """Where each row sits in a padded matrix of reversed episodes, one matrix per bucket of episode lengths.

    Buckets are powers of two, so padding at most doubles the work whatever the spread of lengths. Returns, per
    bucket, (rows, flat index into the matrix, matrix shape).
    """
    pos_in_episode = np.arange(steps.n) - steps.starts[steps.episode]
    reversed_col = steps.lengths[steps.episode] - 1 - pos_in_episode
    episode_width = 1 << np.ceil(np.log2(steps.lengths)).astype(np.int64)
    layout = []
    for width in np.unique(episode_width):
        in_bucket = episode_width == width
        row_of_episode = np.cumsum(in_bucket) - 1
        rows = np.flatnonzero(in_bucket[steps.episode])
        flat = row_of_episode[steps.episode[rows]] * int(width) + reversed_col[rows]
        layout.append((rows, flat, (int(in_bucket.sum()), int(width))))
    return layout


def _reverse_scan(x: np.ndarray, steps: _Steps, coef: float) -> np.ndarray:
    """y_t = x_t + coef * y_{t+1} inside each episode (y after the last step = 0), for all episodes at once.

    Each bucket's padded matrix holds its episodes reversed, one per row, so one ``lfilter`` call runs the
    recursion for all of them; padding sits after each episode's first step and cannot leak into it.
    """
    from scipy.signal import lfilter  # scipy.signal takes a second to import: only when it runs

    y = np.empty_like(x)
    for rows, flat, shape in steps.scan_layout:
        matrix = np.zeros(shape)
        matrix.flat[flat] = x[rows]
        y[rows] = lfilter([1.0], [1.0, -coef], matrix, axis=1).ravel()[flat]
    return y


def _segment_mean_std(
    values: np.ndarray, segment: np.ndarray, n_segments: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-segment mean and unbiased std (std = 1 for a segment of one element), broadcast back to rows."""
    count = np.bincount(segment, minlength=n_segments).astype(np.float64)
    safe = np.maximum(count, 1.0)
    mean = np.bincount(segment, weights=values, minlength=n_segments) / safe
    centred = values - mean[segment]
    sq = np.bincount(segment, weights=centred * centred, minlength=n_segments)
    std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1.0, 1.0)), 1.0)
    return mean[segment], std[segment]


def _normalise(values: np.ndarray, segment: np.ndarray, norm: str) -> np.ndarray:
    if norm == "none" or len(values) == 0:
        return values
    mean, std = _segment_mean_std(values, segment, int(segment.max()) + 1)
    if norm == "mean":
        return values - mean
    return (values - mean) / (std + EPS)


def _episode_returns(steps: _Steps) -> np.ndarray:
    """Undiscounted episode return (sum of rewards), one per episode."""
    return np.bincount(steps.episode, weights=steps.reward, minlength=len(steps.starts))


def _gagpo(steps: _Steps, gamma: float, lam: float, norm: str) -> np.ndarray:
    returns_to_go = _reverse_scan(steps.reward, steps, gamma)
    n_states = int(steps.state_group.max()) + 1
    value_sum = np.bincount(steps.state_group, weights=returns_to_go, minlength=n_states)
    value = (value_sum / np.bincount(steps.state_group, minlength=n_states))[steps.state_group]
    is_last = np.zeros(steps.n, bool)
    is_last[steps.starts + steps.lengths - 1] = True
    next_value = np.where(is_last, 0.0, np.r_[value[1:], 0.0])
    delta = steps.reward + gamma * next_value - value
    advantage = _reverse_scan(delta, steps, gamma * lam)
    return _normalise(advantage, steps.group, norm)


def _grpo(steps: _Steps) -> np.ndarray:
    episode_return = _episode_returns(steps)
    return _normalise(episode_return, steps.episode_group, "mean_std")[steps.episode]


def _rloo(steps: _Steps) -> np.ndarray:
    episode_return = _episode_returns(steps)
    n_groups = int(steps.episode_group.max()) + 1
    k = np.bincount(steps.episode_group, minlength=n_groups)[steps.episode_group].astype(np.float64)
    total = np.bincount(steps.episode_group, weights=episode_return, minlength=n_groups)[steps.episode_group]
    others_mean = (total - episode_return) / np.maximum(k - 1.0, 1.0)
    return np.where(k > 1, episode_return - others_mean, 0.0)[steps.episode]


def _gigpo(steps: _Steps, gamma: float, norm: str, omega: float) -> np.ndarray:
    episode_term = _grpo(steps)
    returns_to_go = _reverse_scan(steps.reward, steps, gamma)
    step_term = _normalise(returns_to_go, steps.state_group, norm)
    singleton = np.bincount(steps.state_group)[steps.state_group] == 1
    step_term = np.where(singleton, 0.0, step_term)
    return episode_term + omega * step_term


def _values(columns: Any, n: int) -> np.ndarray:
    try:
        value = _column(columns, "value")
    except ValueError as err:
        raise ValueError(f"estimator 'ppo' needs the critic's V(s_t) per row: {err}") from None
    if value.null_count or not (pa.types.is_integer(value.type) or pa.types.is_floating(value.type)):
        raise ValueError(f"column 'value' must hold numbers without nulls, got {value.type}")
    out = value.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if len(out) != n:
        raise ValueError(f"column 'value' has {len(out)} rows, the other columns {n}")
    bad = ~np.isfinite(out)
    if bad.any():
        raise ValueError(
            f"column 'value' has {int(bad.sum())} NaN/inf values (first at row {int(np.argmax(bad))})"
        )
    return out


def _critic_gae(steps: _Steps, value: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    is_last = np.zeros(steps.n, bool)
    is_last[steps.starts + steps.lengths - 1] = True
    next_value = np.where(is_last, 0.0, np.r_[value[1:], 0.0])
    delta = steps.reward + gamma * next_value - value
    advantage = _reverse_scan(delta, steps, gamma * lam)
    return advantage, advantage + value


def critic_gae(
    columns: pa.Table | Mapping[str, Any], *, gamma: float = 0.95, lam: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """PPO's step-level GAE with a learned critic: (advantages before whitening, value targets A + V).

    Needs the columns ``episode_id``, ``reward`` and ``value`` (``group_id`` and ``state_key`` are checked but
    play no part); V after an episode's last step is 0, so lam = 1 gives R_t - V(s_t) and lam = 0 the TD residual.
    """
    _check_gamma_lam(gamma, lam)
    steps = _prepare(columns)
    value = _values(columns, steps.n)
    if steps.n == 0:
        return np.zeros(0), np.zeros(0)
    return _critic_gae(steps, value, float(gamma), float(lam))


def _check_gamma_lam(gamma: float, lam: float) -> None:
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def compute_advantages(
    columns: pa.Table | Mapping[str, Any],
    *,
    estimator: str = "gagpo",
    gamma: float = 0.95,
    lam: float = 0.95,
    norm: str = "mean_std",
    omega: float = 1.0,
) -> np.ndarray:
    """One advantage per environment step (row), for the chosen estimator; see the module docstring."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; expected one of {NORMS}")
    if estimator == "gigpo" and norm == "none":
        raise ValueError("GiGPO's step term is always centred: norm must be 'mean' or 'mean_std' for gigpo")
    _check_gamma_lam(gamma, lam)
    if not np.isfinite(omega):
        raise ValueError(f"omega must be finite, got {omega!r}")

    steps = _prepare(columns)
    if estimator == "ppo":
        value = _values(columns, steps.n)
        if steps.n == 0:
            return np.zeros(0, np.float64)
        advantage, _ = _critic_gae(steps, value, float(gamma), float(lam))
        return _normalise(advantage, np.zeros(steps.n, np.int64), norm)
    if steps.n == 0:
        return np.zeros(0, np.float64)
    if estimator == "gagpo":
        return _gagpo(steps, float(gamma), float(lam), norm)
    if estimator == "grpo":
        return _grpo(steps)
    if estimator == "rloo":
        return _rloo(steps)
    return _gigpo(steps, float(gamma), norm, float(omega))


def grouping_diagnostics(
    columns: pa.Table | Mapping[str, Any], advantages: np.ndarray | None = None
) -> dict[str, float]:
    """How much the state groups share, and how spread the advantages are (live training metrics).

    singleton_share: share of steps whose state occurs once in its group; state_group_size_mean / _max: over the
    distinct (group, state) pairs; adv_iqr and adv_abs_gt1_share (share of |A| > 1) when advantages are given.
    """
    steps = _prepare(columns)
    out = {
        "singleton_share": 0.0,
        "state_group_size_mean": 0.0,
        "state_group_size_max": 0.0,
        "num_state_groups": 0.0,
    }
    if steps.n:
        sizes = np.bincount(steps.state_group)
        out["singleton_share"] = float(np.mean(sizes[steps.state_group] == 1))
        out["state_group_size_mean"] = float(sizes.mean())
        out["state_group_size_max"] = float(sizes.max())
        out["num_state_groups"] = float(len(sizes))
    if advantages is not None:
        adv = np.asarray(advantages, dtype=np.float64)
        if adv.shape != (steps.n,):
            raise ValueError(f"advantages must have one value per row ({steps.n}), got shape {adv.shape}")
        if steps.n:
            q75, q25 = np.percentile(adv, [75, 25])
            out["adv_iqr"] = float(q75 - q25)
            out["adv_abs_gt1_share"] = float(np.mean(np.abs(adv) > 1.0))
        else:
            out["adv_iqr"] = 0.0
            out["adv_abs_gt1_share"] = 0.0
    return out
