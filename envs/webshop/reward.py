"""The purchase score of the original WebShop (engine/goal.py get_reward), with its names and quirks.

total = r_type * (matched attributes + matched options + r_price) / (goal attributes + goal options + 1)

r_type checks the product type: 1.0 when the query is the goal's, the category paths share two parts, or more
than 0.2 of the goal name's nouns are in the bought name; 0.5 when none holds; then 0.1 when under 0.1 of the
nouns match and 0 when none does. An attribute matches when the fuzzy score with some product attribute exceeds
85, else when it is a substring of the lower-cased title, bullet points or description. An option matches when
the fuzzy score against some chosen value exceeds 85 after colour normalisation; a synthetic goal's options (a
dict) are compared as stringified (name, value) pairs, as the original does.

The fuzzy score is the original's (thefuzz 0.19 token_set_ratio, without python-Levenshtein): characters 128-255
are deleted (other non-ASCII stays), non-word characters become spaces, then lower-case and strip; the best of
three difflib ratios over the sorted token sets, each rounded to an integer as Python's round() does. So 85.1
does not exceed 85, while 85.7 rounds to 86 and does. rapidfuzz's unrounded token_set_ratio (``similarity``) is
never below that ratio (difflib's matching blocks are a common subsequence), so it rules out most non-matches
fast and the exact score is computed only for the candidates left.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from difflib import SequenceMatcher
from typing import Any

from rapidfuzz import fuzz

from envs.webshop.colors import normalize_color
from envs.webshop.nouns import NounExtractor, fallback_nouns

__all__ = [
    "FUZZY_THRESHOLD",
    "fuzzy_match",
    "fuzzy_score",
    "get_attribute_reward",
    "get_option_reward",
    "get_reward",
    "get_type_reward",
    "similarity",
]

FUZZY_THRESHOLD = 85


_LATIN1_DELETED = dict.fromkeys(range(128, 256))
_NON_WORD = re.compile(r"\W")
# rapidfuzz's bound below this cannot round above the threshold (margin for the two libraries' float paths).
_BOUND = FUZZY_THRESHOLD + 0.5 - 1e-6


def _process(value: Any) -> str:
    """The original matcher's preprocessing: str(), characters 128-255 deleted, non-word characters to spaces,
    lower-case, strip."""
    return _NON_WORD.sub(" ", str(value).translate(_LATIN1_DELETED)).lower().strip()


def similarity(a: Any, b: Any) -> float:
    """rapidfuzz's unrounded token_set_ratio (0-100) after the original's preprocessing: an upper bound of the
    original's ratio before rounding."""
    return fuzz.token_set_ratio(_process(a), _process(b), processor=None)


def _ratio(a: str, b: str) -> int:
    """thefuzz's ratio: difflib's 2 M / T in percent, rounded (equal strings 100, an empty one 0)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * SequenceMatcher(None, a, b).ratio())


def _prefix_ratio(a: str, b: str) -> int:
    """``_ratio`` when ``b`` starts with ``a``: difflib matches all of ``a`` (M = len(a)) unless its junk
    heuristic applies (``b`` of 200 characters or more)."""
    if a == b:
        return 100
    if not a or len(b) >= 200:
        return _ratio(a, b)
    return round(100 * (2.0 * len(a) / (len(a) + len(b))))


def _token_set_score(a: str, b: str) -> int:
    if not a or not b:
        return 0
    tokens_a, tokens_b = set(a.split()), set(b.split())
    common = " ".join(sorted(tokens_a & tokens_b))
    with_a = f"{common} {' '.join(sorted(tokens_a - tokens_b))}".strip()
    with_b = f"{common} {' '.join(sorted(tokens_b - tokens_a))}".strip()
    best = max(_prefix_ratio(common, with_a), _prefix_ratio(common, with_b))
    # rapidfuzz's ratio bounds difflib's from above: difflib runs only when it could raise the best.
    if fuzz.ratio(with_a, with_b) < best + 0.5 - 1e-6:
        return best
    return max(best, _ratio(with_a, with_b))


def fuzzy_score(a: Any, b: Any) -> int:
    """The original's integer token-set score (0-100) of two values."""
    return _token_set_score(_process(a), _process(b))


def fuzzy_match(a: Any, b: Any) -> bool:
    """Whether the original's score exceeds 85 (rapidfuzz's bound first, the exact score only when needed)."""
    pa, pb = _process(a), _process(b)
    if fuzz.token_set_ratio(pa, pb, processor=None) < _BOUND:
        return False
    return _token_set_score(pa, pb) > FUZZY_THRESHOLD


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
        if any(fuzzy_match(have, wanted) for have in purchased_product["Attributes"]) or any(
            wanted in text for text in texts
        ):
            matches += 1
    return matches / len(goal_attributes), matches


def get_option_reward(purchased_options: list[Any], goal_options: list[Any]) -> tuple[float | None, int]:
    """(share of goal options matched or None when the goal has none, number matched)."""
    chosen = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(1 for w in wanted if any(fuzzy_match(c, w) for c in chosen))
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
