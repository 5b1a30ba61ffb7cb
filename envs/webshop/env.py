"""WebShop as a gymnasium text environment: find and buy the product an instruction describes.

Config keys (all optional): split ('train' | 'eval', and 'test' under the 'webshop' scheme), split_scheme
('webshop': the original baselines' test [:500], eval [500:1500], train [1500:]; 'gigpo': the GiGPO reference's
eval [:500], train [500:]; below 3,000 goals the cut points scale, see goals.py), seed (draws the task when reset
gets no task_id), max_steps (15), data_dir (the original data files; None: the bundled generated catalogue),
file_set ('small': the *_1000 files, or 'full'), num_products (load at most this many product records),
human_goals (False: synthetic goals, as verl-agent trains), goal_seed (233: prices, ceilings and goal order),
reward_mode ('won': success_reward when the purchase scores 1.0, else 0; 'score': the 0-1 purchase score),
success_reward (10.0), noun_extractor ('auto' | 'spacy' | 'fallback'), strip_instruction (False: pages show the instruction as the
original does; True: the observation starts after it, as verl-agent's prompts show pages, since the prompt
carries the task already), state_key ('page': info["state_key"] is the full page text, as the GiGPO reference
groups states, so pages that differ only in selected options are one state; 'page_and_options': the page text
plus the options selected on an item page, which are invisible in the text but change what 'buy now' earns),
search_grammar ('placeholder': a search bar is offered as the one admissible string 'search[<your query>]', for
policies that write their own query; 'goal_prefix': as the concrete commands search[w1], search[w1 w2], ... over
the goal's query words, for constrained decoding, see search_grammar.py; info["search_words"] holds the words),
max_search_words (10: the longest query the 'goal_prefix' grammar offers).

info["provenance"] names the data (bundled or the user's files), the noun extractor and the split with its goal
range; ``WebShopEnv.describe_config`` gives the same without building the shop (for progress lines).
"""

from __future__ import annotations

import logging
import operator
import random
from typing import Any

import gymnasium as gym

from envs.protocol import EvalTable
from envs.spaces import TextSpace
from envs.webshop.browser import transition
from envs.webshop.goals import FULL_SIZE_GOALS, SPLIT_SCHEMES, SPLITS
from envs.webshop.nouns import make_noun_extractor
from envs.webshop.pages import Page, RenderedPage, render
from envs.webshop.search_grammar import GRAMMARS, goal_search_commands, goal_search_words
from envs.webshop.shop import WebShop, get_shop

__all__ = ["DEFAULT_CONFIG", "STATE_KEYS", "WebShopEnv"]

logger = logging.getLogger(__name__)

DEFAULT_CONFIG: dict[str, Any] = {
    "split": "train",
    "split_scheme": "webshop",
    "seed": 0,
    "max_steps": 15,
    "data_dir": None,
    "file_set": "small",
    "num_products": None,
    "human_goals": False,
    "goal_seed": 233,
    "reward_mode": "won",
    "success_reward": 10.0,
    "noun_extractor": "auto",
    "strip_instruction": False,
    "state_key": "page",
    "search_grammar": "placeholder",
    "max_search_words": 10,
}
STATE_KEYS = ("page", "page_and_options")
_WIN_TOLERANCE = 1e-9
_warned_scaled: set[tuple[str, str]] = set()


def _check_config(config: dict[str, Any] | None) -> dict[str, Any]:
    config = dict(config or {})
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"WebShopEnv: unknown config key(s) {unknown}; known: {sorted(DEFAULT_CONFIG)}")
    merged = {**DEFAULT_CONFIG, **config}
    if not isinstance(merged["max_steps"], int) or merged["max_steps"] < 1:
        raise ValueError(f"WebShopEnv: max_steps must be a positive int, got {merged['max_steps']!r}")
    if merged["split_scheme"] not in SPLIT_SCHEMES:
        raise ValueError(
            f"WebShopEnv: split_scheme must be one of {sorted(SPLIT_SCHEMES)}, got {merged['split_scheme']!r}"
        )
    if merged["state_key"] not in STATE_KEYS:
        raise ValueError(f"WebShopEnv: state_key must be one of {STATE_KEYS}, got {merged['state_key']!r}")
    if merged["search_grammar"] not in GRAMMARS:
        raise ValueError(
            f"WebShopEnv: search_grammar must be one of {GRAMMARS}, got {merged['search_grammar']!r}"
        )
    if not isinstance(merged["max_search_words"], int) or merged["max_search_words"] < 1:
        raise ValueError(
            f"WebShopEnv: max_search_words must be a positive int, got {merged['max_search_words']!r}"
        )
    if merged["reward_mode"] not in ("won", "score"):
        raise ValueError(f"WebShopEnv: reward_mode must be 'won' or 'score', got {merged['reward_mode']!r}")
    if merged["num_products"] is not None and (
        not isinstance(merged["num_products"], int) or merged["num_products"] < 1
    ):
        raise ValueError(
            f"WebShopEnv: num_products must be a positive int or None, got {merged['num_products']!r}"
        )
    return merged


def _describe(config: dict[str, Any], noun_extractor: str, shop: WebShop | None = None) -> str:
    data = (
        "bundled"
        if config["data_dir"] is None
        else f"files in {config['data_dir']} ({config['file_set']} set)"
    )
    goals = "human" if config["human_goals"] else "synthetic"
    split = f"{config['split']} ({config['split_scheme']} scheme)"
    if shop is None:
        data += f", {goals} goals"
    else:
        num_goals = len(shop.goals)
        data += f" ({len(shop.catalogue)} products, {num_goals} {goals} goals)"
        start, end = shop.splits(config["split_scheme"])[config["split"]]
        split += f" = goals [{start}:{end}]"
        if num_goals < FULL_SIZE_GOALS:
            split += f", cut points scaled: fewer than {FULL_SIZE_GOALS:,} goals"
    return f"data: {data} | nouns: {noun_extractor} | split: {split}"


class WebShopEnv(gym.Env):
    """One shopper in the shared shop; each reset plays one goal of the configured split."""

    metadata = {"render_modes": []}
    # Env protocol (envs/protocol.py): the papers' row is the score (mean final task_score x 100) and success.
    # "test" exists only under the "webshop" split scheme.
    splits = SPLITS
    eval_split = "eval"
    eval_table = EvalTable(name="webshop", score=True)

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = _check_config(config)
        c = self.config
        self.shop = get_shop(
            None if c["data_dir"] is None else str(c["data_dir"]),
            c["file_set"],
            c["num_products"],
            bool(c["human_goals"]),
            int(c["goal_seed"]),
            c["noun_extractor"],
        )
        try:
            self._goal_indices = self.shop.split_goal_indices(c["split"], c["split_scheme"])
        except ValueError as error:
            raise ValueError(f"WebShopEnv: {error}") from error
        if len(self._goal_indices) == 0:
            raise ValueError(f"WebShopEnv: split {c['split']!r} has no goals in {self.shop.catalogue.source}")
        self.provenance = _describe(c, self.shop.noun_extractor_name, self.shop)
        scaled = (self.shop.catalogue.source, c["split_scheme"])
        if len(self.shop.goals) < FULL_SIZE_GOALS and scaled not in _warned_scaled:
            _warned_scaled.add(scaled)
            logger.warning(
                "WebShop: %s has %d goals (< %d): the %s split cut points are scaled, so scores are not "
                "comparable with the papers'",
                self.shop.catalogue.source,
                len(self.shop.goals),
                FULL_SIZE_GOALS,
                c["split_scheme"],
            )
        self._weights = [self.shop.goals[i]["weight"] for i in self._goal_indices]
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._rng = random.Random(c["seed"])
        # Actions that did nothing, over the env's lifetime (info carries the count of the current episode).
        self.invalid_action_count = 0
        self._goal: dict[str, Any] | None = None

    @staticmethod
    def describe_config(config: dict[str, Any] | None = None) -> str:
        """Data, noun extractor and split of an env_config, without building the shop."""
        c = _check_config(config)
        return _describe(c, make_noun_extractor(c["noun_extractor"])[1])

    @property
    def num_tasks(self) -> int:
        return len(self._goal_indices)

    @property
    def goal_indices(self) -> range:
        """Positions in the shop's shuffled goal list of this split's tasks (task_id i is goal_indices[i])."""
        return self._goal_indices

    def goal(self, task_id: int) -> dict[str, Any]:
        """The goal dict (original field names) of task ``task_id`` in this split."""
        if not isinstance(task_id, int) or not 0 <= task_id < self.num_tasks:
            raise ValueError(f"WebShopEnv: task_id must be an int in [0, {self.num_tasks}), got {task_id!r}")
        return self.shop.goals[self._goal_indices[task_id]]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._rng = random.Random(seed)
        task_id = (options or {}).get("task_id")
        if task_id is None:
            task_id = self._rng.choices(range(self.num_tasks), weights=self._weights)[0]
        try:
            task_id = operator.index(task_id)
        except TypeError as error:
            raise ValueError(f"WebShopEnv: task_id must be an integer, got {task_id!r}") from error
        self._goal = self.goal(task_id)
        self._task_id = task_id
        self._page = Page()
        self._rendered = self._render()
        self._steps = 0
        self._episode_invalid = 0
        self._finished = False
        self._score = 0.0
        self._breakdown: dict[str, Any] | None = None
        return self._observation(), self._info(invalid=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._goal is None or self._finished:
            raise RuntimeError("WebShopEnv: call reset() before step() (the episode has ended)")
        move = transition(self._page, self._rendered, action)
        self._steps += 1
        if not move.valid:
            self.invalid_action_count += 1
            self._episode_invalid += 1
        reward, terminated = 0.0, False
        if move.purchase:
            options = dict(move.page.options)
            self._score, breakdown = self.shop.score(move.page.asin, self._goal, options)
            self._breakdown = {**breakdown, "purchased_asin": move.page.asin, "purchased_options": options}
            terminated = True
            won = self._won()
            reward = (
                float(self.config["success_reward"]) * won
                if self.config["reward_mode"] == "won"
                else float(self._score)
            )
        self._page = move.page
        self._rendered = self._render()
        truncated = not terminated and self._steps >= self.config["max_steps"]
        self._finished = terminated or truncated
        return self._observation(), reward, terminated, truncated, self._info(invalid=not move.valid)

    def _won(self) -> bool:
        return self._score >= 1.0 - _WIN_TOLERANCE

    def _render(self) -> RenderedPage:
        purchase = {"score": self._score} if self._page.kind == "done" else None
        return render(self._page, self.shop, self._goal["instruction_text"], purchase)

    def _observation(self) -> str:
        text = self._rendered.observation
        if self.config["strip_instruction"]:
            _, found, rest = text.partition(f"Instruction: [SEP] {self._goal['instruction_text']} [SEP] ")
            if found:
                return rest
        return text

    def _state_key(self) -> str:
        if self.config["state_key"] != "page_and_options":
            return self._rendered.observation
        # Chosen options are invisible in the text but change what 'buy now' earns.
        if self._page.options and self._page.kind in ("item", "item_sub"):
            chosen = "; ".join(f"{k}: {v}" for k, v in self._page.options)
            return f"{self._rendered.observation} [SEP] selected: {chosen}"
        return self._rendered.observation

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        rendered = self._rendered
        words = goal_search_words(self._goal["instruction_text"], self.config["max_search_words"])
        if not rendered.has_search_bar:
            admissible = []
        elif self.config["search_grammar"] == "goal_prefix" and words:
            admissible = goal_search_commands(words)
        else:
            admissible = ["search[<your query>]"]
        admissible += [f"click[{c}]" for c in rendered.clickables if c != "search"]
        info = {
            "task": self._goal["instruction_text"],
            "task_id": self._task_id,
            "task_type": self._goal["category"],
            "admissible_actions": admissible,
            "search_words": words,
            "available_actions": {
                "has_search_bar": rendered.has_search_bar,
                "clickables": list(rendered.clickables),
            },
            "state_key": self._state_key(),
            "won": self._won(),
            "task_score": float(self._score),
            "page": self._page.kind,
            "invalid_action": invalid,
            "invalid_action_count": self._episode_invalid,
            "goal_asin": self._goal["asin"],
            "noun_extractor": self.shop.noun_extractor_name,
            "provenance": self.provenance,
        }
        if self._breakdown is not None:
            info["reward_breakdown"] = dict(self._breakdown)
        return info
