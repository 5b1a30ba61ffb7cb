"""The tuned examples: ALFWorld/WebShop configs (CPU default and the paper's set-up) and a 2-trial Tune sweep."""

from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

import pytest
import ray
from ray import tune

from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.checkpoints import config_from_checkpoint
from gagpo_rllib.tools.train import load_train_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tuned_examples"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_policies")


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(cache / "alfworld_data"))
    monkeypatch.setenv("GAGPO_TINY_ALFWORLD_DIR", str(cache / "alfworld"))
    monkeypatch.setenv("GAGPO_TINY_WEBSHOP_DIR", str(cache / "webshop"))
    monkeypatch.delenv("GAGPO_MODEL", raising=False)
    monkeypatch.delenv("GAGPO_GPUS", raising=False)
    # The CPU default's warm start (30 epochs of fine-tuning) is covered by tests/gagpo_rllib/tools/test_sft.py.
    monkeypatch.setenv("GAGPO_ALFWORLD_WARM_START", "0")


def sweep_module():
    sys.modules.pop("tuned_examples.gagpo_alfworld", None)
    sys.modules.pop("tuned_examples.tune_gagpo_alfworld", None)
    return importlib.import_module("tuned_examples.tune_gagpo_alfworld")


@pytest.mark.parametrize(
    ("name", "env", "max_steps"), [("alfworld", "AlfworldEnv", 30), ("webshop", "WebShopEnv", 15)]
)
def test_cpu_default_of_each_example(offline_env, cache: Path, name: str, env: str, max_steps: int) -> None:
    spec = load_train_file(EXAMPLES / f"gagpo_{name}.py")
    config = spec.config
    assert isinstance(config, GAGPOConfig) and config.env.__name__ == env
    # Reading the file builds nothing: the tiny policy is built (cached) when training starts.
    assert not (cache / name).exists()
    config.run_setup_start()
    assert config.model_path == str(cache / name) and (cache / name / "config.json").is_file()
    assert config.constrained_decoding and config.backend == "hf" and config.dtype == "float32"
    assert config.max_steps == max_steps
    assert spec.stop == {"training_iteration": {"alfworld": 5, "webshop": 40}[name]}
    if name == "webshop":  # the tiny policy types searches from the goal's words, learns from the score
        assert (
            config.env_config["search_grammar"] == "goal_prefix"
            and config.env_config["reward_mode"] == "score"
        )
    assert config.evaluation_interval == 5 and config.custom_evaluation_function is not None
    assert (
        config.evaluation_config["env_config"]["split"]
        == {"alfworld": "valid_unseen", "webshop": "eval"}[name]
    )
    config.validate()  # a runnable configuration: every GAGPO field checked


@pytest.mark.parametrize(("name", "max_steps"), [("alfworld", 50), ("webshop", 15)])
def test_paper_setup_with_a_model(
    offline_env, monkeypatch: pytest.MonkeyPatch, tiny_policy_path: Path, name: str, max_steps: int
) -> None:
    monkeypatch.setenv("GAGPO_MODEL", str(tiny_policy_path))
    spec = load_train_file(EXAMPLES / f"gagpo_{name}.py")
    c = spec.config
    assert (c.model_path, c.group_size, c.groups_per_iteration, c.max_steps) == (
        str(tiny_policy_path),
        8,
        16,
        max_steps,
    )
    assert (c.history_length, c.gamma, c.lr, c.kl_coeff, c.temperature, c.eval_temperature) == (
        2,
        0.95,
        1e-6,
        0.01,
        1.0,
        0.4,
    )
    assert not c.constrained_decoding and (c.backend, c.dtype) == ("hf", "float32")  # no GPU here
    assert spec.stop == {"training_iteration": 150}
    assert c.evaluation_interval == 5
    assert c.evaluation_config["env_config"]["split"] == {"alfworld": "valid_unseen", "webshop": "eval"}[name]
    c.validate()
    module = importlib.import_module(f"tuned_examples.gagpo_{name}")
    gpu = module.paper_config(str(tiny_policy_path), num_gpus=1)
    # one GPU, shared (the default): the learner over half of it, the runner the rest, of which a fifth is left to
    # the validation runner; the engines sleep during the update
    assert (gpu.backend, gpu.dtype, gpu.num_gpus_per_env_runner) == ("vllm", "bfloat16", pytest.approx(0.392))
    assert gpu.num_gpus_per_learner == 0.51 and gpu.evaluation_config[
        "num_gpus_per_env_runner"
    ] == pytest.approx(0.098)
    assert gpu.sleep_engines_during_update
    assert (
        gpu.evaluation_config["backend_kwargs"]["gpu_memory_utilization"]
        < gpu.backend_kwargs["gpu_memory_utilization"]
    )
    # GAGPO_COLOCATE=0: half for the learner, half for the runner
    monkeypatch.setenv("GAGPO_COLOCATE", "0")
    apart = module.paper_config(str(tiny_policy_path), num_gpus=1)
    assert (apart.num_gpus_per_learner, apart.num_gpus_per_env_runner) == (0.5, pytest.approx(0.4))
    assert not apart.sleep_engines_during_update


def test_resources_fit_the_machine(offline_env, tiny_policy_path: Path) -> None:
    sweep = sweep_module()
    base = GAGPOConfig().llm(model_path=str(tiny_policy_path)).env_runners(num_env_runners=2)
    config, concurrent = sweep.fit_to_machine(base, num_cpus=2)
    assert (config.num_env_runners, concurrent) == (0, 1)  # would otherwise wait forever for a third CPU
    config, concurrent = sweep.fit_to_machine(base, num_cpus=9)
    assert (config.num_env_runners, concurrent) == (2, 3)
    gpu = base.copy(copy_frozen=False).env_runners(num_gpus_per_env_runner=0.5)
    assert sweep.fit_to_machine(gpu, num_cpus=32, num_gpus=2)[1] == 2
    swept = sweep.with_search_space(base, {"lam": [0.9, 1.0], "group_size": [2, 4]})
    assert swept.lam == tune.grid_search([0.9, 1.0]) and base.lam == 0.95
    with pytest.raises(ValueError, match="unknown field"):
        sweep.with_search_space(base, {"omega": [1.0]})


def test_smoke_sweep_reports_the_best_trial(offline_env, tmp_path: Path, capsys) -> None:
    sweep = sweep_module()
    try:
        code = sweep.main(["--smoke", "--storage", str(tmp_path), "--num-cpus", "2"])
    finally:
        ray.shutdown()
    assert code == 0
    out = capsys.readouterr().out
    assert "2 CPUs, 0 GPUs -> 1 trial(s) at a time" in out
    assert "best trial: lam=" in out
    with open(tmp_path / "tune_gagpo_alfworld_smoke" / "sweep_summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(float(r["lam"]) for r in rows) == [0.9, 1.0]
    assert all(r["error"] == "" and 0.0 <= float(r["success_rate"]) <= 1.0 for r in rows)
    # Each trial's algorithm really ran with its own lam (read back from its checkpoint).
    for row in rows:
        checkpoint = sorted(Path(row["path"]).glob("checkpoint_*"))[-1]
        assert config_from_checkpoint(checkpoint).lam == float(row["lam"])


def test_alfworld_cpu_default_trains_on_games_the_warm_start_did_not_see(offline_env) -> None:
    """One held-out game of each task type, drawn from a fixed seed; none of them in the warm start's set."""
    from envs.alfworld import TASK_TYPES
    from envs.alfworld.games import BUNDLED_DATA, find_games
    from gagpo_rllib.tools import alfworld_warm_start

    example = vars(alfworld_warm_start)
    warm, held_out = example["split_games"]()
    games = find_games(BUNDLED_DATA, "train").games
    assert not set(warm) & set(held_out) and sorted(warm + held_out) == list(range(len(games)))
    chosen = example["gagpo_train_games"](held_out, 1)
    assert set(chosen) <= set(held_out)
    assert sorted(games[i].task_type for i in chosen) == sorted(TASK_TYPES)
    assert example["gagpo_train_games"](held_out, 1) == chosen  # the same games every time
    assert len(example["gagpo_train_games"](held_out, 3)) == len(held_out) == 3 * len(TASK_TYPES)
