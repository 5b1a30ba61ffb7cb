"""Golden purchase scores computed by hand from the documented rules of the original get_reward."""

from __future__ import annotations

import pytest

from envs.webshop.colors import COLOR_WORDS, normalize_color
from envs.webshop.nouns import fallback_nouns
from envs.webshop.reward import (
    fuzzy_match,
    fuzzy_score,
    get_attribute_reward,
    get_option_reward,
    get_reward,
    get_type_reward,
    similarity,
)

PRODUCT = {
    "asin": "B000000001",
    "name": "lumina clip hair extension",
    "Title": "Lumina Clip Hair Extension",
    "query": "hair extensions",
    "product_category": "Beauty & Personal Care › Hair Care › Hair Extensions",
    "Attributes": ["long lasting", "natural looking"],
    "BulletPoints": ["Made of real human hair", "Ten clips"],
    "Description": "Soft and easy to style.",
}


def words(text: str) -> list[str]:
    """A noun extractor for golden cases: every whitespace-separated word is a noun."""
    return text.lower().split()


def goal(**fields):
    base = {
        "name": "x",
        "query": "other query",
        "product_category": "Toys › Games",
        "attributes": ["long lasting"],
        "goal_options": {},
        "price_upper": 40.0,
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # 1 of 5 goal nouns found: 0.2 is not > 0.2, so only the query match keeps r_type at 1.
        ({"name": "lumina a b c d", "query": "hair extensions"}, (1.0, True, False, 0.2)),
        # Category paths share 'Beauty & Personal Care' and 'Hair Care': two parts.
        (
            {"name": "lumina a b c d", "product_category": "Beauty & Personal Care › Hair Care › Wigs"},
            (1.0, False, True, 0.2),
        ),
        # One shared part only, no query match, title 0.2: 0.5.
        (
            {"name": "lumina a b c d", "product_category": "Beauty & Personal Care › Skin Care"},
            (0.5, False, False, 0.2),
        ),
        # Title alone above 0.2 (1 of 3).
        ({"name": "lumina a b"}, (1.0, False, False, 1 / 3)),
        # Under 0.1 of the nouns (1 of 11): 0.1 even with a query match.
        ({"name": "lumina a b c d e f g h i j", "query": "hair extensions"}, (0.1, True, False, 1 / 11)),
        # No noun in common: 0 even with query and category matches.
        (
            {"name": "a b", "query": "hair extensions", "product_category": PRODUCT["product_category"]},
            (0.0, True, True, 0.0),
        ),
        # A goal name without nouns scores title 0.2.
        ({"name": "", "query": "hair extensions"}, (1.0, True, False, 0.2)),
    ],
)
def test_type_reward_paths(fields, expected):
    info = get_type_reward(PRODUCT, goal(**fields), words)
    assert (info["r_type"], info["query_match"], info["category_match"]) == expected[:3]
    assert info["title_score"] == pytest.approx(expected[3])


def test_title_score_counts_repeated_goal_nouns():
    # Goal nouns [hair, hair, clip]: the set overlap is {hair, clip} = 2, divided by 3 listed nouns.
    assert get_type_reward(PRODUCT, goal(name="hair hair clip"), words)["title_score"] == pytest.approx(2 / 3)


def test_attribute_reward_fuzzy_then_substring():
    # 'long lasting' fuzzy-equals an attribute; 'natural look' vs 'natural looking' scores 88.9 > 85; 'human hair'
    # matches no attribute but is in the bullet points; 'real human' is in the bullets too; 'waterproof' nowhere.
    assert similarity("natural looking", "natural look") == pytest.approx(2 * 12 / 27 * 100)
    the_goal = goal(attributes=["long lasting", "natural look", "human hair", "waterproof", "easy to style"])
    assert get_attribute_reward(PRODUCT, the_goal) == (pytest.approx(4 / 5), 4)


def test_attribute_substring_is_case_insensitive_on_product_text_only():
    assert get_attribute_reward(PRODUCT, goal(attributes=["Ten clips"]))[1] == 0
    assert get_attribute_reward(PRODUCT, goal(attributes=["ten clips"]))[1] == 1


def test_colour_normalisation_and_its_conflation():
    assert normalize_color("dark navy blue") == "blue"  # 'blue' precedes 'navy' alphabetically
    assert normalize_color("light grey") == "grey"
    assert normalize_color("x-large") == "x-large"
    # A tuple is searched by element: only an exact colour value is normalised.
    assert normalize_color(("color", "black")) == "black"
    assert normalize_color(("color", "jet black")) == ("color", "jet black")
    # Human-goal list: 'navy blue' and 'royal blue' both become 'blue' and match.
    assert get_option_reward(["royal blue"], ["navy blue"]) == (1.0, 1)


def test_synthetic_options_compare_as_stringified_pairs():
    # ('size', 'large') is compared as "('size', 'large')" -> tokens {size, large}; 'x-large' -> {x, large}:
    # the best of 'large' vs 'large x' (83.3) is not above 85, so no match. 'medium' is a subset: 100.
    assert similarity("x-large", ("size", "large")) == pytest.approx(100 * (1 - 2 / 12))
    assert get_option_reward(["x-large"], [("size", "large")]) == (0.0, 0)
    assert get_option_reward(["medium"], [("size", "medium")]) == (1.0, 1)
    # 'jet black' -> 'black' and ('color', 'black') -> 'black'.
    assert get_option_reward(["jet black"], [("color", "black")]) == (1.0, 1)
    assert get_option_reward([], []) == (None, 0)


def test_total_score_with_price_under_and_over():
    the_goal = goal(
        name="hair extension",
        query="hair extensions",
        attributes=["long lasting", "human hair", "waterproof"],
        goal_options={"color": "black", "size": "large"},
        price_upper=40.0,
    )
    chosen = {"color": "jet black", "size": "x-large"}
    # (2 attributes + 1 option + price ok) / (3 + 2 + 1), r_type 1.
    score, info = get_reward(PRODUCT, the_goal, 30.0, chosen, words)
    assert score == pytest.approx(4 / 6)
    assert info["r_price"] is True and info["r_att"] == pytest.approx(2 / 3) and info["r_option"] == 0.5
    score, info = get_reward(PRODUCT, the_goal, 40.01, chosen, words)
    assert score == pytest.approx(3 / 6) and info["r_price"] is False
    # r_type 0.5 scales the same sum: no query or category match and 1 of 5 goal nouns (0.2, not above 0.2).
    half = {**the_goal, "query": "wigs", "product_category": "Toys", "name": "hair a b c d"}
    assert get_reward(PRODUCT, half, 30.0, chosen, words)[0] == pytest.approx(0.5 * 4 / 6)


def test_human_goal_options_are_a_list():
    the_goal = goal(name="hair extension", attributes=["long lasting"], goal_options=["black", "16 inch"])
    score, info = get_reward(PRODUCT, the_goal, 10.0, {"color": "black", "length": "16 inch"}, words)
    assert score == 1.0 and info["num_option_matches"] == 2


def test_fallback_nouns_drop_function_words_and_numbers():
    assert fallback_nouns("The 2 Pack of Large Soft Cotton T-Shirts for Men") == ["cotton", "shirts", "men"]


def test_colour_vocabulary_is_the_originals_102_words_in_order():
    assert len(COLOR_WORDS) == 102 and list(COLOR_WORDS) == sorted(COLOR_WORDS)
    assert {"dark", "light", "royal", "christmas", "skull"} <= set(COLOR_WORDS)
    assert COLOR_WORDS[:3] == ("alabaster", "apricot", "aqua") and COLOR_WORDS[-2:] == ("wine", "yellow")


@pytest.mark.parametrize(
    ("chosen", "wanted", "normalised", "expected"),
    [
        # 'dark' precedes 'grey', 'grey' precedes 'light': 'dark' vs 'grey' scores 25, no match.
        ("dark grey", "light grey", ("dark", "grey"), (0.0, 0)),
        # Both become 'dark' ('green' vs 'grey', were 'dark' not in the vocabulary, would score 67: no match).
        ("dark green", "dark grey", ("dark", "dark"), (1.0, 1)),
        # 'light' precedes 'pink': 'light' vs 'pink' scores 22, no match.
        ("light pink", "pink", ("light", "pink"), (0.0, 0)),
    ],
)
def test_colour_cases_of_the_original_vocabulary(chosen, wanted, normalised, expected):
    assert (normalize_color(chosen), normalize_color(wanted)) == normalised
    assert get_option_reward([chosen], [wanted]) == expected


def test_fuzzy_score_is_rounded_before_the_85_threshold():
    # Common tokens "cushions foam memory" (20 chars), left over 'pillow' (6) and 'compact' (7): the best ratio is
    # 2 * 20 / (20 + 27) = 85.106 (rapidfuzz, unrounded, says more than 85), rounded 85: not above 85.
    a, b = "memory foam cushions pillow", "memory foam cushions compact"
    assert similarity(a, b) == pytest.approx(100 * 40 / 47)
    assert fuzzy_score(a, b) == 85 and not fuzzy_match(a, b)
    assert get_option_reward([a], [b]) == (0.0, 0)
    # 'mats' vs 'mat': no common token, 2 * 3 / 7 = 85.714, rounded 86: a match.
    assert fuzzy_score("mats", "mat") == 86 and get_option_reward(["mats"], ["mat"]) == (1.0, 1)
    # "ergonomic office" (16) + 'seat' vs + 'chair': 2 * 16 / (16 + 21) = 86.486 -> 86.
    assert fuzzy_score("ergonomic office seat", "ergonomic office chair") == 86


def test_non_ascii_options_lose_only_characters_128_to_255():
    # U+2013 (en dash) is kept as a non-word character, so it separates words: 's m' vs 's m' scores 100.
    assert fuzzy_score("s\u2013m", "s-m") == 100 and get_option_reward(["s\u2013m"], ["s-m"]) == (1.0, 1)
    # U+00A0 (no-break space) is deleted: 'sm' vs 'm s' (sorted tokens), 2 * 1 / 5 = 40.
    assert fuzzy_score("s\u00a0m", "s m") == 40 and get_option_reward(["s\u00a0m"], ["s m"]) == (0.0, 0)
    # Letters above 255 stay: equal CJK values match; one common character of 2 + 2: 50.
    assert get_option_reward(["\u9ed1\u8272"], ["\u9ed1\u8272"]) == (1.0, 1)
    assert fuzzy_score("\u9ed1\u8272", "\u767d\u8272") == 50
    # 'e' with acute (U+00E9) is deleted: 'caf' vs 'cafe', 2 * 3 / 7 = 85.714 -> 86.
    assert fuzzy_score("caf\u00e9", "cafe") == 86


def test_chosen_standard_becomes_tan_and_misses_a_synthetic_style_standard_goal():
    # 'tan' is a substring of 'standard', so the chosen 'standard' becomes 'tan'; the synthetic goal's pair
    # ('style', 'standard') has no element equal to a vocabulary word and stays a pair. 'tan' vs 'standard
    # style' shares no token: 2 * 3 / (3 + 14) = 35, no match. 'navy blue' -> 'blue' is a token of
    # "('color', 'navy blue')": 100. So (1 attribute + 1 option + price) / (1 + 2 + 1) = 0.75.
    assert normalize_color("standard") == "tan"
    assert fuzzy_score("tan", ("style", "standard")) == 35
    chosen = {"color": "navy blue", "style": "standard"}
    synthetic = goal(name="hair extension", query="hair extensions", goal_options=dict(chosen))
    score, info = get_reward(PRODUCT, synthetic, 30.0, chosen, words)
    assert score == pytest.approx(3 / 4) and info["r_option"] == 0.5 and info["num_option_matches"] == 1
    # A human goal's list is normalised the same way on both sides ('blue', 'tan'): both match.
    human = {**synthetic, "goal_options": ["navy blue", "standard"]}
    assert get_reward(PRODUCT, human, 30.0, chosen, words)[0] == 1.0
