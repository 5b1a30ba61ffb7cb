"""Evaluation of a checkpoint or an untrained model: plan, restored weights, Table-1 layouts, CSV/JSON, CLI."""

from __future__ import annotations

import csv
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import ray

from envs.alfworld import AlfworldEnv
from envs.maze import MazeEnv
from envs.protocol import GENERIC_TABLE
from envs.webshop import WebShopEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.policy.models import load_policy
from gagpo_rllib.rllib.checkpoints import MODULE_PATH, config_from_checkpoint, is_checkpoint
from gagpo_rllib.rllib.evaluation import (
    EpisodeRecord,
    EvalSettings,
    build_evaluator,
    config_for_model,
    evaluate,
    evaluation_config,
    evaluation_plan,
    play,
    summarise,
    with_validation,
)
from gagpo_rllib.tools.cli import main


@pytest.fixture(scope="module")
def checkpoint(tiny_maze_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GAGPO checkpoint after one training iteration on the maze."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = tiny_maze_config(lam=0.9).build_algo()
    algo.train()
    path = Path(algo.save_to_path(str(tmp_path_factory.mktemp("ckpt") / "checkpoint_000000")))
    algo.stop()
    yield path
    ray.shutdown()


def rec(task_type: str, won: bool, task_id: int = 0, score: float | None = None) -> EpisodeRecord:
    return EpisodeRecord(task_id, 0, task_type, won, 10.0 * won, 5, 0.0, score)


def test_layouts_follow_the_papers_tables() -> None:
    alf = [
        rec("pick_and_place_simple", True),
        rec("pick_and_place_simple", False),
        rec("look_at_obj_in_light", True),
        rec("pick_two_obj_and_place", False),
    ]
    layout, table = summarise(alf, AlfworldEnv.eval_table)
    assert layout == "alfworld"
    assert list(table) == ["Pick", "Look", "Clean", "Heat", "Cool", "Pick2", "All"]
    assert table["Pick"] == 50.0 and table["Look"] == 100.0 and table["Pick2"] == 0.0 and table["All"] == 50.0
    assert math.isnan(table["Clean"])  # no episode of that type: shown as "-"
    layout, table = summarise(
        [rec("beauty", True, score=1.0), rec("food", False, score=0.5)], WebShopEnv.eval_table
    )
    assert layout == "webshop" and table == {"score": 75.0, "success": 50.0}
    maze = [rec("maze1", True), rec("maze0", False), rec("maze0", True)]
    generic = {"maze0": 50.0, "maze1": 100.0, "All": pytest.approx(200 / 3)}
    assert summarise(maze, MazeEnv.eval_table) == ("generic", generic)
    assert summarise(maze, GENERIC_TABLE) == ("generic", generic)  # an env that declares no layout
    # Episodes that do not fit the env's layout (a task type without a column, no score) get the generic row.
    assert summarise(maze, AlfworldEnv.eval_table) == ("generic", generic)
    assert summarise(maze, WebShopEnv.eval_table) == ("generic", generic)
    with pytest.raises(ValueError, match="no episodes"):
        summarise([], GENERIC_TABLE)


def test_the_env_class_names_the_evaluation_split() -> None:
    def split_of(env: type | str, split: str | None = None) -> str:
        config = GAGPOConfig().environment(env).llm(model_path="m")
        return evaluation_config(config, EvalSettings(split=split)).env_config["split"]

    assert split_of(MazeEnv) == split_of(WebShopEnv) == "eval"
    assert split_of(AlfworldEnv) == "valid_unseen"  # as the papers evaluate ALFWorld
    assert split_of(AlfworldEnv, "valid_seen") == "valid_seen"
    assert split_of("some_registered_env") == "eval"  # not a class: the protocol's default
    with pytest.raises(ValueError, match=r"EvalSettings.split 'valid_unseen': MazeEnv has the splits"):
        split_of(MazeEnv, "valid_unseen")
    with pytest.raises(ValueError, match="validation split 'test'"):
        with_validation(GAGPOConfig().environment(AlfworldEnv), split="test", interval=1)


def test_plan_is_seeded_and_covers_the_split() -> None:
    full = evaluation_plan(5, EvalSettings(episodes_per_task=2))
    assert [(p.task_id, p.member) for p in full] == [(t, k) for t in range(5) for k in range(2)]
    some = evaluation_plan(50, EvalSettings(num_tasks=6, seed=3))
    assert some == evaluation_plan(50, EvalSettings(num_tasks=6, seed=3))
    assert len({p.task_id for p in some}) == 6
    assert [p.task_id for p in some] != [
        p.task_id for p in evaluation_plan(50, EvalSettings(num_tasks=6, seed=4))
    ]
    with pytest.raises(ValueError, match="temperature"):
        EvalSettings(temperature=0).validate()
    with pytest.raises(ValueError, match="no task"):
        evaluation_plan(0, EvalSettings())


def test_checkpoint_config_and_cli_errors(checkpoint: Path, tiny_policy_path: Path) -> None:
    assert is_checkpoint(checkpoint) and not is_checkpoint(tiny_policy_path)
    config = config_from_checkpoint(checkpoint)
    assert isinstance(config, GAGPOConfig)
    assert (config.lam, config.group_size, config.model_path) == (0.9, 2, str(tiny_policy_path))
    with pytest.raises(FileNotFoundError, match="not an RLlib Algorithm checkpoint"):
        config_from_checkpoint(tiny_policy_path)
    with pytest.raises(ValueError, match="needs an env"):
        config_for_model(str(tiny_policy_path))
    with pytest.raises(FileNotFoundError, match="neither an Algorithm checkpoint"):
        main(["evaluate", str(checkpoint.parent), "--env", "maze"])


def test_evaluator_plays_the_checkpoint_policy_on_the_eval_split(
    checkpoint: Path, tiny_policy_path: Path
) -> None:
    base, _ = load_policy(tiny_policy_path)
    saved = pickle.loads((checkpoint / MODULE_PATH / "module_state.pkl").read_bytes())
    assert any(not np.allclose(v.numpy(), saved[f"model.{k}"]) for k, v in base.state_dict().items())
    settings = EvalSettings(num_tasks=3, episodes_per_task=2, temperature=0.7, seed=1)
    algo = build_evaluator(config_from_checkpoint(checkpoint), settings, checkpoint=checkpoint)
    try:
        module = algo.env_runner_group.local_env_runner.module
        for name, value in module.model.state_dict().items():
            np.testing.assert_allclose(value.numpy(), saved[f"model.{name}"], atol=0)
        assert module.eval_sampling.temperature == 0.7
        assert algo.config.env_config["split"] == "eval"
        records = play(algo, settings, progress=False)
    finally:
        algo.stop()
    eval_split = MazeEnv({"split": "eval", "num_tasks": 4})
    assert len(records) == 6 and len({r.task_id for r in records}) == 3
    assert sorted(r.member for r in records) == [0, 0, 0, 1, 1, 1]
    assert all(0 <= r.task_id < eval_split.num_tasks and 1 <= r.length <= 6 for r in records)


def test_same_seed_same_episodes_and_written_files(checkpoint: Path, tmp_path: Path) -> None:
    settings = EvalSettings(num_tasks=2, episodes_per_task=2, seed=5)
    first = evaluate(config_from_checkpoint(checkpoint), settings, checkpoint=checkpoint, progress=False)
    again = evaluate(config_from_checkpoint(checkpoint), settings, checkpoint=checkpoint, progress=False)
    assert first.episodes == again.episodes
    paths = first.write(tmp_path / "eval")
    payload = json.loads(paths["json"].read_text())
    assert payload["split"] == "eval" and payload["episodes"] == 4 and len(payload["per_episode"]) == 4
    with open(paths["table"], newline="") as handle:
        header, values = list(csv.reader(handle))
    assert header[-1] == "episodes" and "All" in header
    assert float(values[header.index("All")]) == pytest.approx(first.table["All"], abs=1e-3)
    assert first.table["All"] == pytest.approx(100 * np.mean([e.won for e in first.episodes]))


def test_evaluate_command_on_checkpoint_and_on_untrained_model(
    checkpoint: Path, tiny_policy_path: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "ck"
    # --env-config merges into the checkpoint's env_config: 2 task instances, all of them played.
    assert main(["evaluate", str(checkpoint), "--env-config", '{"num_tasks": 2}', "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MazeEnv split 'eval': 2 episodes on 2 tasks, temperature 0.4" in text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    values = [c.strip() for c in rows[2].strip("|").split("|")]
    assert header[-1] == "All" and 0.0 <= float(values[-1]) <= 100.0
    assert (out / "eval_table.csv").is_file() and (out / "eval_episodes.csv").is_file()
    assert sorted(e["task_id"] for e in json.loads((out / "eval.json").read_text())["per_episode"]) == [0, 1]

    base = tmp_path / "base"
    code = main(
        [
            "evaluate",
            str(tiny_policy_path),
            "--env",
            "maze",
            "--env-config",
            '{"num_tasks": 4}',
            "--constrained",
            "--max-new-tokens",
            "8",
            "--max-steps",
            "4",
            "--num-tasks",
            "2",
            "--temperature",
            "1.0",
            "--out",
            str(base),
        ]
    )
    assert code == 0
    payload = json.loads((base / "eval.json").read_text())
    assert payload["source"] == str(tiny_policy_path) and payload["temperature"] == 1.0
    assert all(e["length"] <= 4 for e in payload["per_episode"])


def test_validation_during_training_plays_the_eval_split(checkpoint: Path, tiny_maze_config) -> None:
    config = tiny_maze_config(lam=0.9, eval_temperature=0.6)
    config = with_validation(
        config, split="eval", interval=1, settings=EvalSettings(num_tasks=3, episodes_per_task=2)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        runner = algo.eval_env_runner_group.local_env_runner
        assert (
            runner.sub_envs()[0].unwrapped.split == "eval" and runner.module.eval_sampling.temperature == 0.6
        )
        assert algo.env_runner_group.local_env_runner.sub_envs()[0].unwrapped.split == "train"
    finally:
        algo.stop()
    valid = result["evaluation"]["valid"]
    assert valid["num_episodes"] == 6 and 1 <= valid["episode_len_mean"] <= 6
    assert valid["success"] == pytest.approx(valid["by_type"]["All"]) and 0.0 <= valid["success"] <= 1.0
    with pytest.raises(ValueError, match="interval"):
        with_validation(config, split="eval", interval=0)


def test_dump_steps_writes_every_step_and_the_table_counts_invalid_reasons(
    checkpoint: Path, tiny_policy_path: Path, tmp_path: Path, capsys
) -> None:
    """Free-form decoding with the random-init policy: every step is invalid, and the dump says why."""
    dump, out = tmp_path / "dump" / "steps.jsonl", tmp_path / "eval"
    args = ["evaluate", str(tiny_policy_path), "--env", "maze", "--env-config", '{"num_tasks": 4}']
    args += ["--no-constrained", "--max-new-tokens", "6", "--max-steps", "3", "--num-tasks", "2"]
    args += ["--system-prompt", "You walk mazes.", "--out", str(out), "--dump-steps", str(dump)]
    assert main(args) == 0
    text = capsys.readouterr().out
    steps = [json.loads(line) for line in dump.read_text().splitlines()]
    per_episode = json.loads((out / "eval.json").read_text())["per_episode"]
    assert len(steps) == sum(e["length"] for e in per_episode) and f"steps: {dump}" in text
    by_episode: dict[int, list[dict]] = {}
    for s in steps:
        by_episode.setdefault(s["task_id"], []).append(s)
        assert s["prompt"].startswith("<|im_start|>system\nYou walk mazes.<|im_end|>")
        assert s["prompt_tokens"] > 0 and 0 < s["output_tokens"] <= 6 and s["stop"] in ("end_token", "length")
        assert s["valid"] == (s["invalid_reason"] == "") and isinstance(s["reward"], float)
        if not s["valid"]:
            assert s["raw_output"][:200] == s["action"]
    for episode_steps in by_episode.values():
        assert [s["step"] for s in episode_steps] == list(range(1, len(episode_steps) + 1))
        assert episode_steps[-1]["done"]
    reasons: dict[str, int] = {}
    for s in steps:
        if not s["valid"]:
            reasons[s["invalid_reason"]] = reasons.get(s["invalid_reason"], 0) + 1
    assert reasons, "a random-init policy answering free-form gives invalid steps"
    line = next(row for row in text.splitlines() if row.startswith("invalid steps:"))
    assert line.startswith(f"invalid steps: {sum(reasons.values())} of {len(steps)}")
    for reason, n in reasons.items():
        assert f"{reason} {n}" in line


def test_validation_plays_whole_groups_with_trainings_fault_tolerance(
    checkpoint: Path, tiny_policy_path: Path
) -> None:
    """An env error in validation is played again and its group left out, as in training; an env that always
    fails gives training's clear error."""
    from gagpo_rllib.rllib.group_sampling import GroupSamplingError
    from tests.gagpo_rllib.faulty_env import FaultyCorridorEnv, set_runner_faults
    from tests.gagpo_rllib.toy_env import make_config

    config = (
        make_config(tiny_policy_path, group_size=2, groups_per_iteration=2)
        .environment(FaultyCorridorEnv, env_config={"max_steps": 3})
        .fault_tolerance(max_group_attempts=2)
    )
    config = with_validation(config, split="eval", interval=1, settings=EvalSettings(episodes_per_task=2))
    algo = config.build_algo()
    try:
        runner = algo.eval_env_runner_group.local_env_runner
        set_runner_faults(runner, fail_step_task=1)
        valid = algo.evaluate()["valid"]
        # 4 tasks x 2 episodes; task 1's group fails in both attempts and is left out whole.
        assert valid["num_episodes"] == 6 and 1 <= valid["episode_len_mean"] <= 3
        set_runner_faults(runner, fail_always=True)
        with pytest.raises(GroupSamplingError, match="every episode ended with an env error in 2 attempt"):
            algo.evaluate()
    finally:
        algo.stop()
