"""ALFWorld's six task types, their short names in the paper's tables, and their goal specifications."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TASK_TYPES", "SHORT_NAMES", "TaskSpec", "task_type_from_path"]

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

SHORT_NAMES: dict[str, str] = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}


@dataclass(frozen=True)
class TaskSpec:
    """One goal: ALFRED's ``pddl_params`` (object, parent receptacle, toggle target) for a task type."""

    task_type: str
    obj: str
    recep: str = ""  # empty for look_at_obj_in_light
    toggle: str = ""  # only for look_at_obj_in_light

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"unknown task_type {self.task_type!r}; expected one of {TASK_TYPES}")

    def goal_pddl(self) -> str:
        """The goal section (with the closing parenthesis of the problem) from ALFWorld's goal library."""
        from alfworld.gen import goal_library

        text = goal_library.gdict[self.task_type]["pddl"].format(
            obj=self.obj, recep=self.recep, toggle=self.toggle
        )
        return text.replace("#", "-")

    def templates(self) -> list[str]:
        from alfworld.gen import goal_library

        return list(goal_library.gdict[self.task_type]["templates"])

    def describe(self, template: str) -> str:
        return template.format(obj=self.obj.lower(), recep=self.recep.lower(), toggle=self.toggle.lower())

    def pddl_params(self) -> dict:
        return {
            "object_target": self.obj,
            "parent_target": self.recep,
            "toggle_target": self.toggle,
            "mrecep_target": "",
            "object_sliced": False,
        }

    def folder_name(self, scene: int) -> str:
        """ALFWorld's ``<task>-<obj>-<mrecep>-<recep>-<scene>`` (look tasks name the lamp as the receptacle)."""
        parent = self.toggle if self.task_type == "look_at_obj_in_light" else self.recep
        return f"{self.task_type}-{self.obj}-None-{parent}-{scene}"


def task_type_from_path(path: str) -> str | None:
    """Task type from an ALFWorld game path, as the GiGPO reference reads it; None when the path names none."""
    for part in reversed(str(path).replace("\\", "/").split("/")):
        head = part.split("-", 1)[0]
        if head in TASK_TYPES:
            return head
    return None
