"""The shop: a catalogue with its goals, prices, search index and reward scorer, built once per process.

Building the index and goals is the expensive part of starting an environment, and every field is read-only
afterwards, so environments with the same data settings share one ``WebShop`` (see ``get_shop``).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

from envs.webshop.bm25 import BM25Index
from envs.webshop.catalogue import BUNDLED_DATA_DIR, Catalogue, load_catalogue
from envs.webshop.goals import DEFAULT_SCHEME, build_goals, split_bounds
from envs.webshop.nouns import make_noun_extractor
from envs.webshop.products import document_text
from envs.webshop.reward import get_reward

__all__ = ["SEARCH_TOP_K", "WebShop", "get_shop"]

SEARCH_TOP_K = 50
_SEARCH_CACHE_SIZE = 4096


class WebShop:
    """Products, goals and splits, search and scoring for one catalogue."""

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        human_goals: bool = False,
        goal_seed: int = 233,
        noun_extractor: str = "auto",
    ):
        self.catalogue = catalogue
        self.goals, self.prices = build_goals(catalogue, human_goals=human_goals, seed=goal_seed)
        self.index = BM25Index(
            [document_text(p) for p in catalogue.products], doc_ids=[p["asin"] for p in catalogue.products]
        )
        self.nouns, self.noun_extractor_name = make_noun_extractor(noun_extractor)
        self._search_cache: OrderedDict[str, list[str]] = OrderedDict()

    def splits(self, scheme: str = DEFAULT_SCHEME) -> dict[str, tuple[int, int]]:
        """split name -> (start, end) into ``goals`` under ``scheme`` ('webshop' or 'gigpo')."""
        return split_bounds(len(self.goals), scheme)

    def split_goal_indices(self, split: str, scheme: str = DEFAULT_SCHEME) -> range:
        """Indices into ``goals`` of the tasks of ``split`` under ``scheme``."""
        bounds = self.splits(scheme)
        if split not in bounds:
            raise ValueError(
                f"split must be one of {sorted(bounds)} (split scheme {scheme!r}), got {split!r}"
            )
        start, end = bounds[split]
        return range(start, end)

    def search(self, keywords: str) -> list[str]:
        """asins of the top 50 products for ``keywords``, best first (cached: groups repeat queries)."""
        hit = self._search_cache.get(keywords)
        if hit is not None:
            self._search_cache.move_to_end(keywords)
            return hit
        products = self.catalogue.products
        asins = [products[i]["asin"] for i in self.index.search(keywords, SEARCH_TOP_K)]
        self._search_cache[keywords] = asins
        if len(self._search_cache) > _SEARCH_CACHE_SIZE:
            self._search_cache.popitem(last=False)
        return asins

    def score(self, asin: str, goal: dict[str, Any], options: dict[str, str]) -> tuple[float, dict[str, Any]]:
        """(score, breakdown) of buying ``asin`` with ``options`` for ``goal``."""
        product = self.catalogue.by_asin[asin]
        total, info = get_reward(product, goal, self.prices[asin], options, self.nouns)
        return total, {**info, "noun_extractor": self.noun_extractor_name}


@lru_cache(maxsize=8)
def get_shop(
    data_dir: str | None = None,
    file_set: str = "small",
    num_products: int | None = None,
    human_goals: bool = False,
    goal_seed: int = 233,
    noun_extractor: str = "auto",
) -> WebShop:
    """The shared shop for these data settings (``data_dir`` None: the bundled catalogue)."""
    catalogue = load_catalogue(
        Path(data_dir) if data_dir else BUNDLED_DATA_DIR, file_set=file_set, num_products=num_products
    )
    return WebShop(catalogue, human_goals=human_goals, goal_seed=goal_seed, noun_extractor=noun_extractor)
