"""Turning one raw product record of the original data files into the processed product the shop uses.

Field names are the original's (Title, Description, BulletPoints, Price, pricing, options, Attributes, ...), so
reward code and users' analyses read the same keys. Raw records that cannot be used raise ``MalformedRecord``
with the reason; the loader counts and logs those.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["DEFAULT_PRICE", "MalformedRecord", "document_text", "parse_pricing", "process_record"]

DEFAULT_PRICE = 100.0
_NOT_PRICE = re.compile(r"[^\d.]")


class MalformedRecord(ValueError):
    """A raw record the shop cannot use; the message names the field."""


def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """(prices, price tag) from a raw pricing string: "$12.99" -> [12.99]; "$10.00 - $20.00" -> [10.0, 20.0]."""
    if not pricing:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if not isinstance(pricing, str):
        raise MalformedRecord(f"pricing must be a string like '$12.99', got {type(pricing).__name__}")
    try:
        prices = [float(Decimal(_NOT_PRICE.sub("", part))) for part in pricing.split("$")[1:]]
    except InvalidOperation as error:
        raise MalformedRecord(f"pricing {pricing!r} is not a price or price range") from error
    if not prices:
        raise MalformedRecord(f"pricing {pricing!r} has no '$' amount")
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def _options(raw: Any) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    """Option names lower-cased; values stripped, lower-cased, '/' written ' | '; groups of None skipped."""
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, str | None] = {}
    if not raw:
        return options, option_to_image
    if not isinstance(raw, dict):
        raise MalformedRecord("customization_options must be an object {name: [{value, image}]} or null")
    for name, contents in raw.items():
        if contents is None:
            continue
        values = []
        for content in contents:
            if not isinstance(content, dict) or not isinstance(content.get("value"), str):
                raise MalformedRecord(f"customization_options[{name!r}] entries need a string 'value'")
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[name.lower()] = values
    return options, option_to_image


def _text(record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedRecord(f"{field} must be a string, got {type(value).__name__}")
    return value


def process_record(record: Any) -> dict[str, Any]:
    """The processed product for a raw record; raises MalformedRecord naming the offending field."""
    if not isinstance(record, dict):
        raise MalformedRecord(f"a product record must be an object, got {type(record).__name__}")
    asin = record.get("asin")
    if not isinstance(asin, str) or not asin:
        raise MalformedRecord("asin is missing or not a string")
    name = record.get("name")
    if not isinstance(name, str):
        raise MalformedRecord("name is missing or not a string")
    small = record.get("small_description")
    if small is None:
        bullets = [""]
    elif isinstance(small, list):
        bullets = [str(b) for b in small] or [""]
    elif isinstance(small, str):
        bullets = [small]
    else:
        raise MalformedRecord("small_description must be a string or a list of strings")
    prices, price_tag = parse_pricing(record.get("pricing"))
    options, option_to_image = _options(record.get("customization_options"))
    images = record.get("images") or [None]
    return {
        "asin": asin,
        "name": name,
        "category": _text(record, "category"),
        "query": _text(record, "query").lower().strip(),
        "product_category": _text(record, "product_category"),
        "Title": name,
        "Description": _text(record, "full_description"),
        "BulletPoints": bullets,
        "Reviews": [],
        "Rating": "N.A.",
        "pricing": prices,
        "Price": price_tag,
        "options": options,
        "option_to_image": option_to_image,
        "Attributes": ["DUMMY_ATTR"],
        "MainImage": images[0] if isinstance(images, list) else None,
    }


def document_text(product: dict[str, Any]) -> str:
    """The text the original indexed: title, description, first bullet point and the option groups, written
    "name: v1, v2, and name2: w1" (values joined by ", ", groups by ", and ")."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product["options"].items()]
    parts = [
        product["Title"],
        product["Description"],
        product["BulletPoints"][0],
        ", and ".join(option_texts),
    ]
    return " ".join(parts).lower()
