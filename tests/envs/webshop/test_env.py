"""The environment on the bundled catalogue: protocol, pages and clickables, a scripted purchase, errors."""

from __future__ import annotations

import string

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.protocol import INFO_KEYS, check_info
from envs.spaces import TextSpace
from envs.webshop import WebShopEnv
from envs.webshop.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return WebShopEnv({"split": "test", "seed": 1})


def buy_goal_product(env: WebShopEnv, task_id: int, skip_options: bool = False):
    obs, info = env.reset(options={"task_id": task_id})
    goal = env.goal(task_id)
    title = env.shop.catalogue.by_asin[goal["asin"]]["Title"]
    obs, reward, terminated, truncated, info = env.step(f"search[{title}]")
    assert f"click[{goal['asin'].lower()}]" in info["admissible_actions"]
    env.step(f"click[{goal['asin'].lower()}]")
    if not skip_options:
        for value in goal["goal_options"].values():
            assert not env.step(f"click[{value}]")[4]["invalid_action"]
    return env.step("click[buy now]")


def test_envs_searching_on_threads_see_what_they_see_one_after_another():
    """Per-episode rollouts step a runner's sub-envs on a thread pool, all searching one shared index."""
    from concurrent.futures import ThreadPoolExecutor

    def play(threaded: bool) -> list:
        envs = [WebShopEnv({"split": "test"}) for _ in range(4)]
        actions = []
        for i, env in enumerate(envs):
            env.reset(options={"task_id": i})
            title = env.shop.catalogue.by_asin[env.goal(i)["asin"]]["Title"]
            actions.append([f"search[{title}]", "click[next >]", "click[< prev]", "click[back to search]"])
        step = lambda pair: pair[0].step(pair[1])  # noqa: E731
        trace = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            for t in range(4):
                todo = [(env, a[t]) for env, a in zip(envs, actions, strict=True)]
                outs = list(pool.map(step, todo)) if threaded else [step(pair) for pair in todo]
                trace.append([(o[0], o[1], tuple(o[4]["admissible_actions"])) for o in outs])
        return trace

    assert play(threaded=True) == play(threaded=False)


def test_protocol_on_reset(env):
    obs, info = env.reset(options={"task_id": 0})
    assert isinstance(env.observation_space, TextSpace) and env.observation_space.contains(obs)
    check_info(info, (*INFO_KEYS, "available_actions"))
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith(" [SEP] Search")
    assert info["task"] == env.goal(0)["instruction_text"] and info["task_id"] == 0
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["task_type"] in {"beauty", "electronics", "fashion", "food", "furniture"}
    assert info["state_key"] == obs and info["won"] is False


def test_scripted_purchases_score_one(env):
    for task_id in range(8):
        obs, reward, terminated, truncated, info = buy_goal_product(env, task_id)
        assert (reward, terminated, truncated, info["won"], info["task_score"]) == (
            10.0,
            True,
            False,
            True,
            1.0,
        )
        assert info["reward_breakdown"]["r_type"] == 1.0 and info["page"] == "done"


def test_page_transitions_and_clickables(env):
    env.reset(options={"task_id": 2})
    goal = env.goal(2)
    _, _, _, _, info = env.step("search[black]")
    clickables = info["available_actions"]["clickables"]
    assert info["page"] == "results" and clickables[:2] == ["back to search", "next >"]
    assert len(clickables) == 12 and info["admissible_actions"][0] == "click[back to search]"
    page1 = info["state_key"]
    obs, _, _, _, info = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in obs and goal["instruction_text"] in obs
    assert info["available_actions"]["clickables"][:3] == ["back to search", "< prev", "next >"]
    asin = info["available_actions"]["clickables"][3]
    assert env.step("click[< prev]")[4]["state_key"] == page1
    page2 = env.step("click[next >]")[4]["state_key"]
    obs, _, _, _, info = env.step(f"click[{asin}]")
    product = env.shop.catalogue.by_asin[asin.upper()]
    assert info["page"] == "item" and product["Title"] in obs and obs.endswith("Buy Now")
    values = [v for vs in product["options"].values() for v in vs]
    assert info["available_actions"]["clickables"] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
        *values,
    ]
    assert (
        not info["available_actions"]["has_search_bar"]
        and "search[<your query>]" not in info["admissible_actions"]
    )
    item_key = info["state_key"]
    obs, _, _, _, info = env.step("click[features]")
    assert info["page"] == "item_sub" and product["BulletPoints"][0].strip() in obs
    assert info["available_actions"]["clickables"] == ["back to search", "< prev"]
    assert env.step("click[buy now]")[4]["invalid_action"]  # not a clickable on a sub page
    assert env.step("click[< prev]")[4]["state_key"] == item_key
    assert env.step("click[< prev]")[4]["state_key"] == page2
    info = env.step("click[back to search]")[4]
    assert info["page"] == "search" and info["admissible_actions"] == ["search[<your query>]"]
    # search[...] works from any page, here from an item page.
    env.step("search[black]")
    env.step(f"click[{asin}]")
    assert env.step("search[black]")[4]["state_key"] == page1


def select_an_option(env: WebShopEnv):
    """(info before, info after) clicking a goal option on the goal's item page."""
    task_id = next(i for i in range(env.num_tasks) if env.goal(i)["goal_options"])
    env.reset(options={"task_id": task_id})
    goal = env.goal(task_id)
    env.step(f"search[{goal['name']}]")
    obs, _, _, _, info = env.step(f"click[{goal['asin'].lower()}]")
    value = next(iter(goal["goal_options"].values()))
    obs2, _, _, _, info2 = env.step(f"click[{value}]")
    assert obs2 == obs  # a selection does not show in the page text
    return value, (obs, info), (obs2, info2)


def test_default_state_key_is_the_page_text_as_the_gigpo_reference_groups(env):
    _, (obs, info), (obs2, info2) = select_an_option(env)
    assert info["state_key"] == obs and info2["state_key"] == obs2 == info["state_key"]


def test_state_key_page_and_options_adds_the_selected_options():
    env = WebShopEnv({"split": "test", "state_key": "page_and_options"})
    value, (obs, info), (_, info2) = select_an_option(env)
    assert info["state_key"] == obs  # nothing selected yet
    assert info2["state_key"] != info["state_key"] and value in info2["state_key"]


def test_malformed_actions_do_nothing_and_are_counted():
    env = WebShopEnv({"split": "test", "max_steps": 6})
    obs, info = env.reset(options={"task_id": 1})
    count = env.invalid_action_count
    for action in ["buy it", "click[buy now]", "search[]", "click[search]", "jump[x]", 42]:
        obs2, reward, terminated, truncated, info = env.step(action)
        assert obs2 == obs and reward == 0.0 and not terminated and info["invalid_action"]
    assert env.invalid_action_count == count + 6 and info["invalid_action_count"] == 6
    assert truncated  # the sixth step reached max_steps
    with pytest.raises(RuntimeError, match="reset"):
        env.step("search[x]")
    env.reset(options={"task_id": 1})
    assert env.step("nonsense")[4]["invalid_action_count"] == 1 and env.invalid_action_count == count + 7


def test_buying_the_wrong_product_scores_below_one_and_reward_mode_score():
    env = WebShopEnv({"split": "test", "reward_mode": "score"})
    env.reset(options={"task_id": 0})
    goal = env.goal(0)
    info = env.step(f"search[{goal['name']}]")[4]
    other = next(c for c in info["available_actions"]["clickables"][2:] if c != goal["asin"].lower())
    env.step(f"click[{other}]")
    _, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and not info["won"] and reward == info["task_score"] < 1.0
    assert set(info["reward_breakdown"]) >= {
        "r_type",
        "r_att",
        "r_option",
        "r_price",
        "title_score",
        "query_match",
        "category_match",
        "noun_extractor",
    }


def test_reset_without_task_id_is_seeded_and_envs_are_independent():
    a, b = WebShopEnv({"split": "train", "seed": 7}), WebShopEnv({"split": "train", "seed": 7})
    drawn = [a.reset()[1]["task_id"] for _ in range(5)]
    assert drawn == [b.reset()[1]["task_id"] for _ in range(5)]
    assert [a.reset(seed=3)[1]["task_id"] for _ in range(2)] == [
        b.reset(seed=3)[1]["task_id"] for _ in range(2)
    ]
    a.reset(options={"task_id": 0})
    b.reset(options={"task_id": 1})
    a.step("search[chair]")
    assert b.step("click[back to search]")[4]["invalid_action"] and a.num_tasks == b.num_tasks > 0


def test_splits_partition_the_goals():
    sizes = {s: WebShopEnv({"split": s}).num_tasks for s in ("test", "eval", "train")}
    env = WebShopEnv({"split": "test"})
    assert sum(sizes.values()) == len(env.shop.goals) and sizes["test"] < sizes["eval"] < sizes["train"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"colour": 1}, "unknown config key"),
        ({"split": "dev"}, "split must be one of"),
        ({"max_steps": 0}, "max_steps"),
        ({"reward_mode": "shaped"}, "reward_mode"),
        ({"split_scheme": "verl"}, "split_scheme must be one of"),
        ({"split": "test", "split_scheme": "gigpo"}, r"split must be one of \['eval', 'train'\]"),
        ({"state_key": "options"}, "state_key must be one of"),
    ],
)
def test_bad_config_names_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        WebShopEnv(config)


def test_bad_task_id_and_missing_data_dir(env, tmp_path):
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": env.num_tasks})
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        WebShopEnv({"data_dir": str(tmp_path)})


def test_prompt_templates_use_the_protocol_fields():
    def fields(template):
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}

    later = {"task", "step", "current_step", "history_length", "history", "observation", "admissible_actions"}
    assert fields(PROMPT_TEMPLATE) == later
    assert fields(FIRST_PROMPT_TEMPLATE) == later - {"history", "history_length", "step", "current_step"}
    for template in (PROMPT_TEMPLATE, FIRST_PROMPT_TEMPLATE):
        assert "<think>" in template and "<action>" in template
    from envs.webshop.prompts import CONSTRAINED_FIRST_PROMPT_TEMPLATE, CONSTRAINED_PROMPT_TEMPLATE

    assert fields(CONSTRAINED_PROMPT_TEMPLATE) == later
    for template in (CONSTRAINED_PROMPT_TEMPLATE, CONSTRAINED_FIRST_PROMPT_TEMPLATE):
        assert "<think>" not in template and "<action>" not in template


def test_strip_instruction_shows_the_page_after_the_instruction():
    env = WebShopEnv({"split": "test", "strip_instruction": True})
    obs, info = env.reset(options={"task_id": 0})
    assert obs == "Search" and info["task"] in info["state_key"]
    obs, _, _, _, info = env.step("search[black]")
    assert obs.startswith("Back to Search [SEP] Page 1") and info["state_key"].endswith(obs)


@settings(max_examples=60, deadline=None)
@given(action=st.text(max_size=40) | st.builds(lambda a: f"click[{a}]", st.text(max_size=12)))
def test_any_text_action_is_handled(action):
    """Malformed model output is an invalid action, never a crash."""
    env = WebShopEnv({"split": "test"})
    obs, _ = env.reset(options={"task_id": 5})
    obs2, reward, terminated, _, info = env.step(action)
    assert isinstance(obs2, str) and isinstance(info["invalid_action"], bool)
    if info["invalid_action"]:
        assert obs2 == obs and reward == 0.0 and not terminated


def test_human_goal_purchase_scores_one():
    env = WebShopEnv({"split": "train", "human_goals": True})
    assert all(isinstance(env.goal(i)["goal_options"], list) for i in range(env.num_tasks))
    task_id = next(i for i in range(env.num_tasks) if env.goal(i)["goal_options"])
    env.reset(options={"task_id": task_id})
    goal = env.goal(task_id)
    env.step(f"search[{goal['name']}]")
    info = env.step(f"click[{goal['asin'].lower()}]")[4]
    for value in goal["goal_options"]:
        # Human options are written as people typed them ('black/white'); the page shows 'black | white'.
        shown = value.replace("/", " | ")
        assert f"click[{shown}]" in info["admissible_actions"]
        env.step(f"click[{shown}]")
    _, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and info["task_score"] == 1.0 and reward == 10.0


def test_gymnasium_env_checker_passes():
    check_env(WebShopEnv({"split": "test"}), skip_render_check=True)
