"""search_grammar 'goal_prefix': concrete search commands over the goal's words for constrained decoding."""

from __future__ import annotations

import pytest

from envs.webshop import WebShopEnv
from envs.webshop.search_grammar import goal_search_commands, goal_search_words


def test_query_words_keep_order_and_drop_request_stop_and_price_words() -> None:
    text = "i am looking for a usb charger that is fast charging with color: silver, and price lower than 240.00 dollars"
    assert goal_search_words(text) == ["usb", "charger", "fast", "charging", "color", "silver"]
    assert goal_search_words("i need l'eau d'issey 6.76 fl oz, and price lower than 50.00 dollars") == [
        "l'eau",
        "d'issey",
        "6.76",
        "fl",
        "oz",
    ]
    assert goal_search_words(text, max_words=2) == ["usb", "charger"]
    assert goal_search_commands(["usb", "charger"]) == ["search[usb]", "search[usb charger]"]


def test_the_search_page_offers_every_prefix_and_the_full_one_finds_the_product() -> None:
    env = WebShopEnv({"split": "train", "search_grammar": "goal_prefix", "max_search_words": 8})
    for task_id in range(12):
        _, info = env.reset(seed=0, options={"task_id": task_id})
        words = info["search_words"]
        assert 1 <= len(words) <= 8 and info["admissible_actions"] == goal_search_commands(words)
        assert "search[<your query>]" not in info["admissible_actions"]
        _, _, _, _, info = env.step(info["admissible_actions"][-1])
        assert info["page"] == "results" and not info["invalid_action"]
        # The goal's own words find its product on the first results page (bundled catalogue).
        assert f"click[{env.goal(task_id)['asin'].lower()}]" in info["admissible_actions"]
        _, _, _, _, info = env.step("click[back to search]")
        assert info["admissible_actions"] == goal_search_commands(words)  # offered again on the search page


def test_placeholder_stays_the_default() -> None:
    _, info = WebShopEnv({"split": "train"}).reset(seed=0, options={"task_id": 0})
    assert info["admissible_actions"] == ["search[<your query>]"] and info["search_words"]


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [("search_grammar", "bag", "search_grammar must be one of"), ("max_search_words", 0, "max_search_words")],
)
def test_bad_grammar_settings_name_the_key(key: str, value, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WebShopEnv({key: value})
