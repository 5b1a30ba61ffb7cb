"""Moving between pages on search[...] and click[...] actions; anything else leaves the page as it was.

search[text] works from every page and opens page 1 of the results for the lower-cased text. click[x] works
when x is a clickable of the current page: 'back to search', 'next >', '< prev', an asin, 'description',
'features', 'reviews', an option value (selects it) or 'buy now' (purchase). 'click[search]' is refused: a
search needs its text, so it is made with search[...].
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from envs.webshop.pages import SUB_PAGES, Page, RenderedPage

__all__ = ["Move", "parse_action", "transition"]

_ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """(name, argument) of 'name[argument]' (argument None when the text has no brackets)."""
    match = _ACTION.match(action) if isinstance(action, str) else None
    if match is None:
        return (action if isinstance(action, str) else ""), None
    return match.group(1), match.group(2)


@dataclass(frozen=True)
class Move:
    """The result of one action: the next page, whether the action did anything, whether it bought."""

    page: Page
    valid: bool
    purchase: bool = False


def transition(page: Page, rendered: RenderedPage, action: str) -> Move:
    """The page after ``action`` on ``page`` (whose rendering is ``rendered``)."""
    name, argument = parse_action(action.strip() if isinstance(action, str) else action)
    if argument is not None:
        argument = argument.lower()
    if name == "search" and argument and argument.strip():
        return Move(Page(kind="results", keywords=argument, page=1), True)
    if name != "click" or argument is None or argument not in rendered.clickables or argument == "search":
        return Move(page, False)
    if argument == "back to search":
        return Move(Page(), True)
    if page.kind == "results":
        if argument == "next >":
            return Move(replace(page, page=page.page + 1), True)
        if argument == "< prev":
            return Move(replace(page, page=page.page - 1), True)
        asin = next(a for a in rendered.result_asins if a.lower() == argument)
        return Move(Page(kind="item", keywords=page.keywords, page=page.page, asin=asin), True)
    if page.kind == "item":
        if argument == "< prev":
            return Move(Page(kind="results", keywords=page.keywords, page=page.page), True)
        if argument in SUB_PAGES:
            return Move(replace(page, kind="item_sub", sub=argument), True)
        if argument == "buy now":
            return Move(replace(page, kind="done"), True, purchase=True)
        return Move(page.with_option(rendered.option_of_value[argument], argument), True)
    if page.kind == "item_sub" and argument == "< prev":
        return Move(replace(page, kind="item", sub=""), True)
    return Move(page, False)
