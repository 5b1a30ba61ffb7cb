import pytest

from envs.alfworld.metrics import SuccessByTaskType, success_by_task_type


def test_rates_per_short_name_and_all():
    infos = [
        {"task_type": "pick_and_place_simple", "won": True},
        {"task_type": "pick_and_place_simple", "won": False},
        {"task_type": "look_at_obj_in_light", "won": True},
        {"task_type": "pick_two_obj_and_place", "won": False},
    ]
    rates = success_by_task_type(infos)
    assert rates == {"Pick": 0.5, "Look": 1.0, "Pick2": 0.0, "All": 0.5}


def test_metrics_carry_episode_counts():
    table = SuccessByTaskType()
    for won in (True, True, False):
        table.add("pick_heat_then_place_in_recep", won)
    table.add("pick_cool_then_place_in_recep", True)
    m = table.metrics(prefix="eval/")
    assert m["eval/Heat"] == pytest.approx(2 / 3)
    assert m["eval/Cool"] == 1.0
    assert m["eval/Heat_episodes"] == 3.0
    assert m["eval/All"] == 0.75
    assert "eval/Clean" not in m


def test_bad_input_is_named():
    table = SuccessByTaskType()
    with pytest.raises(ValueError, match="pick_and_place_with_movable_recep"):
        table.add("pick_and_place_with_movable_recep", True)
    with pytest.raises(KeyError, match="won"):
        table.add_info({"task_type": "pick_and_place_simple"})


def test_empty_gives_no_rates():
    assert success_by_task_type([]) == {}
