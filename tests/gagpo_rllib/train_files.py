"""Train files for ``rllib train file`` tests (the built-in maze, 2 groups of 2 rollouts, 6 steps, seed 0), running
one in a process of its own, and comparing the weights its checkpoints hold."""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path


def tiny_maze_train_file(
    model: Path,
    *,
    env: str = "MazeEnv",
    head: str = "",
    gagpo: str = "",
    config_tail: str = "",
    tail: str = "",
) -> str:
    """The file's text: ``head`` (imports, env classes, callbacks) after the usual imports, then ``config``;
    ``gagpo`` adds keyword arguments of any setter (``configure`` routes each), ``config_tail`` calls after the
    config's setters, ``tail`` lines after the config (``stop``, more callbacks)."""
    return f"""
from envs.maze import MazeEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.config import configure
{head}

config = (
    configure(
        GAGPOConfig()
        .environment({env}, env_config={{"split": "train", "num_tasks": 4}})
        .env_runners(num_env_runners=0)
        .training(lr=5e-4, minibatch_size=512)
        .debugging(seed=0),
        model_path={str(model)!r}, group_size=2, groups_per_iteration=2, constrained_decoding=True,
        max_new_tokens=8, max_steps=6{gagpo}
    ){config_tail}
)
{tail}"""


@contextlib.contextmanager
def running_train_file(
    train_file: Path, args: list[str], *, cwd: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen, queue.Queue[str]]]:
    """``rllib train file`` (``python -m gagpo_rllib.tools.cli``) in a process of its own, its output lines in a queue;
    interrupted (SIGINT, then killed after 90 s) when the block ends."""
    command = [sys.executable, "-m", "gagpo_rllib.tools.cli", "train", "file", str(train_file), *args]
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        yield proc, lines
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_weights(run: Path, checkpoint: str = "checkpoint_000005") -> dict:
    """The policy weights (Hugging Face names) of the one checkpoint named ``checkpoint`` under a run folder."""
    from gagpo_rllib.tools.export import read_module_checkpoint

    (folder,) = run.rglob(checkpoint)
    return read_module_checkpoint(folder)[1]


def assert_same_weights(got: dict, want: dict) -> None:
    """The same tensors under the same names, bit for bit."""
    import torch

    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name
