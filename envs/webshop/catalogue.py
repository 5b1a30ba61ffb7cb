"""The product catalogue: loading the original WebShop data files (streamed) or records made in memory.

File names follow the original: ``items_shuffle_1000.json`` + ``items_ins_v2_1000.json`` for the small set,
``items_shuffle.json`` + ``items_ins_v2.json`` for the full one, and ``items_human_ins.json`` in both. The full
product file is 5.5 GB, so every file is streamed with ijson and only entries for loaded products are kept.
Processing follows the original: asins equal to 'nan' or longer than 10 characters and repeated asins are
dropped; products without an attribute entry get ['DUMMY_ATTR']. Every dropped record is counted in
``Catalogue.skipped`` by reason and logged; an unreadable file or an empty catalogue is an error naming the file.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from envs.webshop.products import MalformedRecord, process_record

__all__ = ["BUNDLED_DATA_DIR", "FILE_SETS", "Catalogue", "build_catalogue", "load_catalogue"]

logger = logging.getLogger(__name__)

BUNDLED_DATA_DIR = Path(__file__).parent / "data"
FILE_SETS: dict[str, tuple[str, str]] = {
    "small": ("items_shuffle_1000.json", "items_ins_v2_1000.json"),
    "full": ("items_shuffle.json", "items_ins_v2.json"),
}
HUMAN_FILE = "items_human_ins.json"
_MAX_ASIN_LENGTH = 10


@dataclass
class Catalogue:
    """Processed products in file order, looked up by asin; ``skipped`` counts dropped records by reason."""

    products: list[dict[str, Any]]
    source: str
    skipped: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if not self.products:
            raise ValueError(f"{self.source}: the catalogue has no usable products")
        self.by_asin = {p["asin"]: p for p in self.products}

    def __len__(self) -> int:
        return len(self.products)


def _process_products(
    records: Iterable[Any], source: str, skipped: Counter, num_products: int | None
) -> list[dict[str, Any]]:
    products, seen = [], set()
    for index, record in enumerate(itertools.islice(records, num_products)):
        try:
            product = process_record(record)
        except MalformedRecord as error:
            skipped["malformed"] += 1
            if skipped["malformed"] <= 5:
                logger.warning("%s: product record %d skipped: %s", source, index, error)
            continue
        asin = product["asin"]
        if asin == "nan" or len(asin) > _MAX_ASIN_LENGTH:
            skipped["bad_asin"] += 1
            continue
        if asin in seen:
            skipped["duplicate_asin"] += 1
            continue
        seen.add(asin)
        products.append(product)
    return products


def _attach_instructions(
    products: list[dict[str, Any]],
    attributes: Iterable[tuple[str, Any]],
    human: Iterable[tuple[str, Any]],
    source: str,
    skipped: Counter,
) -> None:
    by_asin = {p["asin"]: p for p in products}
    for asin, entry in attributes:
        product = by_asin.get(asin)
        if product is None:
            continue
        if not isinstance(entry, dict):
            skipped["malformed_attribute_entry"] += 1
            logger.warning("%s: attribute entry for %s is not an object; skipped", source, asin)
            continue
        if entry.get("attributes"):
            product["Attributes"] = [str(a) for a in entry["attributes"]]
        product["instruction_text"] = entry.get("instruction")
        product["instruction_attributes"] = entry.get("instruction_attributes")
    for asin, entries in human:
        product = by_asin.get(asin)
        if product is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            skipped["malformed_human_entry"] += 1
            logger.warning("%s: human instructions for %s are not a list of objects; skipped", source, asin)
            continue
        product["instructions"] = entries
    for product in products:
        product.setdefault("instruction_text", None)
        product.setdefault("instruction_attributes", None)


def build_catalogue(
    records: Iterable[Any],
    attributes: Mapping[str, Any] | Iterable[tuple[str, Any]],
    human: Mapping[str, Any] | Iterable[tuple[str, Any]],
    *,
    source: str = "<memory>",
    num_products: int | None = None,
) -> Catalogue:
    """A catalogue from raw records and instruction entries already in memory (or any iterables of them)."""
    skipped: Counter = Counter()
    products = _process_products(records, source, skipped, num_products)
    attr_items = attributes.items() if isinstance(attributes, Mapping) else attributes
    human_items = human.items() if isinstance(human, Mapping) else human
    _attach_instructions(products, attr_items, human_items, source, skipped)
    if skipped:
        logger.warning("%s: dropped records by reason: %s", source, dict(skipped))
    return Catalogue(products, source, skipped)


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"WebShop data file not found: {path}")
    return path


def _stream(path: Path, kind: str) -> Iterator[Any]:
    """Items of a JSON list ('list') or (key, value) pairs of a JSON object ('object'), streamed."""
    with path.open("rb") as handle:
        try:
            if kind == "list":
                yield from ijson.items(handle, "item", use_float=True)
            else:
                yield from ijson.kvitems(handle, "", use_float=True)
        except ijson.JSONError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error


def load_catalogue(
    data_dir: str | Path = BUNDLED_DATA_DIR, *, file_set: str = "small", num_products: int | None = None
) -> Catalogue:
    """Load the original data files from ``data_dir`` (file set 'small' or 'full'), streaming every file."""
    if file_set not in FILE_SETS:
        raise ValueError(f"file_set must be one of {sorted(FILE_SETS)}, got {file_set!r}")
    data_dir = Path(data_dir)
    product_name, attribute_name = FILE_SETS[file_set]
    product_path = _require(data_dir / product_name)
    attribute_path = _require(data_dir / attribute_name)
    human_path = _require(data_dir / HUMAN_FILE)
    skipped: Counter = Counter()
    products = _process_products(_stream(product_path, "list"), str(product_path), skipped, num_products)
    if not products:
        raise ValueError(f"{product_path}: the catalogue has no usable products")
    _attach_instructions(
        products, _stream(attribute_path, "object"), _stream(human_path, "object"), str(data_dir), skipped
    )
    if skipped:
        logger.warning("%s: dropped records by reason: %s", data_dir, dict(skipped))
    return Catalogue(products, str(product_path), skipped)
