"""Demonstrations replayed through the real envs: ALFWorld walkthroughs and WebShop scripted purchases."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest

from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.tasks import TASK_TYPES
from gagpo_rllib.tools.demonstrations import (
    SEARCH_TEMPLATE,
    alfworld_demonstrations,
    demonstration_texts,
    demonstrations_for,
    webshop_demonstrations,
)

TRAIN_GAMES = find_games(BUNDLED_DATA, "train").games
ONE_PER_TYPE = [next(i for i, g in enumerate(TRAIN_GAMES) if g.task_type == t) for t in TASK_TYPES]


@pytest.fixture(scope="module", autouse=True)
def alfworld_data(tmp_path_factory: pytest.TempPathFactory):
    """alfworld's import creates $ALFWORLD_DATA: point it at a temporary folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALFWORLD_DATA", str(tmp_path_factory.mktemp("alfworld_data")))
        yield


def check_replays_to_a_win(demo, env) -> None:
    """Play the recorded actions in a fresh episode: every one admissible, the last one wins."""
    obs, info = env.reset(options={"task_id": demo.task_id})
    for step in demo.steps:
        assert step.observation == obs and tuple(info["admissible_actions"]) == step.admissible
        assert step.action in info["admissible_actions"]
        obs, reward, terminated, truncated, info = env.step(step.action)
    assert terminated and info["won"] and reward > 0 and not truncated


def test_walkthroughs_of_each_task_type_become_winning_demonstrations() -> None:
    from envs.alfworld import AlfworldEnv

    demo_set = alfworld_demonstrations({"split": "train"}, ONE_PER_TYPE)
    assert demo_set.skipped == {} and len(demo_set.demonstrations) == len(TASK_TYPES)
    assert {d.task_type for d in demo_set.demonstrations} == set(TASK_TYPES)
    env = AlfworldEnv({"split": "train"})
    for demo in demo_set.demonstrations:
        walkthrough = json.loads(Path(TRAIN_GAMES[demo.task_id].game_file).read_text())["walkthrough"]
        assert [s.action for s in demo.steps] == walkthrough and demo.won
        for k, step in enumerate(demo.steps):
            assert step.step == k
            # The history holds every earlier (observation, action) pair, as the prompt connector sees them.
            assert step.history == tuple((s.observation, s.action) for s in demo.steps[:k])
        check_replays_to_a_win(demo, env)
    texts = demonstration_texts(demo_set.demonstrations)
    assert demo_set.demonstrations[0].steps[0].task in texts
    assert all(a in texts for d in demo_set.demonstrations for s in d.steps for a in s.admissible)


def test_every_bundled_train_walkthrough_replays_to_a_win() -> None:
    from envs.alfworld import AlfworldEnv

    demo_set = alfworld_demonstrations({"split": "train"})
    assert demo_set.skipped == {}
    assert sorted(d.task_id for d in demo_set.demonstrations) == list(range(len(TRAIN_GAMES)))
    env = AlfworldEnv({"split": "train"})
    for demo in demo_set.demonstrations:
        check_replays_to_a_win(demo, env)


def _copy_game(src_index: int, root: Path, walkthrough: list[str]) -> None:
    src = Path(TRAIN_GAMES[src_index].game_file).parent
    dst = root / "train" / src.relative_to(BUNDLED_DATA / "train")
    shutil.copytree(src, dst)
    game = json.loads((dst / "game.tw-pddl").read_text())
    game["walkthrough"] = walkthrough
    (dst / "game.tw-pddl").write_text(json.dumps(game))


EXPERT_CONFIG = {"split": "train", "task_types": ["look_at_obj_in_light", "pick_and_place_simple"]}
EXPERT_IDS = list(range(6))


@functools.cache
def expert_demonstrations(expert: str):
    """The ``expert``'s episodes of the first games of two task types, checked to win with admissible commands."""
    from envs.alfworld import AlfworldEnv

    demos = alfworld_demonstrations(EXPERT_CONFIG, EXPERT_IDS, expert=expert)
    assert demos.skipped == {} and [d.task_id for d in demos.demonstrations] == EXPERT_IDS
    env = AlfworldEnv(EXPERT_CONFIG)
    for demo in demos.demonstrations:
        check_replays_to_a_win(demo, env)
    return demos


def test_handcoded_expert_searches_and_wins_reproducibly() -> None:
    """ALFWorld's hand-coded expert plays from what it sees: it wins, every command is admissible, the same seed
    gives the same episodes, and it looks in places the walkthrough (which knows where the object is) skips."""
    expert = expert_demonstrations("handcoded")
    again = alfworld_demonstrations(EXPERT_CONFIG, EXPERT_IDS, expert="handcoded")
    assert again.demonstrations == expert.demonstrations
    walkthrough = alfworld_demonstrations(EXPERT_CONFIG, EXPERT_IDS)
    assert sum(len(d.steps) for d in expert.demonstrations) > sum(
        len(d.steps) for d in walkthrough.demonstrations
    )
    with pytest.raises(ValueError, match="expert must be one of"):
        alfworld_demonstrations(EXPERT_CONFIG, EXPERT_IDS, expert="oracle")


def _search_ranks(demo) -> list[int]:
    """Where each receptacle the episode goes to before its first take stands in the first step's ``go to`` list."""
    listed = [a for a in demo.steps[0].admissible if a.startswith("go to ")]
    ranks = []
    for step in demo.steps:
        if step.action.startswith("take "):
            break
        if step.action.startswith("go to "):
            ranks.append(listed.index(step.action))
    return ranks


def test_sweep_expert_searches_in_the_listed_order() -> None:
    """The "sweep" expert wins the same games with admissible commands, and searches the receptacles in the order
    the admissible list shows them (the hand-coded expert's own order does not)."""
    sweep = expert_demonstrations("sweep")
    for demo in sweep.demonstrations:
        ranks = _search_ranks(demo)
        assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks), ranks
    assert sum(len(_search_ranks(d)) for d in sweep.demonstrations) >= 2 * len(EXPERT_IDS)
    handcoded = expert_demonstrations("handcoded")
    assert any(_search_ranks(d) != sorted(_search_ranks(d)) for d in handcoded.demonstrations)


def test_broken_walkthroughs_are_counted_not_kept(tmp_path: Path) -> None:
    first, second, third = ONE_PER_TYPE[:3]
    walk = [json.loads(Path(TRAIN_GAMES[i].game_file).read_text())["walkthrough"] for i in (first, second)]
    _copy_game(first, tmp_path, ["fly to the moon", *walk[0]])
    _copy_game(second, tmp_path, walk[1][:-1])
    _copy_game(third, tmp_path, [])
    demo_set = alfworld_demonstrations({"data_dir": str(tmp_path), "split": "train"})
    assert demo_set.demonstrations == []
    assert demo_set.skipped == {
        "walkthrough command not admissible": 1,
        "walkthrough does not win": 1,
        "no walkthrough": 1,
    }


def test_webshop_scripted_purchases_buy_the_target_with_its_options() -> None:
    from envs.webshop import WebShopEnv

    config = {"split": "train", "strip_instruction": True}
    demo_set = webshop_demonstrations(config, num_tasks=4, seed=3)
    assert demo_set.skipped == {} and len(demo_set.demonstrations) == 4
    env = WebShopEnv(config)
    for demo in demo_set.demonstrations:
        goal = env.goal(demo.task_id)
        actions = [s.action for s in demo.steps]
        assert actions[0] == f"search[{goal['query']}]" and actions[-1] == "click[buy now]"
        assert f"click[{goal['asin'].lower()}]" in actions
        assert {f"click[{v}]" for v in goal["goal_options"].values()} <= set(actions)
        assert demo.won
        # The typed search stands in for the env's template, so each action is one of its step's actions.
        assert all(s.action in s.admissible and SEARCH_TEMPLATE not in s.admissible for s in demo.steps)
        # The prompt lists what the env listed: the template, never the answer to copy.
        first = demo.steps[0]
        assert SEARCH_TEMPLATE in first.prompt_actions and first.action not in first.prompt_actions
        assert all(s.prompt_actions == s.admissible for s in demo.steps[1:])
    assert webshop_demonstrations(config, num_tasks=4, seed=3).demonstrations == demo_set.demonstrations


def test_webshop_scripted_purchases_type_the_full_goal_prefix_search() -> None:
    """Under search_grammar 'goal_prefix' the script types the longest offered search, an admissible one."""
    config = {"split": "train", "strip_instruction": True, "search_grammar": "goal_prefix"}
    demo_set = webshop_demonstrations(config, num_tasks=4, seed=3)
    assert demo_set.skipped == {} and len(demo_set.demonstrations) == 4
    for demo in demo_set.demonstrations:
        first = demo.steps[0]
        searches = [a for a in first.admissible if a.startswith("search[")]
        assert first.action == searches[-1] and len(searches) > 1 and demo.won
        assert all(s.action in s.admissible for s in demo.steps)


def test_task_selection_and_unknown_envs_are_named() -> None:
    with pytest.raises(ValueError, match="not both"):
        webshop_demonstrations(task_ids=[0], num_tasks=1)
    with pytest.raises(ValueError, match="task_ids"):
        webshop_demonstrations(task_ids=[10**6])
    with pytest.raises(ValueError, match="MazeEnv"):
        demonstrations_for("MazeEnv")
