import pytest

from envs.alfworld.tasks import TaskSpec, task_type_from_path


def test_task_type_from_alfworld_paths():
    path = "/data/json_2.1.1/valid_seen/pick_two_obj_and_place-Pen-None-Drawer-324/trial_T2019/game.tw-pddl"
    assert task_type_from_path(path) == "pick_two_obj_and_place"
    assert task_type_from_path("/data/other/game.tw-pddl") is None


def test_folder_names_follow_alfworld():
    assert TaskSpec("pick_and_place_simple", "Apple", recep="Fridge").folder_name(7) == (
        "pick_and_place_simple-Apple-None-Fridge-7"
    )
    look = TaskSpec("look_at_obj_in_light", "Book", toggle="DeskLamp")
    assert look.folder_name(301) == "look_at_obj_in_light-Book-None-DeskLamp-301"
    assert look.describe("examine the {obj} with the {toggle}") == "examine the book with the desklamp"


def test_unknown_task_type_is_named():
    with pytest.raises(ValueError, match="pick_and_place_with_movable_recep"):
        TaskSpec("pick_and_place_with_movable_recep", "Apple")
