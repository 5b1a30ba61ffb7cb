"""The purchase score of the original WebShop (engine/goal.py get_reward), with its names and quirks.

total = r_type * (matched attributes + matched options + r_price) / (goal attributes + goal options + 1)

r_type checks the product type: 1.0 when the query is the goal's, the category paths share two parts, or more
than 0.2 of the goal name's nouns are in the bought name; 0.5 when none holds; then 0.1 when under 0.1 of the
nouns match and 0 when none does. An attribute matches when rapidfuzz's token_set_ratio with some product
attribute exceeds 85, else when it is a substring of the lower-cased title, bullet points or description. An
option matches when token_set_ratio > 85 against some chosen value after colour normalisation; a synthetic
goal's options (a dict) are compared as stringified (name, value) pairs, as the original does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rapidfuzz import fuzz, utils

from envs.webshop.colors import normalize_color
from envs.webshop.nouns import NounExtractor, fallback_nouns

__all__ = [
    "FUZZY_THRESHOLD",
    "get_attribute_reward",
    "get_option_reward",
    "get_reward",
    "get_type_reward",
    "similarity",
]

FUZZY_THRESHOLD = 85


def _process(value: Any) -> str:
    """The fuzzy matcher's preprocessing: str(), ASCII only, lower-case, non-alphanumerics to spaces."""
    return utils.default_process(str(value).encode("ascii", "ignore").decode("ascii"))


def similarity(a: Any, b: Any) -> float:
    """token_set_ratio (0-100) of two values after the matcher's preprocessing."""
    return fuzz.token_set_ratio(_process(a), _process(b))


def get_type_reward(
    purchased_product: Mapping[str, Any], goal: Mapping[str, Any], nouns: NounExtractor = fallback_nouns
) -> dict[str, Any]:
    """r_type and the three checks behind it (query_match, category_match, title_score)."""
    query_match = purchased_product["query"] == goal["query"]
    bought_path = {part.strip() for part in purchased_product["product_category"].split("›")}
    goal_path = {part.strip() for part in goal["product_category"].split("›")}
    category_match = len(bought_path & goal_path) >= 2
    bought_nouns = nouns(purchased_product["name"])
    goal_nouns = nouns(goal["name"])
    title_score = len(set(bought_nouns) & set(goal_nouns)) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def get_attribute_reward(purchased_product: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """(share of goal attributes matched, number matched)."""
    goal_attributes = goal["attributes"]
    texts = (
        purchased_product["Title"].lower(),
        " ".join(purchased_product["BulletPoints"]).lower(),
        purchased_product["Description"].lower(),
    )
    matches = 0
    for wanted in goal_attributes:
        if any(similarity(have, wanted) > FUZZY_THRESHOLD for have in purchased_product["Attributes"]) or any(
            wanted in text for text in texts
        ):
            matches += 1
    return matches / len(goal_attributes), matches


def get_option_reward(purchased_options: list[Any], goal_options: list[Any]) -> tuple[float | None, int]:
    """(share of goal options matched or None when the goal has none, number matched)."""
    chosen = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(1 for w in wanted if any(similarity(c, w) > FUZZY_THRESHOLD for c in chosen))
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    purchased_product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    nouns: NounExtractor = fallback_nouns,
) -> tuple[float, dict[str, Any]]:
    """(score in [0, 1], breakdown) for buying ``purchased_product`` at ``price`` with ``options`` chosen."""
    type_info = get_type_reward(purchased_product, goal, nouns)
    r_price = price <= goal["price_upper"]
    r_att, attribute_matches = get_attribute_reward(purchased_product, goal)
    goal_options = goal["goal_options"]
    wanted = list(goal_options.items()) if isinstance(goal_options, Mapping) else list(goal_options)
    r_option, option_matches = get_option_reward(list(options.values()), wanted)
    total = (attribute_matches + option_matches + r_price) / (len(goal["attributes"]) + len(wanted) + 1)
    total *= type_info["r_type"]
    return total, {
        **type_info,
        "r_att": r_att,
        "r_option": r_option,
        "r_price": r_price,
        "num_attr_matches": attribute_matches,
        "num_option_matches": option_matches,
    }
