"""Reset and step latency of AlfworldEnv next to the alfworld package's own AlfredTWEnv, on the same bundled games.

Both play the same games written out in ALFWorld's downloaded layout (full game files) in a temporary folder, and
the same commands (each game's walkthrough). Printed: medians and 90th percentiles, and the package/ours ratio.
Our resets are reported three ways: the first reset of a game in the process (it loads and translates the game),
later resets of a loaded game, and the training pattern (``--group`` resets per game, as a GAGPO group replays one
game). Targets: median reset <= 150 ms, median step <= 50 ms.

    python benchmarks/bench_alfworld.py [--games 24] [--group 8] [--split valid_unseen]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def _materialise(split: str, per_type: int, root: Path) -> list[Path]:
    """Write full game files (domain and grammar inside), as the downloaded data set has them."""
    from envs.alfworld.games import BUNDLED_DATA, find_games, read_game
    from envs.alfworld.tasks import TASK_TYPES

    games = find_games(BUNDLED_DATA, split).games
    out = []
    for task_type in TASK_TYPES:
        for game in [g for g in games if g.task_type == task_type][:per_type]:
            src = Path(game.game_file).parent
            dst = root / "json_2.1.1" / split / src.parent.name / src.name
            dst.mkdir(parents=True)
            (dst / "game.tw-pddl").write_text(json.dumps(read_game(game.game_file)))
            (dst / "traj_data.json").write_text(json.dumps(game.traj_data))
            out.append(dst / "game.tw-pddl")
    return out


def _walkthrough(game_file: str | Path) -> list[str]:
    return ["jump around", *json.loads(Path(game_file).read_text())["walkthrough"]]


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"median {1000 * statistics.median(values):7.1f} ms   p90 {1000 * p90:7.1f} ms   (n={len(values)})"


def bench_package(root: Path, split: str, n_games: int) -> tuple[list[float], list[float]]:
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    data = str(root / "json_2.1.1" / split)
    config = {
        "dataset": {
            "data_path": data,
            "eval_id_data_path": data,
            "eval_ood_data_path": data,
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "env": {
            "task_types": [1, 2, 3, 4, 5, 6],
            "goal_desc_human_anns_prob": 0,
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": 50}},
        "logic": {"domain": ALFRED_PDDL_PATH, "grammar": ALFRED_TWL2_PATH},
    }
    env = AlfredTWEnv(config, train_eval="eval_out_of_distribution").init_env(batch_size=1)
    resets, steps = [], []
    try:
        for _ in range(n_games):
            t = time.perf_counter()
            _, infos = env.reset()
            resets.append(time.perf_counter() - t)
            for command in _walkthrough(infos["extra.gamefile"][0]):
                t = time.perf_counter()
                env.step([command])
                steps.append(time.perf_counter() - t)
    finally:
        env.close()
    return resets, steps


def bench_ours(root: Path, split: str, games: list[Path], group: int) -> dict[str, list[float]]:
    from envs.alfworld.env import AlfworldEnv

    env = AlfworldEnv({"data_dir": str(root), "split": split})
    out: dict[str, list[float]] = {"cold": [], "warm": [], "group": [], "step": []}
    for game in games:
        for k in range(group):
            t = time.perf_counter()
            env.reset(options={"game_file": str(game)})
            dt = time.perf_counter() - t
            out["cold" if k == 0 else "warm"].append(dt)
            out["group"].append(dt)
            if k == 0:
                for command in _walkthrough(game):
                    t = time.perf_counter()
                    env.step(command)
                    out["step"].append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--split", default="valid_unseen", choices=["train", "valid_unseen"])
    parser.add_argument("--games", type=int, default=24, help="games, spread over the six task types")
    parser.add_argument("--group", type=int, default=8, help="resets per game in the training pattern")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-alfworld-") as tmp:
        root = Path(tmp)
        os.environ.setdefault("ALFWORLD_DATA", str(root / "alfworld-data"))
        games = _materialise(args.split, max(1, args.games // 6), root)
        ours = bench_ours(root, args.split, games, args.group)
        pkg_resets, pkg_steps = bench_package(root, args.split, len(games))

    med = statistics.median
    print(
        f"ALFWorld latency on {len(games)} bundled {args.split} games (walkthrough + one invalid command each)"
    )
    print(f"  package AlfredTWEnv reset     {_ms(pkg_resets)}")
    print(f"  ours reset, first of a game   {_ms(ours['cold'])}")
    print(f"  ours reset, game loaded       {_ms(ours['warm'])}")
    print(f"  {f'ours reset, {args.group} per game':<30}{_ms(ours['group'])}")
    print(f"  package AlfredTWEnv step      {_ms(pkg_steps)}")
    print(f"  ours step                     {_ms(ours['step'])}")
    print("ratios (package median / ours median):")
    print(f"  reset vs first of a game  {med(pkg_resets) / med(ours['cold']):6.1f}x")
    print(f"  {f'reset vs {args.group} per game':<26}{med(pkg_resets) / med(ours['group']):6.1f}x")
    print(f"  step                      {med(pkg_steps) / med(ours['step']):6.1f}x")
    print(
        "targets: ours median reset ({} per game) {:.0f} ms <= 150 ms: {}; median step {:.1f} ms <= 50 ms: {}".format(
            args.group,
            1000 * med(ours["group"]),
            med(ours["group"]) <= 0.150,
            1000 * med(ours["step"]),
            med(ours["step"]) <= 0.050,
        )
    )


if __name__ == "__main__":
    main()
