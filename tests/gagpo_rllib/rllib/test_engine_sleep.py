"""``sleep_engines_during_update``: GAGPO through RLlib with the vLLM stand-in (tests/fakes/vllm), on CPU.

The stand-in's event log and its sleeping state show what the engine went through; its level-1 sleep
overwrites the engine's weights with NaN until it wakes, so an engine that generated while asleep shows.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest
import ray
import torch

from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation
from tests.fakes.vllm_path import FAKES, fake_vllm_on_path

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ray_cluster():
    # Remote EnvRunners import the stand-in too (the driver puts it on its sys.path per test).
    path = os.pathsep.join([str(FAKES), str(REPO), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def _sleeping_config(tiny_maze_config, **gagpo):
    """One remote EnvRunner: engines run only on remote runners (the local one holds no GPU for one)."""
    return tiny_maze_config(
        backend="vllm",
        backend_kwargs={"device": "cpu", "enable_sleep_mode": True},
        max_prompt_tokens=600,
        sleep_engines_during_update=True,
        **gagpo,
    ).env_runners(num_env_runners=1)


def _on_engine(group, fn):
    """``fn(engine)`` on the stand-in engine of the group's one remote runner."""
    return group.foreach_env_runner(lambda r: fn(r.module.started_backend.llm), local_env_runner=False)[0]


def _events(group) -> list:
    return _on_engine(group, lambda e: list(e.events))


def _level(group):
    return _on_engine(group, lambda e: e.sleeping_level)


def _has_nan(group) -> bool:
    return _on_engine(group, lambda e: any(math.isnan(float(w.abs().sum())) for _, w in e.weights()))


def test_engines_sleep_through_the_update_and_wake_with_new_weights(ray_cluster, tiny_maze_config) -> None:
    """The training engine and the validation engine (one local evaluation runner) share the update's GPU."""
    with fake_vllm_on_path():
        config = with_validation(
            _sleeping_config(tiny_maze_config), split="eval", interval=1, settings=EvalSettings(num_tasks=1)
        )
        algo = config.build_algo()
        try:
            train, valid = algo.env_runner_group, algo.eval_env_runner_group
            update = algo.learner_group.update
            level_during_update = []

            def recording_update(*args, **kwargs):
                level_during_update.append((_level(train), _level(valid)))
                return update(*args, **kwargs)

            algo.learner_group.update = recording_update
            learner_model = algo.learner_group._learner.module["default_policy"].model
            for it in range(2):
                start, eval_start = len(_events(train)), len(_events(valid))
                result = algo.train()
                events = _events(train)[start:]
                eval_events = _events(valid)
                kinds = [e[0] for e in events]
                assert level_during_update == [(1, 1)] * (it + 1), it  # asleep while the learner updated
                assert "generate" in kinds, it  # the engine sampled this iteration (woken by the last sync)
                slept = kinds.index("sleep")
                assert all(k == "generate" for k in kinds[:slept]), events
                assert events[slept:] == [("sleep", 1), ("wake_up", None), ("rpc", "reload_weights", None)]
                assert _level(train) is None and _level(valid) is None
                # Both woke before the weight sync; the evaluation engine took the weights before validating.
                assert eval_events[eval_start : eval_start + 3] == [
                    ("sleep", 1),
                    ("wake_up", None),
                    ("rpc", "reload_weights", None),
                ]
                assert eval_events[-1][0] == "generate"
                assert result["evaluation"]["valid"]["num_episodes"] >= 1
                assert result["gagpo"]["engines_slept"] == 2.0
                assert result["gagpo"]["engines_woken"] == 2.0
                assert result["gagpo"]["engine_sleep_failures"] == 0.0
                assert result["gagpo"]["engine_wake_failures"] == 0.0
                assert result["gagpo"]["num_episodes"] == 4.0
                want = {k: v.to(torch.float32) for k, v in learner_model.state_dict().items()}
                for name, weight in _on_engine(train, lambda e: dict(e.weights())).items():
                    assert torch.equal(weight, want[name].to(weight.dtype)), name
            assert not _has_nan(train)
        finally:
            algo.stop()


def test_a_skipped_update_leaves_the_engine_awake(ray_cluster, tiny_maze_config) -> None:
    """One member per group: every group is uniform, ``skip_uniform_groups`` skips each update."""
    with fake_vllm_on_path():
        algo = _sleeping_config(
            tiny_maze_config, group_size=1, groups_per_iteration=2, skip_uniform_groups=True
        ).build_algo()
        try:
            group = algo.env_runner_group
            for it in range(2):
                start = len(_events(group))
                result = algo.train()
                events = _events(group)[start:]
                assert result["gagpo"]["update_skipped"] == 1.0
                assert _level(group) is None
                assert events and all(e[0] == "generate" for e in events), (it, events)  # no sleep, no sync
        finally:
            algo.stop()


def test_validation_names_sleep_engines_during_update(tiny_maze_config) -> None:
    with pytest.raises(ValueError, match="sleep_engines_during_update must be a bool"):
        tiny_maze_config(sleep_engines_during_update=1).validate()
    with pytest.raises(ValueError, match="sleep_engines_during_update=True needs backend 'vllm'"):
        tiny_maze_config(sleep_engines_during_update=True).validate()
    with pytest.raises(ValueError, match=r"needs backend_kwargs\['enable_sleep_mode'\]"):
        tiny_maze_config(backend="vllm", sleep_engines_during_update=True).env_runners(
            num_env_runners=1
        ).validate()
    config = _sleeping_config(tiny_maze_config).evaluation(
        evaluation_interval=1, evaluation_config={"backend_kwargs": {"device": "cpu"}}
    )
    with pytest.raises(ValueError, match=r"evaluation_config\['backend_kwargs'\]\['enable_sleep_mode'\]"):
        config.validate()
    _sleeping_config(tiny_maze_config).validate()
    tiny_maze_config(backend="vllm", backend_kwargs={"enable_sleep_mode": True}).env_runners(
        num_env_runners=1
    ).validate()  # option off


def test_a_runner_killed_before_the_update_does_not_stop_training(ray_cluster, tiny_maze_config) -> None:
    """Two remote EnvRunners, one killed after sampling: its lost sleep call is counted, training goes on."""
    with fake_vllm_on_path():
        config = (
            _sleeping_config(tiny_maze_config)
            .env_runners(num_env_runners=2)
            .fault_tolerance(delay_between_env_runner_restarts_s=0.5, group_sampling_timeout_s=120.0)
        )
        algo = config.build_algo()
        try:
            group = algo.env_runner_group
            sample = algo.sample_whole_groups
            killed = []

            def sample_then_kill(*args, **kwargs):
                out = sample(*args, **kwargs)
                if not killed:
                    pid = group.foreach_env_runner(
                        lambda r: os.getpid(), local_env_runner=False, remote_worker_ids=[1]
                    )[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return out

            algo.sample_whole_groups = sample_then_kill
            first = algo.train()
            assert first["gagpo"]["engine_sleep_failures"] >= 1.0 and first["gagpo"]["engines_slept"] == 1.0
            second = algo.train()  # the healthy runner(s) sample whole groups with awake engines
            assert second["gagpo"]["num_episodes"] == 4.0 and second["gagpo"]["engine_sleep_failures"] == 0.0
            levels = group.foreach_env_runner(
                lambda r: r.module.started_backend.sleep_level, local_env_runner=False
            )
            assert levels and all(level is None for level in levels)  # every healthy runner's engine is awake
        finally:
            algo.stop()


def test_an_update_that_raises_still_wakes_the_engine(ray_cluster, tiny_maze_config) -> None:
    """The error reaches the caller, the engine is awake, and the next iteration samples and updates."""
    with fake_vllm_on_path():
        algo = _sleeping_config(tiny_maze_config).build_algo()
        try:
            group = algo.env_runner_group
            update = algo.learner_group.update

            def failing_update(*args, **kwargs):
                assert _level(group) == 1
                raise RuntimeError("update failed")

            algo.learner_group.update = failing_update
            with pytest.raises(RuntimeError, match="update failed"):
                algo.training_step()
            assert _level(group) is None
            assert _events(group)[-1] == ("wake_up", None)
            algo.learner_group.update = update
            result = algo.train()
            assert result["gagpo"]["update_skipped"] == 0.0
            assert result["gagpo"]["engines_woken"] == 1.0
            assert not _has_nan(group)
        finally:
            algo.stop()
