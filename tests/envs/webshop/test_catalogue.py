"""The loader on files in the original schema: processing rules, streaming, and errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.webshop.catalogue import build_catalogue, load_catalogue
from envs.webshop.products import document_text, parse_pricing


def record(asin: str, **fields) -> dict:
    base = {
        "asin": asin,
        "name": f"Product {asin}",
        "category": "fashion",
        "query": " Mens Shoes ",
        "product_category": "Clothing › Men › Shoes",
        "full_description": "A shoe.",
        "small_description": "Runs true to size",
        "pricing": "$12.99",
        "images": [f"{asin}.jpg"],
        "customization_options": {"Color": [{"value": "Black/White", "image": None}], "Size": None},
    }
    return {**base, **fields}


def write(tmp_path: Path, products, attributes=None, human=None, names=("items_shuffle_1000.json",)) -> Path:
    (tmp_path / names[0]).write_text(json.dumps(products))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(attributes or {}))
    (tmp_path / "items_human_ins.json").write_text(json.dumps(human or {}))
    return tmp_path


def test_processing_rules(tmp_path):
    products = [
        record("B01"),
        record("nan"),
        record("B0123456789X"),  # longer than 10 characters
        record("B01", name="duplicate"),
        record("B02", pricing="$10.00 - $20.00", small_description=["a", "b"], customization_options=None),
        {"name": "no asin"},
        record("B03", pricing=None),
    ]
    attributes = {
        "B01": {"attributes": ["comfortable"], "instruction": "i need shoes", "instruction_attributes": []}
    }
    human = {
        "B02": [{"instruction": "shoes please", "instruction_attributes": ["a"], "instruction_options": []}]
    }
    catalogue = load_catalogue(write(tmp_path, products, attributes, human))
    assert [p["asin"] for p in catalogue.products] == ["B01", "B02", "B03"]
    assert catalogue.skipped == {"bad_asin": 2, "duplicate_asin": 1, "malformed": 1}
    b01, b02, b03 = catalogue.products
    assert b01["Title"] == "Product B01" and b01["query"] == "mens shoes"
    assert b01["options"] == {"color": ["black | white"]}  # None groups are skipped
    assert b01["BulletPoints"] == ["Runs true to size"] and b01["Attributes"] == ["comfortable"]
    assert b01["Price"] == "$12.99" and b01["instruction_text"] == "i need shoes"
    assert b02["pricing"] == [10.0, 20.0] and b02["Price"] == "$10.0 to $20.0"
    assert b02["Attributes"] == ["DUMMY_ATTR"] and b02["instructions"][0]["instruction"] == "shoes please"
    assert b03["pricing"] == [100.0]
    assert document_text(b01) == "product b01 a shoe. runs true to size color: black | white"


def test_num_products_limits_raw_records(tmp_path):
    data = write(tmp_path, [record(f"B0{i}") for i in range(5)])
    assert len(load_catalogue(data, num_products=3)) == 3


def test_full_file_set_names(tmp_path):
    (tmp_path / "items_shuffle.json").write_text(json.dumps([record("B01")]))
    (tmp_path / "items_ins_v2.json").write_text("{}")
    (tmp_path / "items_human_ins.json").write_text("{}")
    assert len(load_catalogue(tmp_path, file_set="full")) == 1
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        load_catalogue(tmp_path, file_set="small")


def test_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        load_catalogue(tmp_path)
    write(tmp_path, [])
    with pytest.raises(ValueError, match="items_shuffle_1000.json.*no usable products"):
        load_catalogue(tmp_path)
    (tmp_path / "items_shuffle_1000.json").write_text('[{"asin": "B01", "name": ')
    with pytest.raises(ValueError, match="items_shuffle_1000.json.*not valid JSON"):
        load_catalogue(tmp_path)
    write(tmp_path, [record("B01")])
    (tmp_path / "items_human_ins.json").unlink()
    with pytest.raises(FileNotFoundError, match="items_human_ins.json"):
        load_catalogue(tmp_path)


def test_malformed_instruction_entries_are_counted(tmp_path):
    catalogue = load_catalogue(write(tmp_path, [record("B01")], {"B01": "oops"}, {"B01": {"not": "a list"}}))
    assert catalogue.skipped == {"malformed_attribute_entry": 1, "malformed_human_entry": 1}


def test_pricing_errors_name_the_field():
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    with pytest.raises(ValueError, match="pricing"):
        parse_pricing("$abc")


def test_build_catalogue_from_memory_rejects_empty():
    with pytest.raises(ValueError, match="no usable products"):
        build_catalogue([{"asin": "nan", "name": "x"}], {}, {})


def test_product_file_is_streamed(tmp_path):
    # The file breaks off after three records: a whole-file parse would fail, streaming stops before the break.
    text = json.dumps([record(f"B0{i}") for i in range(3)])[:-1] + ', {"asin": "B09", "na'
    write(tmp_path, [])
    (tmp_path / "items_shuffle_1000.json").write_text(text)
    assert [p["asin"] for p in load_catalogue(tmp_path, num_products=3).products] == ["B00", "B01", "B02"]
