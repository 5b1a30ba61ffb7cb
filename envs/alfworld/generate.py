"""Generate ALFWorld-style games offline from the scene data shipped in the alfworld wheel.

Each game is a floor plan (receptacles and poses from the wheel's layouts), objects placed by ALFRED's
receptacle/object constraints, a goal from ALFWorld's goal library, and a walkthrough found by the PDDL planner under
a time limit (games the planner cannot solve in time are dropped). The walkthrough is replayed on the engine before
the game is written, so every written game is known to be winnable. Output uses ALFWorld's layout
(``<root>/<split>/<task>-<obj>-None-<recep>-<scene>/trial_*/{game.tw-pddl, traj_data.json}``); the game file stores
the problem and walkthrough and leaves the domain and grammar to be read from the wheel at load time.

    python -m envs.alfworld.generate --out envs/alfworld/data --seed 0
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import random
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from envs.alfworld.games import full_game_data
from envs.alfworld.scenes import Scene, load_scene, scene_numbers
from envs.alfworld.tasks import TASK_TYPES, TaskSpec

__all__ = [
    "ObjectInstance",
    "GameSpec",
    "sample_game",
    "problem_text",
    "solve",
    "split_scenes",
    "generate_split",
    "more_train_games",
    "main",
]

log = logging.getLogger(__name__)

# How the bundled games (``envs/alfworld/data``) were generated: the seed and the scene size limit fix which scenes
# are train scenes and which are held out.
BUNDLED_SEED = 0
BUNDLED_MAX_RECEPTACLES = 20

LAMPS = ("DeskLamp", "FloorLamp")
LAMP_SURFACES = ("Desk", "SideTable", "Dresser", "CoffeeTable", "DiningTable", "TVStand", "Shelf")
# Types the domain's actions name as constants: the problem must declare them.
DOMAIN_TYPE_CONSTANTS = {"otype": ("Knife", "ButterKnife"), "rtype": ("SinkBasin", "Microwave", "Fridge")}
APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
ROOMS = {
    "pick_and_place_simple": {"Kitchen", "LivingRoom", "Bathroom", "Bedroom"},
    "pick_two_obj_and_place": {"Kitchen", "LivingRoom", "Bathroom", "Bedroom"},
    "look_at_obj_in_light": {"LivingRoom", "Bedroom"},
    "pick_clean_then_place_in_recep": {"Kitchen", "Bathroom"},
    "pick_heat_then_place_in_recep": {"Kitchen"},
    "pick_cool_then_place_in_recep": {"Kitchen"},
}


def mangle(thor_id: str) -> str:
    """ALFRED's PDDL-safe spelling of a THOR id (the inverse of ALFWorld's demangler)."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in thor_id)


@dataclass(frozen=True)
class ObjectInstance:
    id: str  # THOR-style id, e.g. "Apple|3"
    type: str
    receptacle: str  # THOR id of the receptacle it starts in


@dataclass(frozen=True)
class GameSpec:
    scene: Scene
    task: TaskSpec
    objects: tuple[ObjectInstance, ...]
    start: str  # agent start location, a free floor point
    task_desc: str


def _pickupable_types() -> set[str]:
    from alfworld.gen import constants

    static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
    placeable = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
    return {t for t in placeable if "Sliced" not in t and t not in static and t in constants.OBJECTS_SET}


def _holders(scene: Scene, otype: str) -> list[str]:
    from alfworld.gen import constants

    return [r.id for r in scene.receptacles if otype in constants.VAL_RECEPTACLE_OBJECTS.get(r.type, ())]


def _sample_task(scene: Scene, task_type: str, rng: random.Random) -> TaskSpec | None:
    from alfworld.gen import constants

    if scene.room not in ROOMS[task_type]:
        return None
    rtypes = scene.receptacle_types()
    candidates = sorted(t for t in scene.object_types & _pickupable_types() if _holders(scene, t))
    if task_type == "look_at_obj_in_light":
        lamps = [lamp for lamp in LAMPS if lamp in scene.object_types]
        if not lamps or not (rtypes & set(LAMP_SURFACES)) or not candidates:
            return None
        return TaskSpec(task_type, rng.choice(candidates), toggle=rng.choice(lamps))
    appliance = APPLIANCE.get(task_type)
    if appliance is not None:
        if appliance[0] not in rtypes:
            return None
        candidates = [t for t in candidates if t in constants.VAL_ACTION_OBJECTS[appliance[1]]]
    rng.shuffle(candidates)
    for obj in candidates:
        goals = sorted(
            r
            for r in rtypes
            if obj in constants.VAL_RECEPTACLE_OBJECTS.get(r, ()) and (appliance is None or r != appliance[0])
        )
        # The object must be able to start somewhere other than the goal receptacle type.
        goals = [
            g for g in goals if any(h.split("|")[0] != g and not h.endswith(g) for h in _holders(scene, obj))
        ]
        if goals:
            return TaskSpec(task_type, obj, recep=rng.choice(goals))
    return None


def _start_point(scene: Scene, rng: random.Random) -> str:
    taken = {tuple(r.location.split("|")[1:3]) for r in scene.receptacles}
    free = [p for p in scene.free_points if (str(p[0]), str(p[1])) not in taken]
    gx, gz = rng.choice(free or list(scene.free_points))
    return f"loc|{gx}|{gz}|{rng.randrange(4)}|30"


def sample_game(
    scene: Scene, task_type: str, rng: random.Random, max_distractor_types: int = 8
) -> GameSpec | None:
    """Draw a goal, the objects and the start point for one game in ``scene``; None if the scene cannot host it."""
    task = _sample_task(scene, task_type, rng)
    if task is None:
        return None
    by_id = {r.id: r for r in scene.receptacles}
    appliance = APPLIANCE.get(task_type, ("",))[0]

    def allowed(otype: str, rid: str) -> bool:
        # Targets start away from the goal receptacle and the appliance.
        return not (otype == task.obj and by_id[rid].type in (task.recep, appliance))

    others = sorted(scene.object_types & _pickupable_types() - {task.obj})
    others = [t for t in others if _holders(scene, t)]
    types = [task.obj] + rng.sample(others, min(len(others), max_distractor_types))
    objects: list[ObjectInstance] = []
    for otype in types:
        holders = [h for h in _holders(scene, otype) if allowed(otype, h)]
        if not holders:
            if otype == task.obj:
                return None
            continue
        low = 2 if (otype == task.obj and task_type == "pick_two_obj_and_place") else 1
        for _ in range(rng.randint(low, max(low, 3 if otype == task.obj else 2))):
            objects.append(ObjectInstance(f"{otype}|{len(objects) + 1}", otype, rng.choice(holders)))
    surfaces = [r.id for r in scene.receptacles if r.type in LAMP_SURFACES]
    for lamp in LAMPS:
        if lamp in scene.object_types and surfaces:
            # Lamps are in no receptacle list of ALFRED's; they stand on a desk-like surface.
            objects.append(ObjectInstance(f"{lamp}|{len(objects) + 1}", lamp, rng.choice(surfaces)))
    if task.toggle and not any(o.type == task.toggle for o in objects):
        return None
    template = rng.choice(task.templates())
    return GameSpec(scene, task, tuple(objects), _start_point(scene, rng), task.describe(template))


def problem_text(game: GameSpec, name: str) -> str:
    """The PDDL problem in ALFRED's vocabulary (the predicates of the wheel's alfred.pddl)."""
    from alfworld.gen import constants

    scene, task = game.scene, game.task
    rec_loc = {r.id: r.location for r in scene.receptacles}
    otypes = sorted({o.type for o in game.objects} | {task.obj} | set(DOMAIN_TYPE_CONSTANTS["otype"]))
    rtypes = sorted(scene.receptacle_types() | ({task.recep} - {""}) | set(DOMAIN_TYPE_CONSTANTS["rtype"]))
    locations = sorted({r.location for r in scene.receptacles} | {game.start})

    objs = ["agent1 - agent"]
    objs += [f"{t}Type - otype" for t in otypes]
    objs += [f"{t}Type - rtype" for t in rtypes]
    objs += [f"{mangle(o.id)} - object" for o in game.objects]
    objs += [f"{mangle(r.id)} - receptacle" for r in scene.receptacles]
    objs += [f"{mangle(loc)} - location" for loc in locations]

    init = ["(= (total-cost) 0)", f"(atLocation agent1 {mangle(game.start)})"]
    for r in scene.receptacles:
        rid = mangle(r.id)
        init.append(f"(receptacleType {rid} {r.type}Type)")
        init.append(f"(receptacleAtLocation {rid} {mangle(r.location)})")
        if r.type in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid})")
    for rtype in sorted(scene.receptacle_types()):
        for otype in otypes:
            if otype in constants.VAL_RECEPTACLE_OBJECTS.get(rtype, ()):
                init.append(f"(canContain {rtype}Type {otype}Type)")
    actions = constants.VAL_ACTION_OBJECTS
    for o in game.objects:
        oid = mangle(o.id)
        init.append(f"(objectType {oid} {o.type}Type)")
        init.append(f"(inReceptacle {oid} {mangle(o.receptacle)})")
        init.append(f"(objectAtLocation {oid} {mangle(rec_loc[o.receptacle])})")
        if o.type in LAMPS:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        if o.type in constants.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {oid})")
        for prop, kind in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable")):
            if o.type in actions[kind]:
                init.append(f"({prop} {oid})")

    body = "\n        ".join
    return (
        f"(define (problem {name})\n    (:domain alfred)\n    (:objects\n        {body(objs)}\n    )\n"
        f"    (:init\n        {body(init)}\n    )\n{task.goal_pddl().strip()}\n"
    )


def traj_data(game: GameSpec, trial: str) -> dict:
    """The fields of ALFRED's traj_data.json that ALFWorld's loader reads, plus the templated goal text."""
    return {
        "task_type": game.task.task_type,
        "task_id": trial,
        "pddl_params": game.task.pddl_params(),
        "scene": {"floor_plan": f"FloorPlan{game.scene.number}", "scene_num": game.scene.number},
        "task_desc": game.task_desc,
        "turk_annotations": {"anns": [{"task_desc": game.task_desc}]},
    }


def _solve_in_child(game_data: dict, conn) -> None:
    try:
        conn.send(_plan_and_replay(game_data))
    except Exception as err:  # reported to the parent, which drops the game
        conn.send(f"error: {type(err).__name__}: {err}")
    finally:
        conn.close()


def _plan_and_replay(game_data: dict) -> list[str] | str:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    env = AlfredDemangler(
        PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=True))
    )
    env.load(game_data)
    state = env.reset()
    plan = list(state["policy_commands"] or [])
    if not plan:
        return "error: the planner found no plan"
    for command in plan:
        if command not in state["admissible_commands"]:
            return f"error: planned command {command!r} is not admissible"
        state, _, _ = env.step(command)
    return plan if state["won"] else "error: the walkthrough does not win"


def solve(game_data: dict, time_limit: float) -> list[str] | str:
    """Walkthrough of a game by the planner in a child process killed after ``time_limit`` s; a str says why not."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_solve_in_child, args=(game_data, child), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(time_limit):
            return parent.recv()
        return f"error: planner time limit {time_limit:.0f}s exceeded"
    except EOFError:
        return "error: planner process died"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()


def split_scenes(seed: int, max_receptacles: int, eval_fraction: float = 0.25) -> dict[str, list[int]]:
    """Small scenes of each room type, a seeded ``eval_fraction`` of them held out (disjoint train/eval scenes)."""
    rng = random.Random(f"split-{seed}")
    out: dict[str, list[int]] = {"train": [], "valid_unseen": []}
    by_room: dict[str, list[int]] = {}
    for n in scene_numbers():
        scene = load_scene(n)
        if len(scene.receptacles) <= max_receptacles:
            by_room.setdefault(scene.room, []).append(n)
    for room in sorted(by_room):
        numbers = sorted(by_room[room])
        rng.shuffle(numbers)
        k = max(1, round(len(numbers) * eval_fraction))
        out["valid_unseen"] += sorted(numbers[:k])
        out["train"] += sorted(numbers[k:])
    return {k: sorted(v) for k, v in out.items()}


def generate_split(
    out_dir: Path,
    scenes: Iterable[int],
    per_type: int,
    seed: int,
    task_types: Iterable[str] = TASK_TYPES,
    time_limit: float = 20.0,
    max_attempts: int = 50,
) -> dict[str, int]:
    """Write ``per_type`` solvable games of each task type into ``out_dir``; returns the count per task type."""
    scenes = sorted(scenes)
    counts: dict[str, int] = {}
    for task_type in task_types:
        rng = random.Random(f"{seed}-{task_type}")
        hosts = [n for n in scenes if load_scene(n).room in ROOMS[task_type]]
        made = attempts = 0
        while made < per_type and attempts < per_type * max_attempts and hosts:
            attempts += 1
            scene = load_scene(hosts[attempts % len(hosts)])  # round-robin over the scenes
            game = sample_game(scene, task_type, rng)
            if game is None:
                continue
            trial = f"trial_s{seed}_{task_type[:4]}_{attempts:04d}"
            folder = out_dir / game.task.folder_name(scene.number) / trial
            data = traj_data(game, trial)
            compact = {"pddl_problem": problem_text(game, trial), "solvable": None, "walkthrough": None}
            result = solve(full_game_data(compact, data), time_limit)
            if isinstance(result, str):
                log.info("dropped %s: %s", folder, result)
                continue
            compact.update(solvable=True, walkthrough=result)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "traj_data.json").write_text(json.dumps(data, indent=1, sort_keys=True))
            (folder / "game.tw-pddl").write_text(json.dumps(compact, sort_keys=True))
            made += 1
            log.info("wrote %s (%d steps)", folder, len(result))
        if made < per_type:
            log.warning("only %d of %d %s games after %d attempts", made, per_type, task_type, attempts)
        counts[task_type] = made
    return counts


def more_train_games(
    out_dir: Path, per_type: int, task_types: Iterable[str] = TASK_TYPES, time_limit: float = 20.0
) -> dict[str, int]:
    """``per_type`` train games of each task type into ``out_dir/train``, from the bundled games' train scenes and
    seed: a type's first games are its bundled ones (the seed draws them in the same order), and no game is set in
    a scene of the bundled ``valid_unseen``."""
    scenes = split_scenes(BUNDLED_SEED, BUNDLED_MAX_RECEPTACLES)["train"]
    return generate_split(Path(out_dir) / "train", scenes, per_type, BUNDLED_SEED, task_types, time_limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="root folder; splits are written under it")
    parser.add_argument("--seed", type=int, default=BUNDLED_SEED)
    parser.add_argument("--train-per-type", type=int, default=22)
    parser.add_argument("--eval-per-type", type=int, default=7)
    parser.add_argument(
        "--splits", nargs="+", default=["train", "valid_unseen"], choices=["train", "valid_unseen"]
    )
    parser.add_argument("--task-types", nargs="+", default=list(TASK_TYPES), choices=list(TASK_TYPES))
    parser.add_argument(
        "--max-receptacles", type=int, default=BUNDLED_MAX_RECEPTACLES, help="keep scenes at most this large"
    )
    parser.add_argument("--time-limit", type=float, default=20.0, help="planner seconds per game")
    parser.add_argument("--overwrite", action="store_true", help="remove existing split folders first")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    scenes = split_scenes(args.seed, args.max_receptacles)
    for split in args.splits:
        target = args.out / split
        if args.overwrite and target.exists():
            shutil.rmtree(target)
        per_type = args.train_per_type if split == "train" else args.eval_per_type
        counts = generate_split(target, scenes[split], per_type, args.seed, args.task_types, args.time_limit)
        print(f"{split}: scenes {scenes[split]}; games {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
