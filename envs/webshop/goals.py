"""Shopping goals built from the catalogue as the original builds them, every draw from explicit seeds.

Prices: a product with a price range gets a price drawn uniformly within it. Price ceiling: of 10, 20, ...,
990 take the first four above the price, sample two and keep the larger (", and price lower than X.XX dollars");
with fewer than two such ceilings the goal has no price limit (1e6) and no price text. Synthetic goals: one per
combination of a product's option values, "{instruction} with k: v, and k: v{price text}", goal_options a dict,
weight the mean of 1/(goal count) of their attributes. Human goals: one per instruction entry with attributes,
goal_options a list, weight 1. Prices and ceilings come from ``random.Random(seed)``; the goal list is then
shuffled by a fresh ``random.Random(seed)``, which with the original's seed 233 gives the original goal order.

Split schemes (cut points into the shuffled goal list): 'webshop', the original WebShop baselines' test [:500],
eval [500:1500], train [1500:]; 'gigpo', the GiGPO reference's (verl-agent) eval [:500], train [500:]. Both
evaluate on the same first 500 goals. With fewer than 3,000 goals the cut points scale by goals / 3,000 (500 ->
the first sixth, 1,500 -> half), which equals the fixed ones at exactly 3,000 goals and keeps every split
non-empty on a small catalogue; numbers from such a catalogue are not comparable with the papers' (a warning
is logged, and the environment's description says "scaled").
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import defaultdict
from typing import Any

from envs.webshop.catalogue import Catalogue

__all__ = [
    "DEFAULT_SCHEME",
    "FULL_SIZE_GOALS",
    "NO_PRICE_LIMIT",
    "PRICE_CEILINGS",
    "SPLITS",
    "SPLIT_SCHEMES",
    "build_goals",
    "draw_prices",
    "split_bounds",
]

PRICE_CEILINGS: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_LIMIT = 1_000_000
SPLITS = ("test", "eval", "train")
# scheme -> split -> (start, end) cut points at full size (None: the end of the goal list).
SPLIT_SCHEMES: dict[str, dict[str, tuple[int, int | None]]] = {
    "webshop": {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)},
    "gigpo": {"eval": (0, 500), "train": (500, None)},
}
DEFAULT_SCHEME = "webshop"
FULL_SIZE_GOALS = 3000

logger = logging.getLogger(__name__)


def draw_prices(catalogue: Catalogue, rng: random.Random) -> dict[str, float]:
    """asin -> the price charged: the single price, or a uniform draw within a price range."""
    prices = {}
    for product in catalogue.products:
        pricing = product["pricing"]
        prices[product["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return prices


def _price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    above = [c for c in PRICE_CEILINGS if c > price][:4]
    if len(above) < 2:
        return NO_PRICE_LIMIT, ""
    _, upper = sorted(rng.sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def _synthetic_goals(
    catalogue: Catalogue, prices: dict[str, float], rng: random.Random
) -> list[dict[str, Any]]:
    goals = []
    attribute_counts: dict[str, int] = defaultdict(int)
    for product in catalogue.products:
        if product.get("instruction_text") is None or not product.get("instruction_attributes"):
            continue
        upper, price_text = _price_limit(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],
                    "product_category": product["product_category"],
                    "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                    "attributes": list(product["instruction_attributes"]),
                    "price_upper": upper,
                    "goal_options": goal_options,
                }
            )
            for attribute in product["instruction_attributes"]:
                attribute_counts[attribute] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / attribute_counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def _human_goals(catalogue: Catalogue, prices: dict[str, float], rng: random.Random) -> list[dict[str, Any]]:
    goals, without_attributes = [], 0
    for product in catalogue.products:
        for entry in product.get("instructions", []):
            attributes = entry.get("instruction_attributes") or []
            if not attributes:
                without_attributes += 1
                continue
            upper, price_text = _price_limit(prices[product["asin"]], rng)
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["name"],
                    "product_category": product["product_category"],
                    "instruction_text": str(entry.get("instruction", "")).strip(".") + price_text,
                    "attributes": list(attributes),
                    "price_upper": upper,
                    "goal_options": list(entry.get("instruction_options") or []),
                    "weight": 1,
                }
            )
    if without_attributes:
        logger.info(
            "%s: %d human instructions without attributes skipped", catalogue.source, without_attributes
        )
    return goals


def build_goals(
    catalogue: Catalogue, *, human_goals: bool = False, seed: int = 233
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(goals in shuffled order, asin -> price charged); the same seed gives the same goals and prices."""
    rng = random.Random(seed)
    prices = draw_prices(catalogue, rng)
    goals = (_human_goals if human_goals else _synthetic_goals)(catalogue, prices, rng)
    if not goals:
        kind = "human (items_human_ins.json)" if human_goals else "synthetic (items_ins_v2*.json)"
        raise ValueError(f"{catalogue.source}: no {kind} goals can be built from this catalogue")
    random.Random(seed).shuffle(goals)
    return goals, prices


def split_bounds(num_goals: int, scheme: str = DEFAULT_SCHEME) -> dict[str, tuple[int, int]]:
    """split name -> (start, end) into the shuffled goal list under ``scheme`` (scaled below 3,000 goals)."""
    if scheme not in SPLIT_SCHEMES:
        raise ValueError(f"split_scheme must be one of {sorted(SPLIT_SCHEMES)}, got {scheme!r}")

    def cut(point: int | None) -> int:
        if point is None:
            return num_goals
        return point if num_goals >= FULL_SIZE_GOALS else num_goals * point // FULL_SIZE_GOALS

    return {split: (cut(start), cut(end)) for split, (start, end) in SPLIT_SCHEMES[scheme].items()}
