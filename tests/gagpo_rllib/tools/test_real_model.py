"""The real-model recipe end to end on the real model: SmolLM2-135M-Instruct, a short warm start, 2 iterations of
GAGPO through the recipe's own path (vLLM CPU engine in an EnvRunner, constrained decoding, the learner in the
driver), float32 so that the first minibatch's ratio is 1 to float32 rounding. The engine runs eagerly: its
compiled warm-up is longer than this test's rollouts (the test took 375 s eager, 555 s compiled, on a 2-core AVX2
machine); the compiled engine's weight syncs are checked by tests/gagpo_rllib/rllib/test_vllm_engine_rllib.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from gagpo_rllib.policy.models import cpu_compute_dtype
from gagpo_rllib.rllib.rllib_internals import local_learner
from gagpo_rllib.tools.real_model import (
    ALFWORLD,
    RECIPES,
    WEBSHOP,
    WarmStartStage,
    train_config,
    train_games,
    train_games_dir,
    warm_start,
)


def _weights(algo) -> dict[str, torch.Tensor]:
    module = local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped()
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_recipes_train_where_they_evaluate_and_warm_start_in_the_rollout_format() -> None:
    """Held-out tasks are of the trained kind but never trained on; the warm start uses the rollout's history."""
    assert set(RECIPES) == {"alfworld", "webshop"}
    assert ALFWORLD.train_env_config["split"] == "train" and ALFWORLD.held_out_split == "valid_unseen"
    assert ALFWORLD.held_out_env_config["task_types"] == ALFWORLD.train_env_config["task_types"]
    assert WEBSHOP.train_env_config["split"] == "train" and WEBSHOP.held_out_split == "eval"
    for recipe in RECIPES.values():
        config = train_config(recipe, "/models/any", seed=3)
        assert config.constrained_decoding and config.backend == "vllm"
        assert config.dtype == recipe.dtype == cpu_compute_dtype()
        assert train_config(recipe, "/m", dtype="float32").dtype == "float32"
        assert config.history_length == recipe.history_length == recipe.warm_start.history_length
        assert config.num_env_runners == 1 and config.seed == 3
    assert train_config(ALFWORLD, "/m", estimator="grpo").estimator == "grpo"


def test_alfworld_rl_plays_generated_games_and_evaluates_on_the_bundled_held_out_split(
    tmp_path: Path,
) -> None:
    """RL's games are generated once (a folder without its record is built again); held-out stays the bundled
    valid_unseen split, and WebShop plays its own train split."""
    recipe = replace(
        ALFWORLD,
        generated_train_games=1,
        train_env_config={"split": "train", "task_types": ["look_at_obj_in_light"]},
    )
    games = train_games(recipe, tmp_path)
    assert games == WarmStartStage(recipe, tmp_path).games_dir
    assert json.loads((games / "games.json").read_text())["games"] == {"look_at_obj_in_light": 1}
    (trial,) = games.glob("train/*/trial_*/game.tw-pddl")
    stamp = trial.stat().st_mtime_ns
    assert train_games(recipe, tmp_path) == games and trial.stat().st_mtime_ns == stamp
    (games / "games.json").unlink()
    assert train_games(recipe, tmp_path) == games and (games / "games.json").is_file()

    config = train_config(recipe, "/m", games=games)
    assert config.env_config["data_dir"] == str(games) and config.env_config["split"] == "train"
    assert "data_dir" not in recipe.held_out_env_config and "data_dir" not in recipe.train_env_config
    assert ALFWORLD.generated_train_games > 0 and train_games(WEBSHOP, tmp_path) is None
    assert train_games_dir(replace(recipe, env="alfworld"), tmp_path) == games  # the command line's alias

    for bad, field in (
        (replace(recipe, generated_train_games=-1), "must be >= 0"),
        (replace(recipe, train_env_config={"split": "train"}), "task_types"),
        (replace(WEBSHOP, generated_train_games=2), "generates ALFWorld games"),
    ):
        with pytest.raises(ValueError, match=f"generated_train_games.*{field}"):
            train_games(bad, tmp_path)


@pytest.mark.usefixtures("ray_local")
def test_two_iterations_of_the_recipe_take_a_step_on_the_real_model(smollm2: Path, tmp_path: Path) -> None:
    recipe = replace(
        WEBSHOP,
        warm_start=replace(WEBSHOP.warm_start, max_train_steps=16, heldout_fraction=0.0),
        dtype="float32",
        warm_start_tasks=4,
        group_size=4,
        groups_per_iteration=1,
        max_steps=5,
    )
    warm = warm_start(recipe, smollm2, tmp_path / "warm", seed=0)
    record = json.loads((warm / "warm_start.json").read_text())
    manifest = json.loads((warm / "sft.json").read_text())
    assert manifest["train_steps"] >= 16 and record["seconds"] > 0
    assert json.loads((warm / "sft.json").read_text())["settings"]["dtype"] == "float32"
    config = train_config(recipe, warm, seed=0)
    config.env_runners(backend_kwargs={**config.backend_kwargs, "enforce_eager": True})
    algo = config.build_algo()
    try:
        before = _weights(algo)
        results = [algo.train() for _ in range(2)]
        after = _weights(algo)
    finally:
        algo.stop()
    trained = [r["learners"]["default_policy"] for r in results if "default_policy" in r.get("learners", {})]
    assert trained, "no iteration trained: every group was uniform"
    for learner in trained:
        assert learner["first_minibatch_ratio_max_dev"] < 1e-5
        # WebShop's KL term to the warm start: the frozen reference's log-probs were computed for the loss.
        assert recipe.kl_coeff > 0 and "reference_cache_hit_share" in learner
    assert any(not torch.equal(before[k], after[k]) for k in before), "the weights did not change"
    for r in results:
        assert r["gagpo"]["num_episodes"] == 4 and r["gagpo"]["invalid_action_share"] == 0.0
