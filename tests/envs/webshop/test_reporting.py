"""What WebShop numbers say about where they come from: the env's provenance, the training progress line (with
the mean task score next to success) and the evaluation table, and --num-tasks beyond the split's size."""

from __future__ import annotations

import csv
import logging
from types import SimpleNamespace

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from envs.webshop import WebShopEnv
from envs.webshop.generator import write_catalogue
from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.algorithm import GAGPO
from gagpo_rllib.rllib.evaluation import EpisodeRecord, EvalReport, EvalSettings, evaluation_plan, record
from gagpo_rllib.tools.train import ProgressPrinter


def test_provenance_names_data_nouns_and_split(tmp_path):
    env = WebShopEnv({"split": "eval", "noun_extractor": "fallback"})
    info = env.reset(options={"task_id": 0})[1]
    assert (
        info["provenance"]
        == env.provenance
        == (
            "data: bundled (300 products, 1528 synthetic goals) | nouns: fallback | split: eval (webshop scheme) = "
            "goals [254:764], cut points scaled: fewer than 3,000 goals"
        )
    )
    assert WebShopEnv.describe_config({"split": "eval", "noun_extractor": "fallback"}) == (
        "data: bundled, synthetic goals | nouns: fallback | split: eval (webshop scheme)"
    )
    write_catalogue(tmp_path, 40, seed=2)
    users = WebShopEnv({"data_dir": str(tmp_path), "split_scheme": "gigpo", "noun_extractor": "fallback"})
    assert users.provenance.startswith(f"data: files in {tmp_path} (small set) (40 products, ")
    assert "| split: train (gigpo scheme) = goals [" in users.provenance


def finished_episode(task_score: float, won: bool, group: int, **info: str) -> SingleAgentEpisode:
    episode = SingleAgentEpisode()
    episode.add_env_reset(observation="page", infos={"task_score": 0.0})
    episode.add_env_step(
        observation="done",
        action="click[buy now]",
        reward=10.0 * won,
        infos={"task_score": task_score, "won": won, "task_type": "fashion", **info},
        terminated=True,
        extra_model_outputs={Columns.INVALID: False, Columns.ACTION_IDS: np.array([1, 2])},
    )
    episode.custom_data["group_id"] = group
    return episode


def test_training_metrics_and_progress_line_show_score_and_provenance(capsys):
    # The mean final task_score is logged next to the success rate.
    algo = SimpleNamespace(metrics=MetricsLogger())
    episodes = [
        finished_episode(1.0, True, 0),
        finished_episode(0.5, False, 0),
        finished_episode(0.25, False, 1),
    ]
    GAGPO.log_rollout_metrics(algo, episodes, [], 1.0)
    logged = algo.metrics.reduce()["gagpo"]
    assert logged["task_score_mean"] == np.mean([1.0, 0.5, 0.25]) and logged["success_rate"] == 1 / 3
    result = {
        "training_iteration": 2,
        "time_total_s": 8.0,
        "gagpo": {"success_rate": 1 / 3, "task_score_mean": 7 / 12, "episode_return_mean": 10 / 3},
    }
    env_config = {"split": "train", "split_scheme": "gigpo", "noun_extractor": "fallback"}
    trial = SimpleNamespace(trial_id="t1", config={"env": WebShopEnv, "env_config": env_config})
    ProgressPrinter({"training_iteration": 5}).on_trial_result(2, [trial], trial, result)
    line = capsys.readouterr().out.strip()
    assert line.startswith("[t1] iter 2/5  success  33.3%  score  58.3  return    3.33")
    assert line.endswith("| data: bundled, synthetic goals | nouns: fallback | split: train (gigpo scheme)")


def test_evaluation_table_names_provenance_and_too_many_tasks(tmp_path, caplog):
    env = WebShopEnv({"split": "eval", "noun_extractor": "fallback"})
    plan_settings = EvalSettings(num_tasks=20)
    with caplog.at_level(logging.WARNING, logger="gagpo_rllib.rllib.evaluation"):
        plan = evaluation_plan(8, plan_settings)
    assert len(plan) == 8
    assert "20 tasks asked (--num-tasks) but the split has only 8: playing all 8" in caplog.text
    episodes = []
    for task_id in range(8):
        episode = finished_episode(0.5, False, task_id, provenance=env.provenance)
        episode.custom_data.update(task_id=task_id, member=0)
        episodes.append(record(episode))
    assert all(isinstance(e, EpisodeRecord) and e.provenance == env.provenance for e in episodes)
    report = EvalReport.build(
        episodes,
        WebShopEnv.eval_table,
        source="ckpt",
        env="WebShopEnv",
        split="eval",
        temperature=0.4,
        tasks_requested=20,
    )
    first, second = report.header().splitlines()
    assert "8 episodes on 8 tasks (20 asked: the split has only 8)" in first and second == env.provenance
    with open(report.write(tmp_path)["table"]) as handle:
        row = list(csv.DictReader(handle))[0]
    assert row["provenance"] == env.provenance and float(row["score"]) == 50.0
