"""RLlib's internals are touched in ``gagpo_rllib/rllib/rllib_internals.py`` only.

Two checks read the package: no module but that one reads or writes an attribute whose name RLlib defines as
private (``self._x = ...`` or ``def _x`` anywhere in ``ray.rllib``) unless the module defines that name itself,
and no class of ours outside it overrides a private method of an RLlib base class, except RLModule's documented
forward hooks.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import ray.rllib

from gagpo_rllib.rllib import rllib_internals

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "gagpo_rllib"
BOUNDARY = PACKAGE / "rllib" / "rllib_internals.py"
# RLModule's API: subclasses implement these (RLModule.forward_train calls _forward_train, and so on).
DOCUMENTED_HOOKS = {"_forward", "_forward_train", "_forward_inference", "_forward_exploration"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: its ``def _x`` and its ``self._x = ...`` / ``cls._x = ...``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
            and _private(node.attr)
        ):
            names.add(node.attr)
    return names


def rllib_private_names() -> set[str]:
    rllib = Path(ray.rllib.__file__).parent
    names: set[str] = set()
    for path in rllib.rglob("*.py"):
        if {"tests", "examples"} & set(path.relative_to(rllib).parts):
            continue
        try:
            names |= defined_private_names(ast.parse(path.read_text(encoding="utf-8")))
        except SyntaxError:
            continue
    return names


def private_accesses(source: str, rllib_names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each attribute access to a name RLlib keeps private that the module does not define."""
    tree = ast.parse(source)
    own = defined_private_names(tree)
    return sorted(
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in rllib_names and node.attr not in own
    )


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != BOUNDARY)


@pytest.fixture(scope="module")
def rllib_names() -> set[str]:
    names = rllib_private_names()
    assert {"_weights_seq_no", "_learner", "_env_to_module", "_module_optimizers"} <= names
    return names


def test_no_module_but_the_boundary_reads_rllib_private_attributes(rllib_names: set[str]) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} .{name}"
        for path in _modules()
        for line, name in private_accesses(path.read_text(encoding="utf-8"), rllib_names)
    ]
    assert not found, "RLlib internals outside rllib_internals.py:\n" + "\n".join(found)


def test_the_check_sees_a_private_access(rllib_names: set[str]) -> None:
    source = "def f(group):\n    return group._learner\n\ndef g(runner):\n    runner._weights_seq_no = 0\n"
    assert private_accesses(source, rllib_names) == [(2, "_learner"), (5, "_weights_seq_no")]
    # a name the module defines itself is its own
    assert (
        private_accesses("class A:\n    def _learner(self):\n        return self._learner()\n", rllib_names)
        == []
    )
    assert private_accesses(BOUNDARY.read_text(encoding="utf-8"), rllib_names)  # the boundary does touch them


def _classes() -> list[type]:
    classes = []
    for path in _modules():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        try:
            module = importlib.import_module(name)
        except ImportError as err:  # an optional backend absent here (e.g. vLLM on a GPU-less box without it)
            if name.startswith("gagpo_rllib.policy.generation") or "vllm" in str(err):
                continue
            raise
        classes += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
    return classes


def overrides_of_rllib_private_methods(cls: type) -> list[str]:
    """``cls``'s own private methods that an RLlib base class also defines (documented hooks aside)."""
    rllib_bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("ray.rllib")]
    return sorted(
        name
        for name in vars(cls)
        if _private(name)
        and callable(vars(cls)[name])
        and name not in DOCUMENTED_HOOKS
        and any(name in vars(b) for b in rllib_bases)
    )


def test_no_class_but_the_boundarys_overrides_a_private_rllib_method() -> None:
    found = {
        f"{c.__module__}.{c.__qualname__}": o
        for c in _classes()
        if (o := overrides_of_rllib_private_methods(c))
    }
    assert not found, found
    # the boundary's learner does override them
    assert "_uncompiled_update" in overrides_of_rllib_private_methods(rllib_internals.ChunkedTorchLearner)


def test_the_rllib_version_is_checked() -> None:
    rllib_internals.check_rllib_version(ray.__version__)
    rllib_internals.check_rllib_version(rllib_internals.RLLIB_VERSION[:-1] + "9")  # a patch release is fine
    with pytest.raises(ImportError, match=r"ray\[rllib\]==2\.60\.0.*2\.61\.0"):
        rllib_internals.check_rllib_version("2.61.0")


def test_the_trained_modules_answer_the_chunked_step_protocol() -> None:
    from gagpo_rllib.policy.critic import CriticRLModule
    from gagpo_rllib.policy.rl_module import LLMRLModule

    methods = [
        m for m in vars(rllib_internals.ChunkedModule) if not m.startswith("_") and m != "pad_token_id"
    ]
    assert {"train_chunks", "forward_rounds", "set_gradient_sync", "gather_full_state"} <= set(methods)
    for cls in (LLMRLModule, CriticRLModule):
        assert all(callable(getattr(cls, m, None)) for m in methods), cls
    assert not isinstance(object(), rllib_internals.ChunkedModule)
