"""Split schemes: the original WebShop baselines' and the GiGPO reference's cut points, at full size and scaled,
and the paper configuration's train and validation goals on a synthetic catalogue of more than 3,000 goals."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from envs.webshop import WebShopEnv
from envs.webshop.generator import write_catalogue
from envs.webshop.goals import split_bounds

TUNED_EXAMPLE = Path(__file__).resolve().parents[3] / "tuned_examples" / "gagpo_webshop.py"


@pytest.fixture(scope="module")
def full_size_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A generated catalogue of 600 products: 3,063 synthetic goals, so the fixed cut points apply."""
    out = tmp_path_factory.mktemp("webshop_3k")
    write_catalogue(out, 600, seed=0)
    return str(out)


def test_split_schemes_fixed_at_full_size_and_scaled_below():
    assert split_bounds(3063, "gigpo") == {"eval": (0, 500), "train": (500, 3063)}
    assert split_bounds(3063, "webshop") == {"test": (0, 500), "eval": (500, 1500), "train": (1500, 3063)}
    # Below 3,000 goals every cut point c becomes goals * c // 3000.
    assert split_bounds(1528, "gigpo") == {"eval": (0, 254), "train": (254, 1528)}
    assert split_bounds(1528, "webshop") == {"test": (0, 254), "eval": (254, 764), "train": (764, 1528)}
    with pytest.raises(ValueError, match="split_scheme must be one of"):
        split_bounds(3000, "verl")


def test_gigpo_eval_is_the_original_test_split(full_size_dir):
    gigpo = WebShopEnv({"data_dir": full_size_dir, "split": "eval", "split_scheme": "gigpo"})
    webshop = WebShopEnv({"data_dir": full_size_dir, "split": "test"})
    assert len(gigpo.shop.goals) == 3063
    assert gigpo.goal_indices == webshop.goal_indices == range(0, 500)
    assert gigpo.goal(7) is webshop.goal(7)


def test_paper_configuration_trains_and_validates_on_the_gigpo_reference_goals(full_size_dir, monkeypatch):
    monkeypatch.setenv("GAGPO_MODEL", "/models/Qwen2.5-1.5B-Instruct")  # only named: nothing is loaded
    monkeypatch.delenv("GAGPO_GPUS", raising=False)
    config = runpy.run_path(str(TUNED_EXAMPLE), run_name="__paper_config_test__")["config"]
    train = WebShopEnv({**config.env_config, "data_dir": full_size_dir})
    valid = WebShopEnv({**config.evaluation_config["env_config"], "data_dir": full_size_dir})
    assert (config.env_config["split"], config.evaluation_config["env_config"]["split"]) == ("train", "eval")
    assert train.goal_indices == range(500, 3063) and train.goal(0) is train.shop.goals[500]
    assert valid.goal_indices == range(0, 500) and valid.goal(0) is valid.shop.goals[0]
    assert "split: eval (gigpo scheme) = goals [0:500]" in valid.provenance
