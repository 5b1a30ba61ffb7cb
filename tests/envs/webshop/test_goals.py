"""Goal building: option combinations, price ceilings, weights, seeds and split bounds."""

from __future__ import annotations

import pytest

from envs.webshop.catalogue import build_catalogue
from envs.webshop.generator import generate_catalogue
from envs.webshop.goals import NO_PRICE_LIMIT, build_goals, split_bounds


def product(asin, pricing="$25.00", options=None):
    return {
        "asin": asin,
        "name": f"Shoe {asin}",
        "category": "fashion",
        "query": "shoes",
        "product_category": "Clothing › Shoes",
        "full_description": "",
        "small_description": "",
        "pricing": pricing,
        "images": [],
        "customization_options": options,
    }


OPTIONS = {
    "Size": [{"value": "8"}, {"value": "9"}],
    "Color": [{"value": "Red"}, {"value": "Blue"}, {"value": "Green"}],
}


def catalogue():
    records = [product("A1", options=OPTIONS), product("A2", pricing="$995.00"), product("A3")]
    attributes = {
        "A1": {
            "attributes": ["x"],
            "instruction": "i want shoes",
            "instruction_attributes": ["light", "warm"],
        },
        "A2": {"attributes": ["x"], "instruction": "i want boots", "instruction_attributes": ["warm"]},
        "A3": {"attributes": ["x"], "instruction": None, "instruction_attributes": None},
    }
    human = {
        "A1": [
            {
                "instruction": "red shoes size 8.",
                "instruction_attributes": ["light"],
                "instruction_options": ["red"],
            },
            {"instruction": "skip me", "instruction_attributes": [], "instruction_options": []},
        ]
    }
    return build_catalogue(records, attributes, human)


def test_synthetic_goals_one_per_option_combination():
    goals, prices = build_goals(catalogue(), seed=1)
    a1 = sorted((g for g in goals if g["asin"] == "A1"), key=lambda g: g["instruction_text"])
    # 3 colours x 2 sizes, plus one goal for A2; A3 has no instruction.
    assert len(a1) == 6 and len(goals) == 7
    first = a1[0]
    assert first["goal_options"] == {"color": "blue", "size": "8"}
    ceiling = first["price_upper"]
    assert ceiling in (40.0, 50.0, 60.0)  # the larger of two of 30, 40, 50, 60 (the first four above 25)
    assert (
        first["instruction_text"]
        == f"i want shoes with color: blue, and size: 8, and price lower than {ceiling:.2f} dollars"
    )
    assert all(g["price_upper"] == ceiling for g in a1)  # one ceiling per product
    # 'light' appears in 6 goals, 'warm' in 7: A1 weight (1/6 + 1/7) / 2, A2 weight 1/7.
    assert first["weight"] == pytest.approx((1 / 6 + 1 / 7) / 2)
    a2 = next(g for g in goals if g["asin"] == "A2")
    # No ceiling of 10..990 lies above 995: no price limit and no price text.
    assert a2["price_upper"] == NO_PRICE_LIMIT and a2["instruction_text"] == "i want boots"
    assert prices == {"A1": 25.0, "A2": 995.0, "A3": 25.0}


def test_human_goals_keep_option_lists_and_skip_goals_without_attributes():
    goals, _ = build_goals(catalogue(), human_goals=True, seed=1)
    assert len(goals) == 1
    assert goals[0]["goal_options"] == ["red"] and goals[0]["instruction_text"].startswith(
        "red shoes size 8, and"
    )


def test_same_seed_same_goals_other_seed_other_draws():
    records, attributes, human = generate_catalogue(60, seed=3)
    built = build_catalogue(records, attributes, human)
    first, prices = build_goals(built, seed=5)
    again, prices_again = build_goals(built, seed=5)
    other, _ = build_goals(built, seed=6)
    assert first == again and prices == prices_again
    assert [g["instruction_text"] for g in first] != [g["instruction_text"] for g in other]


def test_split_bounds_fixed_and_scaled():
    assert split_bounds(12087) == {"test": (0, 500), "eval": (500, 1500), "train": (1500, 12087)}
    assert split_bounds(3000) == {"test": (0, 500), "eval": (500, 1500), "train": (1500, 3000)}
    assert split_bounds(1200) == {"test": (0, 200), "eval": (200, 600), "train": (600, 1200)}


def test_no_goals_is_an_error_naming_the_source():
    records = [product("A1")]
    with pytest.raises(ValueError, match=r"my.json: no synthetic \(items_ins_v2"):
        build_goals(build_catalogue(records, {}, {}, source="my.json"))
