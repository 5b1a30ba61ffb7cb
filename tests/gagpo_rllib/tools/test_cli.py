"""The ``rllib`` command: train file (stop, checkpoint frequency, restore), help, argument errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gagpo_rllib.tools.cli import build_parser, main
from tests.gagpo_rllib.train_files import assert_same_weights, run_weights, tiny_maze_train_file

RECORD_START = """
config = config.callbacks(on_algorithm_init=record_start)
stop = {"training_iteration": 5}
"""


def record_start_callback(starts: Path) -> str:
    """The file's own start-up callback: it appends the env steps the algorithm holds when it runs."""
    return f"""

def record_start(algorithm, **kwargs):
    steps = algorithm.metrics.peek(("env_runners", "num_env_steps_sampled_lifetime"), default=0)
    with open({str(starts)!r}, "a") as handle:
        handle.write(f"{{int(steps)}}\\n")
"""


def write_train_file(folder: Path, model: Path) -> Path:
    path = folder / "maze_tiny.py"
    starts = folder / "starts.txt"
    path.write_text(tiny_maze_train_file(model, head=record_start_callback(starts), tail=RECORD_START))
    return path


def progress_rows(run: Path) -> list[dict[str, str]]:
    files = sorted(run.rglob("progress.csv"))
    assert files, f"no progress.csv under {run}"
    with open(files[0], newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_help_lists_every_command_and_train_option(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    top = capsys.readouterr().out
    for command in ("train", "evaluate", "plot", "export"):
        assert command in top
    with pytest.raises(SystemExit):
        main(["train", "file", "--help"])
    text = capsys.readouterr().out
    for option in (
        "--stop",
        "--checkpoint-freq",
        "--storage-path",
        "--num-env-runners",
        "--restore",
        "--resume",
        "--max-failures",
        "--plateau",
    ):
        assert option in text
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "--temperature" in capsys.readouterr().out


def test_bad_arguments_are_named(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "file", "x.py", "--stop", "[1, 2]"])
    assert exit_info.value.code == 2
    assert "--stop must be a JSON object" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="training file not found"):
        main(["train", "file", str(tmp_path / "missing.py")])
    bad = tmp_path / "bad.py"
    bad.write_text("config = 3\n")
    with pytest.raises(ValueError, match="must define `config`"):
        main(["train", "file", str(bad)])
    args = build_parser().parse_args(["export", "ckpt", "out", "--dtype", "bfloat16"])
    assert (args.checkpoint, args.out_dir, args.dtype) == ("ckpt", "out", "bfloat16")


def test_a_run_keeps_its_last_checkpoints_and_the_best(
    ray_session, tmp_path: Path, tiny_policy_path: Path
) -> None:
    train_file = write_train_file(tmp_path, tiny_policy_path)
    storage = tmp_path / "results"
    args = ["train", "file", str(train_file), "--stop", '{"training_iteration": 4}', "--checkpoint-freq", "1"]
    assert main([*args, "--storage-path", str(storage), "--name", "kept", "--keep-checkpoints", "2"]) == 0
    kept = sorted(p.name for p in (storage / "kept").rglob("checkpoint_0*"))
    assert kept == ["checkpoint_000002", "checkpoint_000003"]  # Tune counts from 0: iterations 3 and 4
    (best,) = (storage / "kept").rglob("best_checkpoint")
    assert (best / "rllib_checkpoint.json").is_file()
    chosen = json.loads((best / "best.json").read_text())
    success = [float(r["gagpo/success_rate"]) for r in progress_rows(storage / "kept")]
    assert chosen["value"] == pytest.approx(max(success))
    # ties: the later checkpoint
    assert chosen["training_iteration"] == max(i + 1 for i, v in enumerate(success) if v == max(success))
    # 0 keeps every checkpoint
    assert main([*args, "--storage-path", str(storage), "--name", "all", "--keep-checkpoints", "0"]) == 0
    assert len(list((storage / "all").rglob("checkpoint_0*"))) == 4


def test_train_file_checkpoints_and_restores(
    ray_session, tmp_path: Path, tiny_policy_path: Path, capsys
) -> None:
    train_file = write_train_file(tmp_path, tiny_policy_path)
    storage = tmp_path / "results"
    code = main(
        [
            "train",
            "file",
            str(train_file),
            "--stop",
            '{"training_iteration": 2}',
            "--checkpoint-freq",
            "1",
            "--storage-path",
            str(storage),
            "--name",
            "first",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "iter 1/2" in out and "iter 2/2" in out and "s/iter" in out and "ETA" in out
    assert "checkpoint: " in out
    rows = progress_rows(storage / "first")
    assert [int(r["training_iteration"]) for r in rows] == [1, 2]  # --stop overrides the file's 5
    checkpoints = sorted((storage / "first").rglob("checkpoint_0*"))
    assert len(checkpoints) == 2  # --checkpoint-freq 1: one per iteration (the last doubles as the end one)
    # Tune's standard TensorBoard logger holds the same GAGPO metrics, one point per iteration.
    events = EventAccumulator(str(next((storage / "first").rglob("events.out.tfevents*")).parent))
    events.Reload()
    success = events.Scalars("ray/tune/gagpo/success_rate")
    assert [e.step for e in success] == [1, 2]
    assert [e.value for e in success] == pytest.approx([float(r["gagpo/success_rate"]) for r in rows])
    scalars = set(events.Tags()["scalars"])
    for tag in (
        "learners/default_policy/kl",
        "learners/gagpo/singleton_share",
        "gagpo/generated_tokens_per_s",
    ):
        assert f"ray/tune/{tag}" in scalars
    first_lifetime = float(rows[0]["num_env_steps_sampled_lifetime"])
    trained_lifetime = float(rows[-1]["num_env_steps_sampled_lifetime"])

    code = main(
        [
            "train",
            "file",
            str(train_file),
            "--stop",
            '{"training_iteration": 1}',
            "--restore",
            str(checkpoints[-1]),
            "--storage-path",
            str(storage),
            "--name",
            "restored",
        ]
    )
    assert code == 0
    restored = progress_rows(storage / "restored")
    # The restored run continues the checkpoint's counters: its first iteration counts the earlier steps too.
    assert float(restored[0]["num_env_steps_sampled_lifetime"]) > trained_lifetime > first_lifetime
    result = json.loads((next((storage / "restored").rglob("result.json"))).read_text().splitlines()[-1])
    assert 0.0 <= result["gagpo"]["success_rate"] <= 1.0
    # The file's on_algorithm_init ran in both runs; with --restore it ran after the checkpoint was loaded.
    starts = [int(line) for line in (tmp_path / "starts.txt").read_text().split()]
    assert starts == [0, int(trained_lifetime)]

    with pytest.raises(FileNotFoundError, match="checkpoint to restore not found"):
        main(["train", "file", str(train_file), "--restore", str(tmp_path / "nope")])


FLAKY_HEAD = """
from pathlib import Path

from envs.maze.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE

MARKER = Path({marker!r})


class FlakyMaze(MazeEnv):
    # Every step raises while the marker says "armed": the whole iteration fails, the trial errors.
    def step(self, action):
        if MARKER.exists() and MARKER.read_text() == "armed":
            raise RuntimeError("injected env failure")
        return super().step(action)


def arm_after_iteration_1(algorithm, result, **kwargs):
    if result["training_iteration"] == 1 and not MARKER.exists():
        MARKER.write_text("armed")


def disarm_on_restart(algorithm, **kwargs):
    if MARKER.exists() and MARKER.read_text() == "armed":
        MARKER.write_text("restarted")
"""


def flaky_train_file(marker: Path, model: Path) -> str:
    return tiny_maze_train_file(
        model,
        env="FlakyMaze",
        head=FLAKY_HEAD.format(marker=str(marker)),
        gagpo=", prompt_template=PROMPT_TEMPLATE, first_prompt_template=FIRST_PROMPT_TEMPLATE",
        config_tail="\n    .callbacks(on_train_result=arm_after_iteration_1, on_algorithm_init=disarm_on_restart)",
    )


def test_max_failures_restarts_a_failed_trial_from_its_checkpoint(
    ray_session, tmp_path: Path, tiny_policy_path: Path, capsys
) -> None:
    marker = tmp_path / "fault"
    train_file = tmp_path / "flaky.py"
    train_file.write_text(flaky_train_file(marker, tiny_policy_path))
    storage = tmp_path / "results"
    args = ["train", "file", str(train_file), "--stop", '{"training_iteration": 3}', "--checkpoint-freq", "1"]
    args += ["--storage-path", str(storage), "--name", "flaky", "--max-failures", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert marker.read_text() == "restarted"  # iteration 2 failed once, a new Algorithm took over
    assert "iter 3/3" in out and "trial failed" not in out
    # Restarted from checkpoint_000000 (iteration 1), not from scratch: iteration 1 is reported once.
    assert [int(r["training_iteration"]) for r in progress_rows(storage / "flaky")] == [1, 2, 3]


LEARNER_KILLER_HEAD = """
import os
import signal
from pathlib import Path

from envs.maze.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE

MARKER = Path({marker!r})


def arm_after_iteration_3(algorithm, result, **kwargs):
    if result["training_iteration"] == 3 and not MARKER.exists():
        pid = next(iter(algorithm.learner_group.foreach_learner(lambda learner: os.getpid()))).get()
        MARKER.write_text(f"armed {{pid}}")


class LearnerKillingMaze(MazeEnv):
    # The first env step of iteration 4 SIGKILLs the remote learner's process: the update fails, the trial errors.
    def step(self, action):
        if MARKER.exists() and MARKER.read_text().startswith("armed"):
            pid = int(MARKER.read_text().split()[1])
            MARKER.write_text("killed")
            os.kill(pid, signal.SIGKILL)
        return super().step(action)
"""


def test_a_learner_killed_mid_run_restores_bit_for_bit_from_the_kept_checkpoints(
    ray_session, tmp_path: Path, tiny_policy_path: Path
) -> None:
    """One remote learner, a checkpoint every iteration, 2 kept. A SIGKILL of the learner in iteration 4 under
    --max-failures 1 ends on the uninterrupted run's weights bit for bit, with only 2 checkpoints (and the best)
    left; restoring the last kept checkpoint and training on also lands on them."""
    marker = tmp_path / "kill"
    head = LEARNER_KILLER_HEAD.format(marker=str(marker))
    prompts = ", prompt_template=PROMPT_TEMPLATE, first_prompt_template=FIRST_PROMPT_TEMPLATE"
    files = {}
    for name, env, tail in (
        ("plain", "MazeEnv", ""),
        ("killed", "LearnerKillingMaze", "\n    .callbacks(on_train_result=arm_after_iteration_3)"),
    ):
        files[name] = tmp_path / f"{name}.py"
        files[name].write_text(
            tiny_maze_train_file(
                tiny_policy_path,
                env=env,
                head=head,
                gagpo=prompts,
                config_tail="\n    .learners(num_learners=1)" + tail,
            )
        )
    storage = tmp_path / "results"
    common = ["--checkpoint-freq", "1", "--keep-checkpoints", "2", "--storage-path", str(storage)]
    for name in ("plain", "killed"):
        args = ["train", "file", str(files[name]), "--stop", '{"training_iteration": 6}', *common]
        assert main([*args, "--name", name, "--max-failures", "1"]) == 0
    assert marker.read_text() == "killed"  # the learner did die in iteration 4
    assert [int(r["training_iteration"]) for r in progress_rows(storage / "killed")] == [1, 2, 3, 4, 5, 6]
    kept = sorted(p.name for p in (storage / "killed").rglob("checkpoint_0*"))
    assert kept == ["checkpoint_000004", "checkpoint_000005"]
    assert len(list((storage / "killed").rglob("best_checkpoint"))) == 1
    plain = run_weights(storage / "plain")
    assert_same_weights(run_weights(storage / "killed"), plain)

    (last_but_one,) = (storage / "plain").rglob("checkpoint_000004")
    args = ["train", "file", str(files["plain"]), "--stop", '{"training_iteration": 6}', *common]
    assert main([*args, "--name", "restored", "--restore", str(last_but_one)]) == 0
    assert_same_weights(run_weights(storage / "restored", "checkpoint_000000"), plain)


def test_sft_help_and_argument_errors(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["sft", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--env", "--file", "--epochs", "--heldout", "--seed", "--constrained", "--history-length"):
        assert option in text
    with pytest.raises(ValueError, match="exactly one of --env or --file"):
        main(["sft", "model", "out"])
    with pytest.raises(ValueError, match="--env"):
        main(["sft", "model", "out", "--env", "chess"])
