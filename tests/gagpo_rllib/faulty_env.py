"""CorridorEnv with injectable faults, for the fault-tolerance tests (set at build time or on a live runner).

Faults: ``fail_step_task`` (``step`` raises on that task id), ``fail_reset_task`` (``reset`` raises on that task
id), ``fail_always`` (every ``step`` raises), ``step_sleep_s`` (a slow step, so a runner can be killed while it
samples) and ``step_marker`` (a file touched at every step: the runner is sampling).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.gagpo_rllib.toy_env import CorridorEnv

FAULT_KEYS = ("fail_step_task", "fail_reset_task", "fail_always", "step_sleep_s", "step_marker")


class InjectedEnvError(RuntimeError):
    """The exception a faulty env raises."""


class FaultyCorridorEnv(CorridorEnv):
    """CorridorEnv whose ``reset``/``step`` raise or slow down as configured."""

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.faults: dict[str, Any] = {}
        self.set_faults(**{k: config.pop(k) for k in FAULT_KEYS if k in config})
        super().__init__(config)

    def set_faults(self, **faults: Any) -> None:
        """Replace the active faults (no keyword: none)."""
        unknown = set(faults) - set(FAULT_KEYS)
        if unknown:
            raise ValueError(f"FaultyCorridorEnv: unknown faults {sorted(unknown)}")
        self.faults = dict(faults)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        task = (options or {}).get("task_id")
        if task is not None and task == self.faults.get("fail_reset_task"):
            raise InjectedEnvError(f"reset of task {task} fails")
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        if self.faults.get("step_marker"):
            Path(self.faults["step_marker"]).touch()
        if self.faults.get("step_sleep_s"):
            time.sleep(float(self.faults["step_sleep_s"]))
        if self.faults.get("fail_always") or self.task_id == self.faults.get("fail_step_task"):
            raise InjectedEnvError(f"step of task {self.task_id} fails")
        return super().step(action)


def set_runner_faults(runner: Any, **faults: Any) -> None:
    """Set the faults of every sub-env of an EnvRunner (for ``foreach_env_runner``)."""
    for env in runner.sub_envs():
        env.unwrapped.set_faults(**faults)
