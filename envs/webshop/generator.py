"""A seeded generator of WebShop catalogues in the original files' schema, for tests, benchmarks and the
bundled default catalogue (the original data cannot be redistributed or downloaded here).

Products span the original's five categories with category paths, search queries, brands, attributes, bullet
points, descriptions, single prices and price ranges (a few missing), and option groups (colours, sizes,
flavours, ...; some values with '/' as the originals have). Instruction files hold synthetic instructions with
their attributes and human-style instructions with options. The same seed gives byte-identical files.

    python -m envs.webshop.generator --out envs/webshop/data --num-products 300 --seed 0
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path
from typing import Any

__all__ = ["CATEGORIES", "generate_catalogue", "write_catalogue"]

# category -> (root of the category path, brands, [(product type, sub-path, query)], attributes, option groups)
CATEGORIES: dict[str, dict[str, Any]] = {
    "beauty": {
        "root": "Beauty & Personal Care",
        "brands": ["Lumina", "Verdana Botanics", "Auric", "Seabloom", "Mirelle", "Pure Haven"],
        "types": [
            ("hair extension", ["Hair Care", "Hair Extensions & Wigs"], "hair extensions"),
            ("face moisturizer", ["Skin Care", "Face", "Moisturizers"], "face moisturizer"),
            ("lipstick", ["Makeup", "Lips", "Lipstick"], "long lasting lipstick"),
            ("shampoo", ["Hair Care", "Shampoo & Conditioner"], "sulfate free shampoo"),
            ("nail polish", ["Foot, Hand & Nail Care", "Nail Polish"], "nail polish"),
            ("deodorant", ["Personal Care", "Deodorants"], "natural deodorant"),
        ],
        "attributes": [
            "long lasting",
            "cruelty free",
            "paraben free",
            "sulfate free",
            "natural ingredients",
            "easy to use",
            "dry skin",
            "sensitive skin",
            "travel size",
            "high quality",
        ],
        "options": {
            "Color": ["Black", "Natural Brown", "Rose Red", "Nude Pink", "Light Blonde", "Dark Brown/Black"],
            "Size": ["1.7 Fl Oz", "3.4 Fl Oz", "8 Ounce", "Pack of 2", "16 Inch", "20 Inch"],
            "Scent": ["Lavender", "Unscented", "Citrus", "Coconut"],
        },
    },
    "electronics": {
        "root": "Electronics",
        "brands": ["Voltra", "Nexon", "Arcwave", "Quantix", "Helio", "Brightline"],
        "types": [
            ("wireless earbuds", ["Headphones", "Earbud Headphones"], "wireless earbuds"),
            ("phone case", ["Cell Phones & Accessories", "Cases"], "iphone case"),
            ("hdmi cable", ["Accessories & Supplies", "Cables", "HDMI Cables"], "hdmi cable"),
            ("bluetooth speaker", ["Portable Audio", "Speakers"], "bluetooth speaker"),
            ("usb charger", ["Accessories & Supplies", "Chargers"], "usb c charger"),
            ("tv mount", ["Television & Video", "TV Mounts"], "tv wall mount"),
        ],
        "attributes": [
            "fast charging",
            "noise cancelling",
            "water resistant",
            "high speed",
            "easy install",
            "long battery life",
            "heavy duty",
            "4k ultra hd",
            "shock absorbing",
            "wireless bluetooth",
        ],
        "options": {
            "Color": ["Black", "White", "Navy Blue", "Silver", "Space Gray", "Black/Red"],
            "Size": ["3 Feet", "6 Feet", "10 Feet", "Small", "Large"],
            "Style": ["Standard", "Pro", "2 Pack", "With Case"],
        },
    },
    "fashion": {
        "root": "Clothing, Shoes & Jewelry",
        "brands": ["Northfold", "Cobalt & Co", "Wren", "Stridewell", "Amberline", "Tidal"],
        "types": [
            ("running shoe", ["Men", "Shoes", "Athletic"], "mens running shoes"),
            ("t-shirt", ["Women", "Clothing", "Tops, Tees & Blouses"], "womens t shirt"),
            ("hoodie", ["Men", "Clothing", "Fashion Hoodies & Sweatshirts"], "hoodie"),
            ("yoga pants", ["Women", "Clothing", "Active", "Leggings"], "high waist yoga pants"),
            ("dress", ["Women", "Clothing", "Dresses"], "summer dress"),
            ("ankle boot", ["Women", "Shoes", "Boots"], "ankle boots"),
        ],
        "attributes": [
            "machine wash",
            "slim fit",
            "button closure",
            "long sleeve",
            "non slip",
            "rubber sole",
            "high waist",
            "quick drying",
            "daily wear",
            "relaxed fit",
        ],
        "options": {
            "Color": ["Black", "White", "Heather Grey", "Navy", "Olive Green", "Burgundy", "Black/White"],
            "Size": ["Small", "Medium", "Large", "X-Large", "XX-Large", "7", "8", "9", "10"],
            "Fit Type": ["Regular", "Big & Tall"],
        },
    },
    "food": {
        "root": "Grocery & Gourmet Food",
        "brands": ["Harvest Lane", "Golden Acre", "Kettle Ridge", "Sunmill", "Bramble Farm", "Oak & Honey"],
        "types": [
            ("protein bar", ["Snack Foods", "Bars", "Protein Bars"], "protein bars"),
            ("ground coffee", ["Beverages", "Coffee", "Ground Coffee"], "ground coffee"),
            ("green tea", ["Beverages", "Tea", "Green Tea"], "green tea bags"),
            ("trail mix", ["Snack Foods", "Trail Mix"], "trail mix"),
            ("hot sauce", ["Condiments & Salad Dressings", "Hot Sauce"], "hot sauce"),
            ("olive oil", ["Pantry Staples", "Cooking Oils"], "extra virgin olive oil"),
        ],
        "attributes": [
            "gluten free",
            "non gmo",
            "low sugar",
            "keto friendly",
            "high protein",
            "usda organic",
            "sugar free",
            "plant based",
            "low calorie",
            "individually wrapped",
        ],
        "options": {
            "Flavor Name": ["Chocolate", "Peanut Butter", "Vanilla", "Original", "Mixed Berry", "Sea Salt"],
            "Size": ["12 Count (Pack of 1)", "6 Ounce (Pack of 3)", "1 Pound", "24 Count"],
        },
    },
    "furniture": {
        "root": "Home & Kitchen",
        "brands": ["Hearthwood", "Loftline", "Nordholm", "Casa Verde", "Maplecrest", "Stonebridge"],
        "types": [
            ("office chair", ["Furniture", "Home Office Furniture", "Chairs"], "ergonomic office chair"),
            ("coffee table", ["Furniture", "Living Room Furniture", "Tables"], "coffee table"),
            ("bookshelf", ["Furniture", "Living Room Furniture", "Bookcases"], "bookshelf"),
            ("bed frame", ["Furniture", "Bedroom Furniture", "Beds & Frames"], "queen bed frame"),
            ("bar stool", ["Furniture", "Kitchen & Dining Room Furniture", "Stools"], "bar stools set of 2"),
            ("nightstand", ["Furniture", "Bedroom Furniture", "Nightstands"], "nightstand"),
        ],
        "attributes": [
            "easy assembly",
            "solid wood",
            "storage space",
            "metal frame",
            "living room",
            "space saving",
            "mid century",
            "height adjustable",
            "lumbar support",
            "engineered wood",
        ],
        "options": {
            "Color": ["Walnut", "Black", "White", "Espresso", "Rustic Brown", "Grey/White"],
            "Size": ["Twin", "Full", "Queen", "King", "24 Inch", "30 Inch"],
        },
    },
}

_ADJECTIVES = ["premium", "classic", "modern", "compact", "deluxe", "everyday", "lightweight", "soft"]
_INSTRUCTION_OPENERS = ["i am looking for", "i need", "i want to buy", "find me", "i would like"]
_HUMAN_OPENERS = ["Could you find", "I'm shopping for", "Please get me", "Looking for"]


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in used:
            used.add(asin)
            return asin


def _pricing(rng: random.Random) -> str | None:
    draw = rng.random()
    if draw < 0.05:
        return None
    low = round(rng.uniform(3.0, 250.0), 2)
    if draw < 0.15:
        return f"${low:.2f} - ${low + round(rng.uniform(2.0, 40.0), 2):.2f}"
    return f"${low:.2f}"


def _product(rng: random.Random, asin: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    category = rng.choice(sorted(CATEGORIES))
    spec = CATEGORIES[category]
    kind, sub_path, query = rng.choice(spec["types"])
    brand = rng.choice(spec["brands"])
    attributes = rng.sample(spec["attributes"], rng.randint(2, 4))
    adjective = rng.choice(_ADJECTIVES)
    name = f"{brand} {adjective.title()} {kind.title()} - {attributes[0].title()}, {attributes[1].title()}"
    option_names = rng.sample(sorted(spec["options"]), rng.choice([0, 1, 1, 2, 2, 2]))
    options = {
        option: [
            {"value": v, "image": f"images/{asin}-{i}.jpg"}
            for i, v in enumerate(
                rng.sample(spec["options"][option], rng.randint(2, min(4, len(spec["options"][option]))))
            )
        ]
        for option in sorted(option_names)
    }
    bullets = [f"{attribute.capitalize()}: this {kind} is made to last." for attribute in attributes[1:]]
    bullets.append(f"Designed by {brand} for {rng.choice(['home', 'travel', 'work', 'everyday'])} use.")
    record = {
        "asin": asin,
        "name": name,
        "category": category,
        "query": query,
        "product_category": " › ".join([spec["root"], *sub_path]),
        "full_description": (
            f"The {brand} {kind} is a {adjective} choice. It is {attributes[-1]} and "
            f"{rng.choice(spec['attributes'])}, with a {rng.choice(['one year', 'two year', 'lifetime'])} warranty."
        ),
        "small_description": bullets if rng.random() < 0.8 else bullets[0],
        "pricing": _pricing(rng),
        "images": [f"images/{asin}.jpg"],
        "customization_options": options or None,
    }
    wanted = rng.sample(attributes, rng.randint(1, 2))
    instruction = {
        "attributes": attributes,
        "instruction": f"{rng.choice(_INSTRUCTION_OPENERS)} a {kind} that is {' and '.join(wanted)}",
        "instruction_attributes": wanted,
    }
    human = []
    if rng.random() < 0.4:
        for n in range(rng.randint(1, 2)):
            picks = [rng.choice(opts)["value"].lower() for opts in options.values()]
            said = rng.sample(attributes, rng.randint(0, 2))
            human.append(
                {
                    "instruction": f"{rng.choice(_HUMAN_OPENERS)} a {' '.join(said)} {kind} in {' '.join(picks)}.",
                    "instruction_attributes": said,
                    "instruction_options": picks,
                    "assignment_id": f"{asin}-{n}",
                    "worker_id": f"W{rng.randint(1000, 9999)}",
                }
            )
    return record, instruction, human


def generate_catalogue(
    num_products: int, seed: int = 0, *, instruction_share: float = 0.95
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(product records, asin -> synthetic instruction entry, asin -> human instruction entries)."""
    if num_products < 1:
        raise ValueError(f"num_products must be at least 1, got {num_products}")
    rng = random.Random(seed)
    used: set[str] = set()
    records, attributes, human = [], {}, {}
    for _ in range(num_products):
        asin = _asin(rng, used)
        record, instruction, human_entries = _product(rng, asin)
        records.append(record)
        if rng.random() < instruction_share:
            attributes[asin] = instruction
        if human_entries:
            human[asin] = human_entries
    return records, attributes, human


def write_catalogue(out_dir: str | Path, num_products: int, seed: int = 0) -> Path:
    """Write the three data files (small-set names) for a generated catalogue into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, attributes, human = generate_catalogue(num_products, seed)
    for name, payload in (
        ("items_shuffle_1000.json", records),
        ("items_ins_v2_1000.json", attributes),
        ("items_human_ins.json", human),
    ):
        (out / name).write_text(json.dumps(payload, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-products", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_catalogue(args.out, args.num_products, args.seed))


if __name__ == "__main__":
    main()
