"""Throughput of ``compute_advantages`` on a realistic batch, side by side with a per-step dict implementation,
and the cost of similarity grouping relative to exact state keys.

The batch: groups of 8 rollouts, episodes of 5-50 steps, states drawn from a small per-group pool (so states
repeat across rollouts, as in ALFWorld and WebShop), sparse terminal rewards 10 * won. PPO gets random critic
values. For similarity grouping the keys are ALFWorld-like observation texts ("You arrive at drawer 3. On the
drawer 3, you see a pen 1, ..."), a third of each group's pool one object id away from another pool text; the
timing covers ``anchor_keys`` plus ``compute_advantages`` against ``compute_advantages`` on the exact texts.

    python benchmarks/bench_advantages.py [--rows 1000000] [--repeats 3] [--text-rows 200000]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
import pyarrow as pa

from gagpo_rllib.method.advantages import ESTIMATORS, compute_advantages, grouping_diagnostics
from gagpo_rllib.method.similarity import anchor_keys

LOCATIONS = (
    "drawer",
    "cabinet",
    "countertop",
    "shelf",
    "sinkbasin",
    "fridge",
    "microwave",
    "desk",
    "sidetable",
)
OBJECTS = (
    "keychain",
    "pen",
    "creditcard",
    "mug",
    "apple",
    "book",
    "cellphone",
    "pencil",
    "bowl",
    "cd",
    "knife",
)


def make_batch(rows: int, *, group_size: int = 8, pool: int = 40, seed: int = 0) -> pa.Table:
    """Grouped episodes with repeated states and sparse terminal rewards, ``rows`` steps in all."""
    rng = np.random.default_rng(seed)
    lengths = []
    total = 0
    while total < rows:
        n = int(rng.integers(5, 51))
        n = min(n, rows - total)
        lengths.append(n)
        total += n
    lengths = np.array(lengths)
    n_episodes = len(lengths)
    episode = np.repeat(np.arange(n_episodes), lengths)
    group = episode // group_size
    won = rng.random(n_episodes) < 0.4
    is_last = np.zeros(rows, bool)
    is_last[np.cumsum(lengths) - 1] = True
    reward = np.where(is_last, 10.0 * won[episode], 0.0)
    state_index = rng.integers(0, pool, rows)
    state_key = np.char.add(np.char.add(group.astype(str), "/room-"), state_index.astype(str))
    return pa.table(
        {
            "group_id": pa.array(group),
            "episode_id": pa.array(episode),
            "reward": pa.array(reward),
            "state_key": pa.array(state_key.astype(object)),
        }
    )


def _alfworld_text(rng: np.random.Generator) -> str:
    place = f"{LOCATIONS[rng.integers(len(LOCATIONS))]} {rng.integers(1, 6)}"
    items = ", ".join(
        f"a {OBJECTS[rng.integers(len(OBJECTS))]} {rng.integers(1, 4)}" for _ in range(rng.integers(1, 5))
    )
    return f"You arrive at {place}. On the {place}, you see {items}."


def _one_id_away(text: str, rng: np.random.Generator) -> str:
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    i = digits[rng.integers(len(digits))]
    return text[:i] + str(int(text[i]) % 5 + 1) + text[i + 1 :]


def make_text_batch(rows: int, *, group_size: int = 8, pool: int = 40, seed: int = 0) -> pa.Table:
    """``make_batch`` with ALFWorld-like observation texts as state keys (see the module docstring)."""
    table = make_batch(rows, group_size=group_size, pool=pool, seed=seed)
    group = table.column("group_id").to_numpy()
    index = np.char.partition(table.column("state_key").to_numpy(zero_copy_only=False).astype(str), "-")[:, 2]
    index = index.astype(np.int64)
    texts = np.empty(len(group), dtype=object)
    for g in np.unique(group):
        rng = np.random.default_rng([seed, int(g)])
        pool_texts = [_alfworld_text(rng) for _ in range(pool)]
        for j in range(pool // 3):
            pool_texts[pool - 1 - j] = _one_id_away(pool_texts[j], rng)
        rows_g = np.flatnonzero(group == g) if len(group) < 50_000 else None
        if rows_g is None:
            start, stop = np.searchsorted(group, [g, g + 1])
            rows_g = np.arange(start, stop)
        texts[rows_g] = [pool_texts[i] for i in index[rows_g]]
    return table.set_column(table.column_names.index("state_key"), "state_key", pa.array(texts.tolist()))


def dict_gagpo(
    group_id: np.ndarray,
    episode_id: np.ndarray,
    reward: np.ndarray,
    state_key: np.ndarray,
    gamma: float = 0.95,
    lam: float = 0.95,
) -> np.ndarray:
    """GAGPO written step by step with Python dicts over the batch's arrays, the way trainers commonly write
    grouping (a loop over rows keyed by (group, state))."""
    n = len(reward)
    returns = [0.0] * n
    for i in range(n - 1, -1, -1):
        last = i == n - 1 or episode_id[i + 1] != episode_id[i]
        returns[i] = reward[i] + (0.0 if last else gamma * returns[i + 1])
    sums: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    for i in range(n):
        key = (group_id[i], state_key[i])
        sums[key] += returns[i]
        counts[key] += 1
    value = [sums[(group_id[i], state_key[i])] / counts[(group_id[i], state_key[i])] for i in range(n)]
    adv = [0.0] * n
    for i in range(n - 1, -1, -1):
        last = i == n - 1 or episode_id[i + 1] != episode_id[i]
        delta = reward[i] + (0.0 if last else gamma * value[i + 1]) - value[i]
        adv[i] = delta + (0.0 if last else gamma * lam * adv[i + 1])
    by_group: dict = defaultdict(list)
    for i in range(n):
        by_group[group_id[i]].append(i)
    out = np.empty(n)
    for rows in by_group.values():
        a = np.array([adv[i] for i in rows])
        std = a.std(ddof=1) if len(a) > 1 else 1.0
        out[rows] = (a - a.mean()) / (std + 1e-6)
    return out


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text-rows", type=int, default=200_000, help="rows of the similarity text batch")
    args = parser.parse_args()

    table = make_batch(args.rows)
    print(f"batch: {table.num_rows:,} rows, {len(set(table.column('episode_id').to_pylist())):,} episodes")
    value = np.random.default_rng(1).normal(0.0, 3.0, table.num_rows)
    table = table.append_column("value", pa.array(value))  # the critic's V(s_t), for "ppo"
    seconds = {}
    for estimator in ESTIMATORS:
        seconds[estimator] = best_of(lambda e=estimator: compute_advantages(table, estimator=e), args.repeats)
        print(
            f"{estimator:>6}: {seconds[estimator]:.3f} s  ({table.num_rows / seconds[estimator] / 1e6:.2f} M rows/s)"
        )

    columns = {
        name: table.column(name).to_numpy(zero_copy_only=False)
        for name in table.column_names
        if name != "value"
    }
    dict_result = None

    def run_dict() -> None:
        nonlocal dict_result
        dict_result = dict_gagpo(**columns)

    dict_seconds = best_of(run_dict, 1)
    ours = compute_advantages(table, estimator="gagpo")
    max_diff = float(np.max(np.abs(ours - dict_result)))
    print(
        f"  dict: {dict_seconds:.3f} s  ({table.num_rows / dict_seconds / 1e6:.2f} M rows/s), max |diff| {max_diff:.2e}"
    )
    print(f"speed-up of gagpo over the dict implementation: {dict_seconds / seconds['gagpo']:.1f}x")
    similarity_cost(args.text_rows, args.repeats)


def similarity_cost(rows: int, repeats: int) -> None:
    """Seconds of GAGPO with similarity grouping (anchors + advantages) over exact keys, on the text batch."""
    table = make_text_batch(rows)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    exact_s = best_of(lambda: compute_advantages(cols), repeats)
    exact = grouping_diagnostics(cols)
    print(
        f"text batch: {table.num_rows:,} rows; exact keys: {exact_s:.3f} s, "
        f"singleton share {exact['singleton_share']:.3f}, {exact['num_state_groups']:.0f} state groups"
    )
    for threshold in (1.0, 0.95, 0.9):

        def run(t: float = threshold) -> list:
            anchored = anchor_keys(cols["group_id"], cols["state_key"], t)
            compute_advantages({**cols, "state_key": anchored})
            return anchored

        sim_s = best_of(run, repeats)
        diag = grouping_diagnostics({**cols, "state_key": run()})
        print(
            f"similarity {threshold:.2f}: {sim_s:.3f} s = {sim_s / exact_s:.1f}x exact keys, "
            f"singleton share {diag['singleton_share']:.3f}, {diag['num_state_groups']:.0f} state groups"
        )


if __name__ == "__main__":
    main()
