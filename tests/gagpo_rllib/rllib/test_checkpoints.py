"""Checkpoints of earlier versions: moved module paths still load; a name no version has names its writer."""

from __future__ import annotations

import importlib
import json
import pickle
from pathlib import Path

import pytest

from gagpo_rllib.moved import MOVED
from gagpo_rllib.rllib.checkpoints import VERSION_FILE, config_from_checkpoint, load_pickle, package_version


def _global_pickle(module: str, name: str) -> bytes:
    """A pickle of the object ``module.name`` as a checkpoint of the version that had that path writes it."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n."


def test_every_old_path_is_gone_today_and_its_names_live_on() -> None:
    root = Path(__file__).resolve().parents[3]
    for old, targets in MOVED.items():
        where = root / old.replace(".", "/")
        assert not where.with_suffix(".py").exists() and not where.is_dir(), old
        for target in targets:
            importlib.import_module(target)
    from gagpo_rllib.policy.rl_module import LLMRLModule
    from gagpo_rllib.rllib.groups import GroupShardedTrainingData
    from gagpo_rllib.rllib.placement import resource_shortfall

    old_module = importlib.import_module("gagpo_rllib.rl_module")
    assert old_module.LLMRLModule is LLMRLModule  # one class, not a second copy
    split = importlib.import_module("gagpo_rllib.sharding")
    assert split.GroupShardedTrainingData is GroupShardedTrainingData
    assert split.resource_shortfall is resource_shortfall


def test_pickles_naming_old_paths_load(tmp_path: Path) -> None:
    from gagpo_rllib.rllib.connectors.rollout import ActionParserConnector, PromptConnector
    from gagpo_rllib.rllib.groups import fill_informative_groups

    cases = {
        ("gagpo_rllib.connectors.env_to_module", "PromptConnector"): PromptConnector,
        ("gagpo_rllib.rllib.dynamic_sampling", "fill_informative_groups"): fill_informative_groups,
        (
            "gagpo_rllib.connectors.module_to_env",
            "ActionParserConnector.__call__",
        ): ActionParserConnector.__call__,
    }
    for (module, name), expected in cases.items():
        path = tmp_path / "x.pkl"
        path.write_bytes(_global_pickle(module, name))
        assert load_pickle(path) is expected
        if "." not in name:  # protocol 0's GLOBAL names a module attribute; qualified names are protocol 4's
            assert pickle.loads(_global_pickle(module, name)) is expected  # RLlib's own unpickling too


def test_a_name_no_version_has_is_refused_with_the_writer(tmp_path: Path) -> None:
    (tmp_path / VERSION_FILE).write_text(json.dumps({"gagpo_rllib_version": "0.0.9"}))
    path = tmp_path / "class_and_ctor_args.pkl"
    path.write_bytes(_global_pickle("gagpo_rllib.rllib.config", "NoSuchConfig"))
    with pytest.raises(
        ValueError, match=r"class_and_ctor_args.pkl: written by gagpo-rllib 0.0.9.*NoSuchConfig"
    ):
        load_pickle(path)


def test_a_checkpoint_records_its_writer_and_reads_back(tiny_maze_config, tmp_path: Path) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = tiny_maze_config().build_algo()
    try:
        path = Path(algo.save_to_path(str(tmp_path / "ckpt")))
    finally:
        algo.stop()
        ray.shutdown()
    assert json.loads((path / VERSION_FILE).read_text()) == {"gagpo_rllib_version": package_version()}
    assert config_from_checkpoint(path).group_size == 2
