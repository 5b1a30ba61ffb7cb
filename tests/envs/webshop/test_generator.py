"""The seeded catalogue generator and the bundled catalogue it wrote."""

from __future__ import annotations

from envs.webshop.catalogue import BUNDLED_DATA_DIR, load_catalogue
from envs.webshop.generator import CATEGORIES, generate_catalogue, write_catalogue

RAW_FIELDS = {
    "asin",
    "name",
    "category",
    "query",
    "product_category",
    "full_description",
    "small_description",
    "pricing",
    "images",
    "customization_options",
}


def test_same_seed_same_files_other_seed_differs(tmp_path):
    a = write_catalogue(tmp_path / "a", 40, seed=1)
    b = write_catalogue(tmp_path / "b", 40, seed=1)
    c = write_catalogue(tmp_path / "c", 40, seed=2)
    for name in ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "items_shuffle_1000.json").read_bytes() != (c / "items_shuffle_1000.json").read_bytes()


def test_records_follow_the_original_schema():
    records, attributes, human = generate_catalogue(200, seed=0)
    assert all(set(r) == RAW_FIELDS and len(r["asin"]) == 10 for r in records)
    assert {r["category"] for r in records} == set(CATEGORIES)
    pricings = [r["pricing"] for r in records]
    assert None in pricings and any(p and " - " in p for p in pricings)
    assert any(r["customization_options"] is None for r in records)
    assert any(
        "/" in v["value"] for r in records for vs in (r["customization_options"] or {}).values() for v in vs
    )
    assert 0 < len(attributes) < 200 and all(
        set(a) == {"attributes", "instruction", "instruction_attributes"} for a in attributes.values()
    )
    assert any(not e["instruction_attributes"] for es in human.values() for e in es)


def test_bundled_catalogue_is_the_generator_output(tmp_path):
    fresh = write_catalogue(tmp_path, 300, seed=0)
    for name in ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"):
        assert (fresh / name).read_bytes() == (BUNDLED_DATA_DIR / name).read_bytes()
    assert len(load_catalogue()) == 300
