"""GAGPO metrics as Ray metrics: names, and a live training whose metrics are read via the dashboard on loopback."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

from gagpo_rllib.tools.ray_metrics import gauge_name, metric_values
from tests.gagpo_rllib.train_files import running_train_file, tiny_maze_train_file

ROOT = Path(__file__).resolve().parents[3]
EXPECTED = (
    "ray_gagpo_success_rate",
    "ray_gagpo_generated_tokens_per_s",
    "ray_gagpo_time_generation_s",
    "ray_gagpo_grouping_singleton_share",
    "ray_gagpo_grouping_adv_std",
    "ray_gagpo_learner_kl",
    "ray_gagpo_learner_clip_fraction",
    "ray_gagpo_training_iteration",
)


def test_metric_values_flatten_and_name_the_gagpo_subtrees() -> None:
    result = {
        "training_iteration": 3,
        "gagpo": {"success_rate": 0.5, "success_rate/pick_and_place_simple": 1.0, "note": "text"},
        "learners": {"default_policy": {"kl": 0.02, "bad": float("nan")}, "gagpo": {"singleton_share": 0.4}},
        "env_runners": {"episode_return_mean": 1.0},
    }
    assert metric_values(result) == {
        "gagpo_success_rate": 0.5,
        "gagpo_success_rate_pick_and_place_simple": 1.0,
        "gagpo_learner_kl": 0.02,
        "gagpo_grouping_singleton_share": 0.4,
        "gagpo_training_iteration": 3.0,
    }
    assert gauge_name("gagpo_", "a/b-c.d") == "gagpo_a_b_c_d"


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def scrape(dashboard: str) -> dict[str, float]:
    """Every ray_gagpo_* sample of the nodes that the dashboard lists as Prometheus targets."""
    targets = [
        t for group in json.loads(http_get(f"{dashboard}/api/prometheus/sd")) for t in group["targets"]
    ]
    values: dict[str, float] = {}
    for target in targets:
        try:
            text = http_get(f"http://{target}/metrics")
        except OSError:
            continue
        for match in re.finditer(r"^(ray_gagpo_\w+)\{[^}]*\} (\S+)$", text, flags=re.M):
            values[match.group(1)] = float(match.group(2))
    return values


def test_dashboard_exposes_gagpo_metrics_while_training(tmp_path: Path, tiny_policy_path: Path) -> None:
    train_file = tmp_path / "maze_tiny.py"
    train_file.write_text(tiny_maze_train_file(tiny_policy_path))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    args = ["--stop", '{"training_iteration": 50}', "--dashboard", "--num-cpus", "2"]
    args += ["--storage-path", str(tmp_path / "results")]
    seen: dict[str, float] = {}
    dashboard = None
    log: list[str] = []
    with running_train_file(train_file, args, cwd=ROOT, env=env) as (proc, lines):
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            while not lines.empty():
                line = lines.get()
                log.append(line)
                found = re.search(r"Ray dashboard: (http://\S+)", line)
                if found:
                    dashboard = found.group(1)
            if dashboard is not None:
                try:
                    seen = scrape(dashboard)
                except OSError:
                    seen = {}
                if all(name in seen for name in EXPECTED) and seen["ray_gagpo_training_iteration"] >= 2:
                    break
            time.sleep(2)
    assert dashboard is not None and dashboard.startswith("http://127.0.0.1:"), "".join(log[-30:])
    missing = [name for name in EXPECTED if name not in seen]
    assert not missing, f"missing {missing}; got {sorted(seen)}\n" + "".join(log[-30:])
    assert 0.0 <= seen["ray_gagpo_success_rate"] <= 1.0
    assert seen["ray_gagpo_generated_tokens_per_s"] > 0
