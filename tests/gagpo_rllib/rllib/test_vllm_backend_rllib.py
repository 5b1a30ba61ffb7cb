"""GAGPO with ``backend="vllm"`` through RLlib end to end, on the vLLM 0.33 stand-in (tests/fakes/vllm).

Checks the glue around the engine: engines start on remote EnvRunners only (never in the driver's or, under Tune,
the Algorithm's process), the EnvRunner keeps no Hugging Face copy, every weight sync lands in the engine (tensor
for tensor), the engine is sized to max_prompt_tokens + max_new_tokens, and the learner's recomputed old
log-probs start every update at ratio 1. Not vLLM's kernels (see the stand-in's docstring). The stand-in is used
here because the point is counting engine constructions per process, which its engine log records.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
import torch

from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation
from tests.fakes.vllm_path import FAKES, fake_vllm_on_path

REPO = Path(__file__).resolve().parents[3]
ENGINE_LOG_ENV = "VLLM_STAND_IN_ENGINE_LOG"


@pytest.fixture(scope="module")
def engine_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines") / "engines.log"


@pytest.fixture(scope="module")
def ray_cluster(engine_log):
    # Remote EnvRunners import the stand-in too, and log each engine they build with their process id.
    path = os.pathsep.join([str(FAKES), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, ENGINE_LOG_ENV: str(engine_log)}
    ray.init(
        address="local",
        num_cpus=3,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    yield
    ray.shutdown()


def _remote_config(tiny_maze_config, **gagpo) -> GAGPOConfig:
    return tiny_maze_config(
        backend="vllm", backend_kwargs={"device": "cpu"}, max_prompt_tokens=600, **gagpo
    ).env_runners(num_env_runners=1)


def _on_engine(algo, fn):
    """``fn(engine)`` on the stand-in engine of the one remote training runner."""
    group = algo.env_runner_group
    return group.foreach_env_runner(lambda r: fn(r.module.started_backend.llm), local_env_runner=False)[0]


def _engine_matches_learner(algo) -> None:
    learner_model = algo.learner_group._learner.module["default_policy"].model
    local = algo.env_runner_group.local_env_runner.module
    assert local.started_backend is None and local.model is None  # no engine, no weights in the driver
    runner = algo.env_runner_group.foreach_env_runner(
        lambda r: (r.module.model is None, r.module.dtype), local_env_runner=False
    )[0]
    assert runner[0]  # no second Hugging Face copy on the runner
    want = learner_model.state_dict()
    got = _on_engine(algo, lambda e: dict(e.weights()))
    assert set(got) == set(want)
    # The runner receives the learner's (fp32 master) weights cast to the rollout dtype.
    for name, weight in got.items():
        assert torch.equal(weight, want[name].to(runner[1]).to(weight.dtype)), name


def test_two_iterations_sync_the_learners_weights_into_the_engine(ray_cluster, tiny_maze_config) -> None:
    with fake_vllm_on_path():
        algo = _remote_config(tiny_maze_config).build_algo()
        try:
            # created at build time, sized to the prompts
            assert _on_engine(algo, lambda e: e.model_config.max_model_len) == 600 + 8
            before = _on_engine(algo, lambda e: {k: v.clone() for k, v in e.weights()})
            for it in range(2):
                resets, reloads = _on_engine(algo, lambda e: (e.prefix_cache_resets, e.worker.reloads))
                result = algo.train()
                learner = result["learners"]["default_policy"]
                assert learner["first_minibatch_ratio_max_dev"] < 1e-6, it
                after = _on_engine(algo, lambda e: (e.prefix_cache_resets, e.worker.reloads))
                assert after == (resets + 1, reloads + 1)
                _engine_matches_learner(algo)
                gagpo = result["gagpo"]
                assert (gagpo["engines_training"], gagpo["engines_algorithm_process"]) == (1.0, 0.0)
                assert gagpo["weight_sync_runners"] == 1.0  # the remote runner; the local one takes no copy
            now = _on_engine(algo, lambda e: dict(e.weights()))
            assert any(not torch.equal(before[k], v) for k, v in now.items())  # the policy moved
        finally:
            algo.stop()


def test_free_answers_at_temperature_0_6_start_every_iteration_at_ratio_one(
    ray_cluster, tiny_maze_config
) -> None:
    """The learner recomputes the behaviour log-probs of the engine's samples: ratio 1 in every iteration."""
    with fake_vllm_on_path():
        config = _remote_config(tiny_maze_config, temperature=0.6, constrained_decoding=False)
        assert config.uses_recomputed_old_logprobs
        algo = config.build_algo()
        try:
            devs = [
                algo.train()["learners"]["default_policy"]["first_minibatch_ratio_max_dev"] for _ in range(3)
            ]
        finally:
            algo.stop()
    assert max(devs) < 1e-6, devs


def test_validation_refuses_vllm_without_recomputed_old_logprobs(tiny_maze_config) -> None:
    with pytest.raises(ValueError, match="recompute_old_logprobs"):
        tiny_maze_config(backend="vllm", recompute_old_logprobs=False).validate()
    with pytest.raises(ValueError, match="eval_temperature"):
        tiny_maze_config(backend="vllm", eval_temperature=2.5).validate()
    remote = tiny_maze_config(backend="vllm", recompute_old_logprobs=True).env_runners(num_env_runners=1)
    remote.validate()
    assert isinstance(tiny_maze_config(backend="vllm"), GAGPOConfig)


def test_vllm_engines_are_refused_where_no_gpu_is_reserved_for_them(tiny_maze_config) -> None:
    """The local runner (driver or Algorithm process) and a local evaluation runner never get an engine."""
    with pytest.raises(ValueError, match="num_env_runners=0 with backend 'vllm'.*set num_env_runners >= 1"):
        tiny_maze_config(backend="vllm").validate()
    config = tiny_maze_config(backend="vllm").env_runners(num_env_runners=1)
    local_eval = with_validation(config, split="eval", interval=1, num_env_runners=0)
    with pytest.raises(ValueError, match="evaluation_num_env_runners=0 with backend 'vllm'"):
        local_eval.validate()
    with_validation(config, split="eval", interval=1).validate()  # one remote evaluation runner by default
    assert with_validation(config, split="eval", interval=1).evaluation_num_env_runners == 1
    hf = tiny_maze_config()
    assert with_validation(hf, split="eval", interval=1).evaluation_num_env_runners == 0


def test_a_bfloat16_learner_syncs_into_the_engine(ray_cluster, tiny_maze_config) -> None:
    """numpy has no bfloat16: the module ships such weights as tensors, the engine takes them in its dtype."""
    with fake_vllm_on_path():
        algo = _remote_config(tiny_maze_config, dtype="bfloat16").build_algo()
        try:
            result = algo.train()
            _engine_matches_learner(algo)
            model = algo.learner_group._learner.module["default_policy"].model
            assert result["gagpo"]["weight_sync_bytes"] == 2 * sum(
                v.numel() for v in model.state_dict().values()
            )
        finally:
            algo.stop()


def test_a_local_runner_never_starts_an_engine(tiny_policy_path) -> None:
    """``rollout_engine`` False (GAGPOEnvRunner's local runner): tokenizer only, syncs dropped, no sampling."""
    from envs.spaces import TextSpace
    from gagpo_rllib.policy.generation import vllm as vllm_backend
    from gagpo_rllib.policy.rl_module import LLMRLModule

    def module(inference_only: bool, engine: bool) -> LLMRLModule:
        return LLMRLModule(
            observation_space=TextSpace(),
            action_space=TextSpace(),
            inference_only=inference_only,
            model_config={
                "model_path": str(tiny_policy_path),
                "backend": "vllm",
                "backend_kwargs": {"device": "cpu"},
                "max_prompt_tokens": 100,
                "rollout_engine": engine,
                "sampling": {"max_new_tokens": 4},
            },
        )

    with fake_vllm_on_path():
        learner = module(False, True)
        started = vllm_backend.engines_started()
        idle = module(True, False)
        assert idle.started_backend is None and idle.model is None and idle.tokenizer.pad_token_id is not None
        idle.set_state(learner.get_state(inference_only=True))
        assert idle.dropped_syncs == 1 and idle.started_backend is None
        with pytest.raises(RuntimeError, match="holds no vLLM engine"):
            idle.backend  # noqa: B018 - reading it would start an engine
        assert vllm_backend.engines_started() == started
        sampling = module(True, True)
        assert sampling.started_backend is not None  # a remote runner starts its engine at once
        assert sampling.started_backend.llm.model_config.max_model_len == 104
        assert vllm_backend.engines_started() == started + 1


def test_under_tune_engines_start_only_on_the_remote_runners(
    ray_cluster, tiny_maze_config, engine_log: Path, tmp_path: Path
) -> None:
    """Tune runs the Algorithm as an actor: one engine for training, one for validation, none in that actor."""
    from gagpo_rllib.tools.train import train

    pid_file = tmp_path / "algorithm.pid"

    def note_pid(algorithm, **kwargs) -> None:
        pid_file.write_text(str(os.getpid()))

    config = with_validation(
        _remote_config(tiny_maze_config), split="eval", interval=1, settings=EvalSettings(num_tasks=1)
    ).callbacks(on_algorithm_init=note_pid)
    engine_log.unlink(missing_ok=True)
    with fake_vllm_on_path():
        results = train(config, stop={"training_iteration": 1}, storage_path=tmp_path / "results", name="t")
    assert not results.errors
    result = results[0].metrics
    builders = [int(line) for line in engine_log.read_text().split()]
    algorithm_pid = int(pid_file.read_text())
    assert len(builders) == 2 and len(set(builders)) == 2, builders  # training + evaluation runner
    assert algorithm_pid not in builders
    gagpo = result["gagpo"]
    assert (gagpo["engines_training"], gagpo["engines_evaluation"]) == (1.0, 1.0)
    assert gagpo["engines_algorithm_process"] == 0.0 and gagpo["engines_started"] == 2.0
    assert result["evaluation"]["valid"]["num_episodes"] >= 1
