"""Reading an Algorithm checkpoint: the one reader that evaluation and export share.

A checkpoint pickles the config and the module's class under the module paths of the version that wrote it; paths
that have moved since are answered by ``gagpo_rllib.moved`` (installed when the package is imported, so RLlib's own
restore finds them too). A name that no version of today's package has fails here with the file, the name and the
version that wrote the checkpoint (``gagpo_rllib.json``, written beside RLlib's files by ``GAGPO.save_to_path``).
"""

from __future__ import annotations

import json
import os
import pickle
from importlib import metadata
from pathlib import Path
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from gagpo_rllib.moved import resolve

__all__ = [
    "MODULE_PATH",
    "VERSION_FILE",
    "config_from_checkpoint",
    "is_checkpoint",
    "load_pickle",
    "module_dir",
    "package_version",
    "write_version",
]

MODULE_PATH = "learner_group/learner/rl_module/default_policy"
VERSION_FILE = "gagpo_rllib.json"


def package_version() -> str:
    """This package's installed version ("unknown" when it runs from a source tree that was never installed)."""
    try:
        return metadata.version("gagpo-rllib")
    except metadata.PackageNotFoundError:
        return "unknown"


def write_version(checkpoint: str | os.PathLike) -> None:
    """Record which version of the package wrote ``checkpoint``."""
    (Path(checkpoint) / VERSION_FILE).write_text(json.dumps({"gagpo_rllib_version": package_version()}))


def _writer(path: Path) -> str:
    for folder in (path, *path.parents):
        if (folder / VERSION_FILE).is_file():
            return json.loads((folder / VERSION_FILE).read_text()).get("gagpo_rllib_version", "unknown")
    return "a version older than 0.1.0 (no gagpo_rllib.json)"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in ("gagpo_rllib", "envs"):
            return resolve(module, name)
        return super().find_class(module, name)


def load_pickle(path: str | os.PathLike) -> Any:
    """Unpickle a checkpoint file; a class this version does not have is a ValueError naming it and the writer."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            return _Unpickler(handle).load()
    except (AttributeError, ImportError) as err:
        raise ValueError(
            f"{path}: written by gagpo-rllib {_writer(path.parent)}, names what this version ({package_version()}) "
            f"does not have: {err}"
        ) from err


def is_checkpoint(path: str | os.PathLike) -> bool:
    """True for an RLlib Algorithm checkpoint folder (it holds rllib_checkpoint.json and the policy)."""
    p = Path(path)
    return (p / "rllib_checkpoint.json").is_file() and (p / MODULE_PATH).is_dir()


def module_dir(checkpoint: str | os.PathLike) -> Path:
    """The policy folder of an Algorithm checkpoint, or ``checkpoint`` itself when it is a module folder."""
    path = Path(checkpoint)
    if is_checkpoint(path):
        return path / MODULE_PATH
    if (path / "module_state.pkl").is_file() and (path / "class_and_ctor_args.pkl").is_file():
        return path
    raise FileNotFoundError(
        f"{path}: not an RLlib Algorithm checkpoint nor an RLModule folder (no rllib_checkpoint.json, no "
        f"{MODULE_PATH}/module_state.pkl)"
    )


def config_from_checkpoint(checkpoint: str | os.PathLike) -> Any:
    """The GAGPOConfig an Algorithm checkpoint was trained with (unfrozen, its init callbacks dropped)."""
    from gagpo_rllib.rllib.config import GAGPOConfig

    path = Path(checkpoint)
    if not is_checkpoint(path):
        raise FileNotFoundError(
            f"not an RLlib Algorithm checkpoint (no rllib_checkpoint.json or policy): {path}"
        )
    state = load_pickle(path / "class_and_ctor_args.pkl")["ctor_args_and_kwargs"][0][0]
    config = AlgorithmConfig.from_state(state)
    if not isinstance(config, GAGPOConfig):
        raise ValueError(f"{path} is a {type(config).__name__} checkpoint, not a GAGPO one")
    config = config.copy(copy_frozen=False)
    # A run started with --restore carries a callback that loads that older checkpoint: not wanted here.
    config.callbacks_on_algorithm_init = None
    return config
