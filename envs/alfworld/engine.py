"""ALFWorld's text engine (TextWorld's PDDL environment + ALFWorld's demangler and infos) with fast resets.

The stock engine re-translates the PDDL problem (PDDL to SAS, twice) on every load and again on every reset, parses
the game logic on every load, and re-parses every grammar template and query with TatSu on every step. Those are
pure functions of their input strings, so :func:`memoised_engine` swaps them, only while the engine runs, for
cached versions: ``GameLogic`` per (domain, grammar), the SAS translation and initial facts per (domain, problem),
the parsed grammar symbols and conjunctive queries per string. The grammar's context copy also shares the (never
mutated) entity infos and variables instead of deep-copying them for every symbol. The code that plays a game
(applicable actions, effects, goal test, observation texts) is TextWorld's own, so texts and admissible commands
are those of the stock engine (a test compares both on walkthroughs with detours).

Not supported: the planner (``policy_commands``); the optimised SAS it needs is translated lazily on the first
replan, so an expert still works, only without the speed-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import Any

import fast_downward
import textworld
import textworld.logic
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from textworld.envs.pddl import PddlEnv, textgen
from textworld.envs.pddl import logic as pddl_logic
from textworld.logic import Proposition, Variable

__all__ = ["AlfredEngine", "memoised_engine"]


class _LRU:
    """A small least-recently-used map (one per kind of cached value, shared by all engines of a process)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]
        value = make()
        self._data[key] = value
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return value


def _digest(*texts: str) -> str:
    h = hashlib.sha1()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


_LOGIC = _LRU(64)
_TRANSLATIONS = _LRU(1024)
_SYMBOLS = _LRU(4096)
_QUERIES = _LRU(4096)
_STOCK = {
    "GameLogic": pddl_logic.GameLogic,
    "PddlState": pddl_logic.PddlState,
    "parse_and_convert": textgen._parse_and_convert,
    "parse_conjunctive_query": textworld.logic.Rule.parse_conjunctive_query,
    "copy_context": textgen.copy_context,
}
_PATCH_LOCK = threading.RLock()


def _pddl2sas(domain: str, problem: str, optimize: bool) -> tuple[Any, str]:
    argv = list(sys.argv)  # fast_downward's translator overwrites sys.argv
    try:
        return fast_downward.pddl2sas(domain, problem, optimize=optimize)
    finally:
        sys.argv[:] = argv


class _Translation:
    """The SAS translation of one problem and its initial facts, reused by every reset of that game."""

    def __init__(self, domain: str, problem: str):
        self.domain = domain
        self.problem = problem
        self.task, self.sas = _pddl2sas(domain, problem, optimize=False)
        self.sas_bytes = self.sas.encode("utf-8")
        self.sas_replan: str | None = None
        self.initial_facts: list | None = None

    def replan_sas(self) -> bytes:
        if self.sas_replan is None:
            _, self.sas_replan = _pddl2sas(self.domain, self.problem, optimize=True)
        return self.sas_replan.encode("utf-8")


def _proposition(name: str, args: list[str], name2type: dict[str, str]) -> Proposition:
    return Proposition(name, [Variable(a, name2type[a]) for a in args])


def _initial_facts(task: Any, downward_lib: Any, name2type: dict[str, str]) -> list[Proposition]:
    """The problem's init facts (static ones included) and the SAS state's true atoms, as TextWorld reads them."""
    conditions = fast_downward.translate.pddl.conditions
    f_expression = fast_downward.translate.pddl.f_expression
    facts = []
    for atom in task.init:
        if isinstance(atom, conditions.Atom) and atom.predicate != "=":
            facts.append(_proposition(atom.predicate, atom.args, name2type))
        elif isinstance(atom, f_expression.Assign):
            value = str(atom.expression.value)
            if atom.fluent.symbol != "total-cost" and not value.isdigit():
                facts.append(_proposition(value, atom.fluent.args, name2type))
    atoms = (pddl_logic.Atom * downward_lib.get_state_size())()
    downward_lib.get_state(atoms)
    facts += [fact for fact in (a.get_fact(name2type) for a in atoms) if not fact.is_negation]
    return facts


class _CachedPddlState(pddl_logic.PddlState):
    """TextWorld's PddlState built from a cached translation instead of translating the problem again."""

    def __init__(self, downward_lib: Any, pddl_problem: str, logic: Any):
        translation = _TRANSLATIONS.get(
            _digest(logic.domain, pddl_problem), lambda: _Translation(logic.domain, pddl_problem)
        )
        # textworld.logic.State's fields (its constructor insists on the non-PDDL GameLogic class).
        self._logic = logic
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._translation = translation
        self._replan_loaded = False
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self.task, self.sas, self.sas_replan = translation.task, translation.sas, translation.sas_replan
        self._actions = {a.name: a for a in self.task.actions}
        self.name2type = {o.name: o.type_name for o in self.task.objects}
        for type_ in self.task.types:
            with contextlib.suppress(ValueError):  # already known to this logic
                logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
        downward_lib.load_sas(translation.sas_bytes)
        if translation.initial_facts is None:
            translation.initial_facts = _initial_facts(self.task, downward_lib, self.name2type)
        self.add_facts(translation.initial_facts)

    def replan(self, infos: Any) -> list:
        if not self._replan_loaded:
            self.downward_lib.load_sas_replan(self._translation.replan_sas())
            self._replan_loaded = True
        return super().replan(infos)


def _cached_game_logic(domain: str, grammar: str) -> Any:
    return _LOGIC.get(_digest(domain, grammar), lambda: _STOCK["GameLogic"](domain=domain, grammar=grammar))


def _cached_parse_and_convert(text: str, *args: Any, **kwargs: Any) -> Any:
    if args or set(kwargs) - {"rule_name", "trace"} or kwargs.get("trace"):
        return _STOCK["parse_and_convert"](text, *args, **kwargs)
    rule = kwargs.get("rule_name")
    parsed = _SYMBOLS.get((text, rule), lambda: _STOCK["parse_and_convert"](text, rule_name=rule))
    return deepcopy(parsed)  # callers set attributes on the parsed symbols


def _shallow_copy_context(context: dict) -> dict:
    """TextWorld's copy_context without deep-copying the entity infos and variables (nothing mutates them)."""
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


def _cached_conjunctive_query(expr: str) -> Any:
    return _QUERIES.get(expr, lambda: _STOCK["parse_conjunctive_query"](expr))


@contextlib.contextmanager
def memoised_engine() -> Iterator[None]:
    """Within this block TextWorld's PDDL engine uses the caches above (restored on exit, also on error)."""
    with _PATCH_LOCK:
        saved = (
            pddl_logic.GameLogic,
            pddl_logic.PddlState,
            textgen._parse_and_convert,
            textworld.logic.Rule.__dict__["parse_conjunctive_query"],
            textgen.copy_context,
        )
        pddl_logic.GameLogic = _cached_game_logic
        pddl_logic.PddlState = _CachedPddlState
        textgen._parse_and_convert = _cached_parse_and_convert
        textworld.logic.Rule.parse_conjunctive_query = staticmethod(_cached_conjunctive_query)
        textgen.copy_context = _shallow_copy_context
        try:
            yield
        finally:
            pddl_logic.GameLogic, pddl_logic.PddlState, textgen._parse_and_convert = saved[:3]
            textworld.logic.Rule.parse_conjunctive_query = saved[3]
            textgen.copy_context = saved[4]


class AlfredEngine:
    """One game at a time on TextWorld's PddlEnv wrapped by ALFWorld's AlfredDemangler and AlfredInfos."""

    def __init__(self, *, facts: bool = False) -> None:
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts, extras=["gamefile"])
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self._loaded_key: str | None = None

    def load(self, game_data: dict, game_file: str) -> None:
        """Load a game (a no-op when it is already loaded: resets restart it from its initial state)."""
        key = _digest(game_file, game_data["pddl_problem"], game_data["grammar"])
        if key == self._loaded_key:
            return
        self._loaded_key = None
        with memoised_engine():
            self._env.load(game_data)
        # AlfredInfos reports the path it was given; ours loads from data, so name the file.
        self._env._gamefile = game_file
        self._loaded_key = key

    def reset(self) -> textworld.GameState:
        with memoised_engine():
            return self._env.reset()

    def step(self, command: str) -> textworld.GameState:
        with memoised_engine():
            state, _, _ = self._env.step(command)
        return state
