"""One training iteration, traced: which of the library's modules it enters (the list in docs/iteration.md), and
that each episode's step rows are extracted once per process."""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from pathlib import Path

from gagpo_rllib.rllib import groups

ROOT = Path(__file__).resolve().parents[3]
MAX_MODULES = 18


def documented_modules() -> list[str]:
    """The module paths listed in docs/iteration.md's table, in order."""
    text = (ROOT / "docs" / "iteration.md").read_text()
    return re.findall(r"^\| \d+ \| `(gagpo_rllib/[\w/]+\.py)` \|", text, flags=re.M)


def traced_iteration(algo) -> tuple[Counter, Counter, dict]:
    """(calls per library module, calls per groups.py function, the result) of one ``algo.train()``."""
    modules: Counter = Counter()
    functions: Counter = Counter()
    package = str(ROOT / "gagpo_rllib")

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            path = str(Path(frame.f_code.co_filename).relative_to(ROOT))
            modules[path] += 1
            if path.endswith("rllib/groups.py"):
                functions[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        result = algo.train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return modules, functions, result


def test_one_iteration_enters_the_documented_modules_and_reads_each_episode_once(tiny_maze_config) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = tiny_maze_config().build_algo()  # every group trains (the untrained policy's are uniform)
    try:
        algo.train()  # first iteration: imports and caches
        before = len(groups._rows_cache)
        modules, functions, result = traced_iteration(algo)
        episodes = int(result["gagpo"]["num_episodes"])
    finally:
        algo.stop()
        ray.shutdown()
    entered = sorted(modules)
    assert len(entered) <= MAX_MODULES, entered
    assert entered == sorted(documented_modules()), (
        "docs/iteration.md lists other modules than an iteration enters"
    )
    # The driver's decision and the learner connector both read the rows; each episode is flattened once.
    assert functions["episode_rows"] == 2
    assert functions["_rows_of"] == 2 * episodes
    assert len(groups._rows_cache) - before == episodes
