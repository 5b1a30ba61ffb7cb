"""Scenes built from the layout data shipped in the alfworld wheel (one AI2-THOR floor plan each).

A scene lists its static receptacles with an interaction pose (``FloorPlanN-openable.json``), the object types that
occur in it (``FloorPlanN-objects.json``) and the free floor points the agent may start on (``FloorPlanN-layout.npy``).
Receptacle types that occur in the scene but have no pose get one instance at a seeded free point.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import cache

import numpy as np

from envs.alfworld.wheel import layouts_dir

__all__ = ["Receptacle", "Scene", "room_type", "scene_numbers", "load_scene", "pose_location"]

GRID = 0.25  # metres per grid step, as in ALFRED's location ids


@dataclass(frozen=True)
class Receptacle:
    id: str  # THOR-style id, e.g. "Cabinet|+00.68|+00.50|-02.20" (mangled for PDDL by the problem writer)
    type: str  # e.g. "Cabinet", "SinkBasin"
    location: str  # e.g. "loc|4|-5|2|30": the pose the agent stands at to interact with it


@dataclass(frozen=True)
class Scene:
    number: int
    room: str
    receptacles: tuple[Receptacle, ...]
    object_types: frozenset[str]
    free_points: tuple[tuple[int, int], ...]  # grid coordinates of reachable floor points

    def receptacle_types(self) -> set[str]:
        return {r.type for r in self.receptacles}


def room_type(number: int) -> str:
    """AI2-THOR numbering: 1-30 kitchens, 201-230 living rooms, 301-330 bedrooms, 401-430 bathrooms."""
    for base, name in ((400, "Bathroom"), (300, "Bedroom"), (200, "LivingRoom"), (0, "Kitchen")):
        if base < number <= base + 30:
            return name
    raise ValueError(f"scene number {number} is not an AI2-THOR floor plan")


def scene_numbers() -> list[int]:
    """All floor plans whose layout files ship in the wheel."""
    found = {
        int(m.group(1))
        for p in layouts_dir().glob("FloorPlan*-openable.json")
        if (m := re.match(r"FloorPlan(\d+)-openable\.json$", p.name))
    }
    return sorted(found)


def _receptacle_type(thor_id: str) -> str:
    parts = thor_id.split("|")
    # Sinks and bathtubs are stored as "Sink|x|y|z|SinkBasin": the basin is the receptacle.
    return parts[-1] if len(parts) == 5 else parts[0]


def pose_location(x: float, z: float, rotation: float, horizon: float) -> str:
    return f"loc|{round(x / GRID)}|{round(z / GRID)}|{round(rotation / 90) % 4}|{round(horizon)}"


def _unique_location(loc: str, taken: set[str]) -> str:
    """Receptacles sharing a pose get distinct locations (one receptacle per location keeps 'go to X' simple)."""
    head, horizon = loc.rsplit("|", 1)
    h = int(horizon)
    while loc in taken:
        h += 1
        loc = f"{head}|{h}"
    return loc


@cache
def load_scene(number: int, seed: int = 0) -> Scene:
    """Read one floor plan; ``seed`` only places receptacle types that have no pose in the wheel's data."""
    from alfworld.gen import constants

    base = layouts_dir() / f"FloorPlan{number}"
    try:
        poses = json.loads((base.parent / f"{base.name}-openable.json").read_text())
        object_types = frozenset(json.loads((base.parent / f"{base.name}-objects.json").read_text()))
        points = np.load(base.parent / f"{base.name}-layout.npy")
    except FileNotFoundError as err:
        raise ValueError(f"no layout data for scene {number}: {err.filename}") from err

    static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
    taken: set[str] = set()
    receptacles = []
    for thor_id, (x, z, rot, hor) in sorted(poses.items()):
        rtype = _receptacle_type(thor_id)
        if rtype not in static:
            continue
        loc = _unique_location(pose_location(x, z, rot, hor), taken)
        taken.add(loc)
        receptacles.append(Receptacle(thor_id, rtype, loc))

    grid_points = tuple(sorted({(round(px / GRID), round(pz / GRID)) for px, pz in points.tolist()}))
    rng = random.Random(f"scene-{number}-{seed}")
    present = {r.type for r in receptacles}
    for rtype in sorted(object_types & static - present):
        gx, gz = rng.choice(grid_points)
        thor_id = f"{rtype}|{gx * GRID:+06.2f}|+00.00|{gz * GRID:+06.2f}"
        loc = _unique_location(f"loc|{gx}|{gz}|{rng.randrange(4)}|30", taken)
        taken.add(loc)
        receptacles.append(Receptacle(thor_id, rtype, loc))

    return Scene(number, room_type(number), tuple(receptacles), object_types, grid_points)
