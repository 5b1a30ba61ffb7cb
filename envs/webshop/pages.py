"""Pages of the shop and what each shows: the text observation and the clickable elements.

Observations are the page's visible texts joined by " [SEP] ", as the original's text mode renders them, each
page headed by the instruction. Clickables are lower-cased button texts, lower-cased asins and option values; a
value shared by two option groups selects the later group, as the original's one-entry-per-text mapping does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from envs.webshop.shop import WebShop

__all__ = ["RESULTS_PER_PAGE", "SUB_PAGES", "Page", "RenderedPage", "render"]

RESULTS_PER_PAGE = 10
SUB_PAGES = ("description", "features", "reviews")
SEP = " [SEP] "


@dataclass(frozen=True)
class Page:
    """Where the browser is: kind is 'search', 'results', 'item', 'item_sub' or 'done'."""

    kind: str = "search"
    keywords: str = ""
    page: int = 1
    asin: str = ""
    sub: str = ""
    options: tuple[tuple[str, str], ...] = ()

    def with_option(self, name: str, value: str) -> Page:
        chosen = dict(self.options)
        chosen[name] = value
        return replace(self, options=tuple(chosen.items()))


@dataclass(frozen=True)
class RenderedPage:
    observation: str
    clickables: tuple[str, ...]
    has_search_bar: bool
    option_of_value: dict[str, str]
    result_asins: tuple[str, ...]


def _join(parts: list[str]) -> str:
    return SEP.join(p.strip() for p in parts if p and p.strip())


def render(
    page: Page, shop: WebShop, instruction: str, purchase: dict[str, Any] | None = None
) -> RenderedPage:
    """The observation and clickables of ``page`` for a shopper following ``instruction``."""
    header = ["Instruction:", instruction]
    if page.kind == "search":
        return RenderedPage(_join(["WebShop", *header, "Search"]), ("search",), True, {}, ())
    if page.kind == "results":
        hits = shop.search(page.keywords)
        shown = hits[(page.page - 1) * RESULTS_PER_PAGE : page.page * RESULTS_PER_PAGE]
        buttons = ["Back to Search", f"Page {page.page} (Total results: {len(hits)})"]
        clickables = ["back to search"]
        if page.page > 1:
            buttons.append("< Prev")
            clickables.append("< prev")
        buttons.append("Next >")
        clickables.append("next >")
        listing = []
        for asin in shown:
            product = shop.catalogue.by_asin[asin]
            listing += [asin, product["Title"], product["Price"]]
            clickables.append(asin.lower())
        return RenderedPage(_join([*header, *buttons, *listing]), tuple(clickables), False, {}, tuple(shown))
    product = shop.catalogue.by_asin.get(page.asin, {})
    if page.kind == "item":
        option_parts, option_of_value = [], {}
        for name, values in product["options"].items():
            option_parts += [name, *values]
            for value in values:
                option_of_value[value] = name
        text = _join(
            [
                *header,
                "Back to Search",
                "< Prev",
                *option_parts,
                product["Title"],
                f"Price: {product['Price']}",
                f"Rating: {product['Rating']}",
                "Description",
                "Features",
                "Reviews",
                "Buy Now",
            ]
        )
        buttons = ("back to search", "< prev", *SUB_PAGES, "buy now")
        values = tuple(v for v in option_of_value if v not in buttons)
        return RenderedPage(text, buttons + values, False, option_of_value, ())
    if page.kind == "item_sub":
        if page.sub == "description":
            body = [product["Description"]]
        elif page.sub == "features":
            body = list(product["BulletPoints"])
        else:
            body = [
                part
                for review in product["Reviews"]
                for part in (
                    str(review.get("title", "")),
                    str(review.get("score", "")),
                    str(review.get("body", "")),
                )
            ]
        return RenderedPage(
            _join([*header, "Back to Search", "< Prev", *body]), ("back to search", "< prev"), False, {}, ()
        )
    purchase = purchase or {}
    text = _join(
        [
            "Thank you for shopping with us!",
            "Purchased",
            "asin",
            page.asin,
            "options",
            ", ".join(f"{k}: {v}" for k, v in page.options) or "none",
            "Your score (min 0.0, max 1.0)",
            f"{purchase.get('score', 0.0):.4f}",
        ]
    )
    return RenderedPage(text, (), False, {}, ())
