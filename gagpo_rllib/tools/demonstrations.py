"""Demonstrations for a warm start: expert episodes replayed through the real environments, step by step.

Each step keeps what the policy sees during training (task, observation, admissible actions, the (observation,
action) history) and the expert's action, so ``gagpo_rllib.tools.sft`` can build exactly the training prompts and the
constrained softmax. Sources:

- ALFWorld: the ``walkthrough`` stored in every game file (bundled or downloaded), replayed through
  ``AlfworldEnv``; a walkthrough that leaves the admissible commands or does not win is counted and logged.
- WebShop: a scripted purchase of each goal's target product: search the goal's query, click the product (paging
  through results), choose the goal's options, buy. The env offers ``search[<your query>]`` as a template; in the
  recorded admissible list that entry is replaced by the search actually typed, so every demonstrated action is
  one of its step's admissible actions, while the prompt shows the list as the env listed it (``shown``): a policy
  that learns to copy its target from the prompt would otherwise learn to send the placeholder.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.protocol import TASK_ID, outcome
from gagpo_rllib.method.seeds import DEMONSTRATION_TASKS_SALT, EXPERT_FALLBACK_SALT, derive_seed, salted_rng

__all__ = [
    "DemoSet",
    "DemoStep",
    "Demonstration",
    "alfworld_demonstrations",
    "demonstration_texts",
    "demonstrations_for",
    "reasoning_line",
    "webshop_demonstrations",
]

logger = logging.getLogger(__name__)

SEARCH_TEMPLATE = "search[<your query>]"
# Info key under which a wrapped env keeps the admissible list as the env listed it (see _TypedSearch).
_SHOWN_ACTIONS = "demonstration_shown_actions"
_MAX_RESULT_PAGES = 5


@dataclass(frozen=True)
class DemoStep:
    """One expert step: the policy's inputs at ``step`` and the action the expert sent.

    ``admissible``: what the expert could send (the constrained set); ``shown``: the list the env put in the
    prompt, when it differs (None: ``admissible``).
    """

    task: str
    observation: str
    admissible: tuple[str, ...]
    history: tuple[tuple[str, str], ...]
    step: int
    action: str
    shown: tuple[str, ...] | None = None

    @property
    def prompt_actions(self) -> tuple[str, ...]:
        """The admissible actions as the prompt lists them."""
        return self.admissible if self.shown is None else self.shown


@dataclass(frozen=True)
class Demonstration:
    """One expert episode replayed through the env; ``won`` is the env's verdict after the last step."""

    source: str
    task_id: int
    task_type: str
    steps: tuple[DemoStep, ...]
    won: bool
    final_observation: str = ""


@dataclass
class DemoSet:
    """Winning demonstrations and, counted by reason, the episodes left out."""

    demonstrations: list[Demonstration]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return sum(len(d.steps) for d in self.demonstrations)


def _replay(env: Any, task_id: int, actions: Sequence[str], *, reset_options: dict) -> Demonstration:
    """Play ``actions`` from a reset, recording each step's inputs, until the episode ends or they run out."""
    obs, info = env.reset(seed=0, options=reset_options)
    steps: list[DemoStep] = []
    history: list[tuple[str, str]] = []
    won = False
    for action in actions:
        admissible = tuple(str(a) for a in info["admissible_actions"])
        shown = info.get(_SHOWN_ACTIONS)
        if action not in admissible:
            raise _NotAdmissible(action, len(steps))
        steps.append(
            DemoStep(
                str(info["task"]),
                str(obs),
                admissible,
                tuple(history),
                len(steps),
                action,
                None if shown is None or tuple(shown) == admissible else tuple(str(a) for a in shown),
            )
        )
        history.append((str(obs), action))
        obs, _, terminated, truncated, info = env.step(action)
        won = outcome(info).won
        if terminated or truncated:
            break
    return Demonstration(
        source=str(info.get("game_file", info.get("goal_asin", task_id))),
        task_id=task_id,
        task_type=outcome(info).task_type,
        steps=tuple(steps),
        won=won,
        final_observation=str(obs),
    )


class _NotAdmissible(Exception):
    def __init__(self, action: str, step: int):
        super().__init__(f"step {step}: {action!r} is not admissible")
        self.action, self.step = action, step


def _task_ids(total: int, task_ids: Sequence[int] | None, num_tasks: int | None, seed: int) -> list[int]:
    """The tasks to replay: ``task_ids``, else ``num_tasks`` drawn without replacement from ``seed``, else all."""
    if task_ids is not None and num_tasks is not None:
        raise ValueError("give either task_ids or num_tasks, not both")
    if task_ids is not None:
        bad = [t for t in task_ids if not 0 <= int(t) < total]
        if bad:
            raise ValueError(f"task_ids: {bad[:5]} out of range [0, {total})")
        return [int(t) for t in task_ids]
    if num_tasks is None or num_tasks >= total:
        return list(range(total))
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    rng = salted_rng(seed, DEMONSTRATION_TASKS_SALT)
    return sorted(int(t) for t in rng.choice(total, size=num_tasks, replace=False))


def _finish(demos: list[Demonstration], skipped: Counter, what: str) -> DemoSet:
    if skipped:
        logger.warning("%s: kept %d demonstrations, skipped %s", what, len(demos), dict(skipped))
    return DemoSet(demos, dict(skipped))


ALFWORLD_EXPERTS = ("walkthrough", "handcoded", "sweep")


def alfworld_demonstrations(
    env_config: dict | None = None,
    task_ids: Sequence[int] | None = None,
    *,
    num_tasks: int | None = None,
    seed: int = 0,
    max_steps: int = 50,
    expert: str = "walkthrough",
) -> DemoSet:
    """Replay each game's expert episode (``task_ids`` of the split, or ``num_tasks`` drawn from ``seed``, default
    all) through ``AlfworldEnv``.

    ``expert``: "walkthrough", the planner's solution stored in the game (it goes straight to where the object
    is, which the agent cannot see), or "handcoded", ALFWorld's hand-coded expert (``alfworld.agents.expert``): it
    searches the receptacles that can hold the object, opening closed ones, from what it has seen, the behaviour
    an agent that does not know the hidden state needs (its rare random fallback draws from ``seed``), or "sweep",
    the same expert visiting the receptacles in the order the admissible list shows them: where it goes next then
    follows from where it is and the list in the prompt, a rule a policy that sees one step of history can learn
    (the hand-coded expert's own order, the room description's, is not in later prompts).
    ``env_config`` is the env's own (split, data_dir, task_types, ...). A game without a walkthrough, a command
    that is not admissible, or a replay that does not win within ``max_steps`` is counted under ``skipped`` and
    logged.
    """
    from envs.alfworld import AlfworldEnv
    from envs.alfworld.games import read_game

    if expert not in ALFWORLD_EXPERTS:
        raise ValueError(f"expert must be one of {ALFWORLD_EXPERTS}, got {expert!r}")
    env = AlfworldEnv({**dict(env_config or {}), "max_steps": max_steps})
    demos: list[Demonstration] = []
    skipped: Counter[str] = Counter()
    for task_id in _task_ids(env.num_tasks, task_ids, num_tasks, seed):
        game_file = env.games[int(task_id)].game_file
        if expert in ("handcoded", "sweep"):
            walkthrough = _handcoded_actions(
                env_config, int(task_id), seed=seed, max_steps=max_steps, list_order=expert == "sweep"
            )
        else:
            walkthrough = read_game(game_file).get("walkthrough")
        if not walkthrough:
            skipped["no walkthrough"] += 1
            logger.warning("alfworld_demonstrations: %s has no %s episode", game_file, expert)
            continue
        try:
            demo = _replay(env, int(task_id), [str(a) for a in walkthrough], reset_options={TASK_ID: task_id})
        except _NotAdmissible as err:
            skipped["walkthrough command not admissible"] += 1
            logger.warning("alfworld_demonstrations: %s: %s", game_file, err)
            continue
        if not demo.won:
            skipped["walkthrough does not win"] += 1
            logger.warning("alfworld_demonstrations: %s: walkthrough replay did not win", game_file)
            continue
        demos.append(demo)
    return _finish(demos, skipped, "alfworld_demonstrations")


def _handcoded_actions(
    env_config: dict | None, task_id: int, *, seed: int, max_steps: int, list_order: bool = False
) -> list[str]:
    """The commands ALFWorld's hand-coded expert sends in game ``task_id`` until it wins or ``max_steps`` run out
    (played on an env that reports the PDDL facts the expert reads); ``list_order``: it searches the receptacles
    in the order of the first step's admissible ``go to`` commands."""
    import random

    from alfworld.agents.expert.handcoded_expert import HandCodedAgentFailed, HandCodedAgentTimeout
    from alfworld.agents.expert.handcoded_expert_tw import HandCodedTWAgent

    from envs.alfworld import AlfworldEnv

    env = _expert_env(AlfworldEnv, json.dumps(dict(env_config or {}), sort_keys=True), max_steps)
    obs, info = env.reset(seed=0, options={TASK_ID: task_id})
    agent = HandCodedTWAgent(max_steps=max_steps)
    agent.reset(game=info["game_file"])
    if list_order:
        _search_in_list_order(agent.policy, info["admissible_commands"])
    agent.observe(obs)
    # The expert falls back to random.choice when it would repeat itself: give it its own seeded draws.
    saved = random.getstate()
    random.seed(derive_seed(seed, EXPERT_FALLBACK_SALT, task_id))
    actions: list[str] = []
    try:
        for _ in range(max_steps):
            state = {
                "feedback": obs,
                "facts": info["facts"],
                "admissible_commands": info["admissible_commands"],
            }
            try:
                action = agent.act(state, 0.0, False, actions[-1] if actions else "")
            except (HandCodedAgentFailed, HandCodedAgentTimeout):  # it gave up: the replay does not win
                break
            actions.append(str(action))
            obs, _, terminated, truncated, info = env.step(actions[-1])
            agent.observe(obs)
            if terminated or truncated:
                break
    finally:
        random.setstate(saved)
    return actions


def _search_in_list_order(policy: Any, admissible: Sequence[str]) -> None:
    """Make the hand-coded policy visit receptacles in the order of the ``go to`` commands in ``admissible``.

    The policy reads its receptacles from the room description each time it observes it, and searches the list
    it derives from them from the end: keeping them in reverse list order makes it search in list order.
    """
    rank = {c[len("go to ") :]: i for i, c in enumerate(admissible) if c.startswith("go to ")}
    observe = policy.observe

    def observe_in_list_order(obs: str) -> None:
        observe(obs)
        ordered = sorted(policy.receptacles.items(), key=lambda kv: rank.get(kv[0].strip(), len(rank)))
        policy.receptacles = dict(reversed(ordered))

    policy.observe = observe_in_list_order


@functools.lru_cache(maxsize=4)
def _expert_env(env_class: type, env_config: str, max_steps: int) -> Any:
    """One facts-reporting env per config, reused across games (each holds its own engine)."""
    return env_class({**json.loads(env_config), "max_steps": max_steps, "facts": True})


def _webshop_script(env: Any, task_id: int, goal: dict) -> list[str] | None:
    """The purchase script of ``goal`` on a fresh episode (played through ``env``), or None if it cannot buy."""
    _, info = env.reset(seed=0, options={TASK_ID: task_id})
    searches = [a for a in info["admissible_actions"] if a.startswith("search[") and a != SEARCH_TEMPLATE]
    # Under the env's "goal_prefix" search grammar the longest offered search is the one admissible full query.
    actions = [searches[-1] if searches else f"search[{goal['query']}]"]
    _, _, _, _, info = env.step(actions[0])
    target = f"click[{str(goal['asin']).lower()}]"
    for _ in range(_MAX_RESULT_PAGES):
        if target in info["admissible_actions"] or "click[next >]" not in info["admissible_actions"]:
            break
        actions.append("click[next >]")
        _, _, _, _, info = env.step("click[next >]")
    if target not in info["admissible_actions"]:
        return None
    actions.append(target)
    _, _, _, _, info = env.step(target)
    for value in goal.get("goal_options", {}).values():
        click = f"click[{str(value).lower()}]"
        if click not in info["admissible_actions"]:
            return None
        actions.append(click)
        _, _, _, _, info = env.step(click)
    actions.append("click[buy now]")
    return actions


class _TypedSearch:
    """Wraps a WebShopEnv so the recorded admissible list holds the typed search instead of the template (the
    env's own list is kept for the prompt)."""

    def __init__(self, env: Any, query: str):
        self.env, self.search = env, query

    def _fix(self, info: dict) -> dict:
        actions = [self.search if a == SEARCH_TEMPLATE else a for a in info["admissible_actions"]]
        return {**info, "admissible_actions": actions, _SHOWN_ACTIONS: list(info["admissible_actions"])}

    def reset(self, **kwargs: Any) -> tuple[str, dict]:
        obs, info = self.env.reset(**kwargs)
        return obs, self._fix(info)

    def step(self, action: str) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._fix(info)


def webshop_demonstrations(
    env_config: dict | None = None,
    task_ids: Sequence[int] | None = None,
    *,
    num_tasks: int | None = None,
    seed: int = 0,
) -> DemoSet:
    """Scripted purchases of each goal's target product (``task_ids`` of the split, or ``num_tasks`` drawn from
    ``seed``, default all).

    A goal whose product is not in the first result pages, whose option is not offered, or whose purchase does
    not win is counted under ``skipped`` and logged.
    """
    from envs.webshop import WebShopEnv

    env = WebShopEnv(dict(env_config or {}))
    demos: list[Demonstration] = []
    skipped: Counter[str] = Counter()
    for task_id in _task_ids(env.num_tasks, task_ids, num_tasks, seed):
        goal = env.goal(int(task_id))
        script = _webshop_script(env, int(task_id), goal)
        if script is None:
            skipped["target product or option not reachable"] += 1
            logger.warning(
                "webshop_demonstrations: goal %d (%s) cannot be bought by script", task_id, goal["asin"]
            )
            continue
        demo = _replay(
            _TypedSearch(env, script[0]), int(task_id), script, reset_options={TASK_ID: int(task_id)}
        )
        if not demo.won:
            skipped["purchase does not win"] += 1
            logger.warning(
                "webshop_demonstrations: goal %d (%s): purchase did not win", task_id, goal["asin"]
            )
            continue
        demos.append(demo)
    return _finish(demos, skipped, "webshop_demonstrations")


def demonstrations_for(env: type | str, env_config: dict | None = None, **kwargs: Any) -> DemoSet:
    """The built-in demonstrations of an env class (or its name): ALFWorld walkthroughs, WebShop purchases."""
    name = env if isinstance(env, str) else env.__name__
    builders = {"AlfworldEnv": alfworld_demonstrations, "WebShopEnv": webshop_demonstrations}
    if name not in builders:
        raise ValueError(f"env {name!r}: no built-in demonstrations (available for {sorted(builders)})")
    return builders[name](env_config, **kwargs)


def _alfworld_reason(action: str) -> str | None:
    verb, _, rest = action.partition(" ")
    if verb == "go" and rest.startswith("to "):
        return f"I need to check {rest[3:]} next."
    if verb == "take" and " from " in rest:
        obj, _, recep = rest.partition(" from ")
        return f"I see {obj} in {recep}, so I take it."
    if verb == "move" and " to " in rest:
        obj, _, recep = rest.partition(" to ")
        return f"I have {obj}; the task wants it in {recep}."
    if verb in ("heat", "cool", "clean") and " with " in rest:
        obj, _, tool = rest.partition(" with ")
        return f"The task needs {obj} {'heated' if verb == 'heat' else verb + 'ed'}; {tool} does that."
    if verb == "open":
        return f"{rest} is closed; I open it to look inside."
    if verb == "use":
        return f"I turn on {rest} to look at the object."
    return None


def _webshop_reason(action: str) -> str | None:
    if action.startswith("search[") and action.endswith("]"):
        return "I search for the product the task describes."
    if action == "click[buy now]":
        return "This product and its options match the task, so I buy it."
    if action in ("click[next >]", "click[< prev]"):
        return "The product I want is not on this page; I look at the next one."
    if action.startswith("click[") and action.endswith("]"):
        target = action[6:-1]
        if len(target) == 10 and target.isalnum() and any(c.isdigit() for c in target):
            return "This result matches the task; I open it."
        return f"The task asks for {target}, so I choose that option."
    return None


def reasoning_line(step: DemoStep) -> str:
    """A short, deterministic reason for a demonstrated action, the ``<think>`` text of a free-form target.

    A warm start on it teaches the answer format a real chat model must use (a reason, then the action); the
    reason names what the action is for, never facts the prompt does not show.
    """
    action = step.action.strip()
    reason = _alfworld_reason(action) or _webshop_reason(action)
    return reason or f"The next step toward the task is: {action}."


def demonstration_texts(demos: Iterable[Demonstration]) -> list[str]:
    """Every task, observation and admissible action the demonstrations show, in order (a tokenizer corpus)."""
    texts: list[str] = []
    for demo in demos:
        for step in demo.steps:
            if step.step == 0:
                texts.append(step.task)
            texts.append(step.observation)
            texts.extend(step.admissible)
        texts.append(demo.final_observation)
    return texts
