"""The ``rllib`` command: ``rllib train file <file>`` with the semantics of RLlib's former CLI, plus the
project's evaluate, plot and export commands.

    rllib train file tuned_examples/gagpo_alfworld.py --stop '{"training_iteration": 50}'
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from gagpo_rllib.rllib.fields import FIELD

__all__ = ["main", "build_parser"]


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(
            f"--stop must be a JSON object, e.g. '{{\"training_iteration\": 10}}': {err}"
        ) from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--stop must be a JSON object of metric -> threshold")
    return value


def _add_train_file(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train an algorithm")
    train_sub = train.add_subparsers(dest="train_mode", required=True)
    p = train_sub.add_parser(
        "file",
        help="train the `config` defined in a Python file (optionally with its `stop`)",
        description="Train the AlgorithmConfig named `config` in FILE under Ray Tune. FILE may define `stop` "
        "(a dict of metric -> threshold); --stop overrides it.",
    )
    p.add_argument("file", help="Python file defining `config` (and optionally `stop`)")
    p.add_argument(
        "--stop",
        type=_json_dict,
        default=None,
        help="JSON stop criteria, e.g. '{\"training_iteration\": 20}'",
    )
    p.add_argument(
        "--plateau",
        type=int,
        default=None,
        help="also stop when success has not risen for N iterations (default: the file's PLATEAU_PATIENCE, "
        "else never)",
    )
    p.add_argument(
        "--checkpoint-freq", type=int, default=0, help="checkpoint every N iterations (0: only at end)"
    )
    p.add_argument(
        "--checkpoint-at-end",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="checkpoint when done",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=None,
        help="keep only the N most recent checkpoints, plus the best as best_checkpoint in the trial folder"
        " (default 2; 0: keep all)",
    )
    p.add_argument(
        "--keep-best-by",
        default=None,
        help="the result metric (flattened name, e.g. evaluation/env_runners/gagpo/success_rate) that picks the"
        " best checkpoint (default: the success rate)",
    )
    p.add_argument(
        "--storage-path",
        "--storage",
        dest="storage_path",
        default=None,
        help="where results and checkpoints go: a folder (default ./results) or a URI Tune supports (s3://, "
        "gs://, ...); on several nodes a folder every node mounts",
    )
    p.add_argument(
        "--shared-storage",
        action="store_true",
        help="the storage folder is a mount every node shares (otherwise told by its file system type)",
    )
    p.add_argument("--name", default=None, help="experiment name (a folder under the storage path)")
    p.add_argument(
        "--num-env-runners", type=int, default=None, help="override the file's number of env runners"
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs for the local Ray instance (ignored with a note when RAY_ADDRESS names a running cluster)",
    )
    p.add_argument(
        "--listen-all",
        action="store_true",
        help="a Ray started here listens on every interface (default: 127.0.0.1 only)",
    )
    p.add_argument("--restore", default=None, help="start from this Algorithm checkpoint")
    p.add_argument("--resume", default=None, help="continue this interrupted experiment folder")
    p.add_argument(
        "--max-failures",
        type=int,
        default=0,
        help="restart a failed trial up to N times from its last checkpoint (default 0: a failed trial stays "
        "failed; -1: without limit); use with --checkpoint-freq",
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the Ray dashboard on 127.0.0.1:8265 and publish the GAGPO metrics as Ray metrics",
    )
    p.add_argument("-v", "--verbose", type=int, default=0, choices=[0, 1, 2, 3], help="Tune's verbosity")


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="learning curves of one or more runs as a PNG",
        description="Plot success, score, episode length, KL and grouping diagnostics vs iteration. Each RUN is "
        "a Tune trial or experiment folder (or its progress.csv), optionally as LABEL=PATH.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--out", default="learning_curves.png", help="output PNG (default learning_curves.png)")


def _add_env_options(p: argparse.ArgumentParser, env_help: str, file_sets: str) -> None:
    """--env, --file and --env-config: where a command's env (and its config) come from."""
    p.add_argument("--env", default=None, help=env_help)
    p.add_argument("--file", default=None, help=f"tuned-example file whose `config` sets {file_sets}")
    p.add_argument(
        "--env-config", type=_json_object, default=None, help="JSON env_config (merged into the config's)"
    )


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate a checkpoint or an untrained model; print the Table-1 row, write CSV and JSON",
        description="Play SOURCE on an evaluation split at a temperature and print the papers' Table-1 layout "
        "(ALFWorld: Pick, Look, Clean, Heat, Cool, Pick2, All; WebShop: score, success; other envs: success per "
        "task type and All), then write eval_table.csv, eval_episodes.csv and eval.json. SOURCE is an Algorithm "
        "checkpoint folder (its own config) or a model folder / hub id (the untrained prompting baseline; give "
        "--env or --file).",
    )
    p.add_argument("source", help="checkpoint folder, or a model folder / hub id")
    _add_env_options(p, "maze, alfworld, webshop or package.module:Class", "env and decoding")
    p.add_argument("--split", default=None, help="evaluation split (default: the env's: valid_unseen, eval)")
    p.add_argument("--temperature", type=float, default=0.4, help="sampling temperature (default 0.4)")
    p.add_argument("--num-tasks", type=int, default=None, help="tasks to play (default: the whole split)")
    p.add_argument("--episodes-per-task", type=int, default=1, help="episodes per task (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the task draw and of sampling")
    p.add_argument("--batch-size", type=int, default=None, help="sub-envs per env runner (default 16)")
    p.add_argument("--num-env-runners", type=int, default=None, help="override the config's env runners")
    p.add_argument("--max-steps", type=int, default=None, help="override the env's step limit")
    p.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="constrained decoding (default: the config's; off for a bare model)",
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation limit per turn")
    p.add_argument("--backend", choices=FIELD["backend"].choices, default=None, help="generation backend")
    p.add_argument("--dtype", choices=FIELD["dtype"].choices, default=None, help="model dtype")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray instance")
    p.add_argument("--out", default="eval_results", help="folder for the CSV and JSON (default eval_results)")
    p.add_argument(
        "--dump-steps",
        default=None,
        metavar="FILE",
        help="write every step as a JSON line: prompt, raw output, parsed action or invalid reason, reward",
    )
    p.add_argument(
        "--system-prompt",
        default=None,
        help="system message of every prompt (default: the config's; else the chat template's own)",
    )


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint's policy as a Hugging Face model folder",
        description="Write the policy of CHECKPOINT to OUT_DIR as a Hugging Face model folder (config.json, "
        "model.safetensors, tokenizer, generation_config.json) that transformers and vLLM load.",
    )
    p.add_argument("checkpoint", help="Algorithm checkpoint folder (or its rl_module/default_policy folder)")
    p.add_argument("out_dir", help="output folder")
    p.add_argument("--base-model", default=None, help="the run's starting model, if it has moved")
    p.add_argument("--dtype", choices=FIELD["dtype"].choices, default=None, help="saved dtype")
    p.add_argument(
        "--adapter-dir", default=None, help="LoRA runs: also write the adapters here (peft's format)"
    )


def _add_sft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sft",
        help="warm start: fine-tune a causal LM on demonstrations, write a model folder to start GAGPO from",
        description="Fine-tune MODEL on demonstrations replayed through the env (ALFWorld: the games' walkthroughs; "
        "WebShop: scripted purchases of each goal's target product), with the prompts, history and (constrained) "
        "softmax of training, and write OUT_DIR, a model folder for GAGPOConfig.llm(model_path=...). Prints a "
        "progress line with the held-out loss per epoch.",
    )
    p.add_argument("model", help="base model folder or hub id")
    p.add_argument("out_dir", help="output model folder")
    _add_env_options(p, "alfworld or webshop (or give --file)", "env, prompts, decoding")
    p.add_argument("--data-dir", default=None, help="ALFWorld data folder (default: the bundled games)")
    p.add_argument("--split", default="train", help="split whose demonstrations to use (default train)")
    p.add_argument(
        "--num-tasks", type=int, default=None, help="tasks to use, drawn from --seed (default all)"
    )
    p.add_argument("--epochs", type=int, default=30, help="epochs (default 30)")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    p.add_argument("--batch-size", type=int, default=16, help="steps per update (default 16)")
    p.add_argument("--heldout", type=float, default=0.1, help="share of episodes held out (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the task draw, held-out split and shuffling")
    p.add_argument("--history-length", type=int, default=None, help="history pairs (default: config's or 2)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="prompt budget (default: config's)")
    p.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="softmax over the admissible actions' tokens (default: the config's constrained_decoding)",
    )
    p.add_argument("--temperature", type=float, default=None, help="softmax temperature (default: config's)")
    p.add_argument("--dtype", choices=FIELD["dtype"].choices, default="float32", help="model dtype")
    p.add_argument(
        "--think",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="free-form targets put a short reason in <think> before <action> (default on)",
    )
    p.add_argument(
        "--system-prompt", default=None, help="system message of every prompt (default: the config's)"
    )
    p.add_argument(
        "--max-train-steps",
        type=int,
        default=None,
        help="train on at most N demonstrated steps (default all)",
    )
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads (default: torch's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rllib", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_file(sub)
    _add_evaluate(sub)
    _add_plot(sub)
    _add_export(sub)
    _add_sft(sub)
    return parser


def run_evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gagpo_rllib.rllib.checkpoints import config_from_checkpoint, is_checkpoint
    from gagpo_rllib.rllib.config import configure
    from gagpo_rllib.rllib.evaluation import EvalSettings, config_for_model, evaluate
    from gagpo_rllib.tools.env_names import resolve_env
    from gagpo_rllib.tools.train import init_ray, load_train_file

    env = resolve_env(args.env) if args.env else None
    base = load_train_file(args.file).config if args.file else None
    checkpoint = args.source if is_checkpoint(args.source) else None
    source = Path(args.source).expanduser()
    looks_local = source.exists() or args.source.startswith(("/", ".", "~")) or args.source.count("/") > 1
    if checkpoint is None and looks_local and not (source / "config.json").is_file():
        raise FileNotFoundError(
            f"evaluate: {args.source} is neither an Algorithm checkpoint (rllib_checkpoint.json) nor a model "
            "folder (config.json)"
        )
    decoding = {
        name: value
        for name, value in (
            ("constrained_decoding", args.constrained),
            ("max_new_tokens", args.max_new_tokens),
            ("backend", args.backend),
            ("dtype", args.dtype),
            ("system_prompt", args.system_prompt),
        )
        if value is not None
    }
    if checkpoint is not None:
        config = config_from_checkpoint(checkpoint)
        if env is not None:
            config.environment(env, env_config=dict(args.env_config or {}))
        configure(config, **decoding)
    else:
        decoding.setdefault("constrained_decoding", bool(base.constrained_decoding) if base else False)
        config = config_for_model(args.source, env, base=base, env_config=args.env_config, **decoding)
    if args.env_config is not None and env is None:
        config.environment(env_config={**dict(config.env_config or {}), **args.env_config})
    settings = EvalSettings(
        split=args.split,
        temperature=args.temperature,
        num_tasks=args.num_tasks,
        episodes_per_task=args.episodes_per_task,
        seed=args.seed,
        batch_size=args.batch_size,
        num_env_runners=args.num_env_runners,
        max_steps=args.max_steps,
    )
    init_ray(num_cpus=args.num_cpus)
    report = evaluate(config, settings, checkpoint=checkpoint, source=args.source, dump_steps=args.dump_steps)
    print(report.header())
    print(report.format_table())
    for kind, path in report.write(args.out).items():
        print(f"{kind}: {path}")
    if args.dump_steps is not None:
        print(f"steps: {args.dump_steps}")
    return 0


def run_sft(args: argparse.Namespace) -> int:
    from gagpo_rllib.rllib.config import GAGPOConfig
    from gagpo_rllib.tools.demonstrations import demonstrations_for
    from gagpo_rllib.tools.env_names import resolve_env
    from gagpo_rllib.tools.sft import SFTSettings, finetune
    from gagpo_rllib.tools.train import load_train_file

    if (args.env is None) == (args.file is None):
        raise ValueError("sft: give exactly one of --env or --file")
    config = load_train_file(args.file).config if args.file else GAGPOConfig()
    if args.env is not None:
        config = config.copy(copy_frozen=False).environment(resolve_env(args.env), env_config={})
    env = config.env
    if not isinstance(env, type):
        raise ValueError(f"sft: the config's env must be a class, got {env!r}")
    env_config = {**dict(config.env_config or {}), **dict(args.env_config or {}), "split": args.split}
    if args.data_dir is not None:
        env_config["data_dir"] = args.data_dir
    constrained = bool(config.constrained_decoding) if args.constrained is None else args.constrained
    # The prompts RL builds with this config (templates, history, budget, system prompt), unless overridden.
    prompt = config.prompt_settings(constrained=constrained)
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    settings = SFTSettings(
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        heldout_fraction=args.heldout,
        seed=args.seed,
        history_length=prompt["history_length"] if args.history_length is None else args.history_length,
        max_prompt_tokens=prompt["max_prompt_tokens"]
        if args.max_prompt_tokens is None
        else args.max_prompt_tokens,
        constrained=constrained,
        temperature=config.temperature if args.temperature is None else args.temperature,
        dtype=args.dtype,
        think=args.think,
        system_prompt=prompt["system_prompt"] if args.system_prompt is None else args.system_prompt,
        max_train_steps=args.max_train_steps,
    )
    demos = demonstrations_for(env, env_config, num_tasks=args.num_tasks, seed=args.seed)
    print(
        f"demonstrations: {len(demos.demonstrations)} episodes, {demos.num_steps} steps from {env.__name__} "
        f"split {args.split!r}" + (f"; skipped {demos.skipped}" if demos.skipped else ""),
        flush=True,
    )
    result = finetune(
        args.model,
        demos,
        args.out_dir,
        first_template=prompt["first_template"],
        template=prompt["template"],
        settings=settings,
        progress=lambda line: print(line, flush=True),
    )
    print(f"wrote {result.out_dir}: start GAGPO from it with .llm(model_path={result.out_dir!r})")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from gagpo_rllib.tools.export import export_checkpoint

    out = export_checkpoint(
        args.checkpoint,
        args.out_dir,
        base_model=args.base_model,
        dtype=args.dtype,
        adapter_dir=args.adapter_dir,
    )
    print(f"exported to {out}")
    for path in sorted(out.iterdir()):
        print(f"  {path.name}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gagpo_rllib.tools.plots import plot_runs

    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).name, item
        runs[label] = path
    print(f"wrote {plot_runs(runs, args.out)}")
    return 0


def run_train_file(args: argparse.Namespace) -> int:
    from gagpo_rllib.tools.train import load_train_file, train

    spec = load_train_file(args.file)
    config = spec.config
    if args.num_env_runners is not None:
        config = config.copy(copy_frozen=False).env_runners(num_env_runners=args.num_env_runners)
    stop = args.stop if args.stop is not None else spec.stop
    plateau = args.plateau if args.plateau is not None else spec.plateau_patience
    results = train(
        config,
        stop=stop,
        plateau_patience=plateau or None,
        storage_path=args.storage_path,
        name=args.name,
        checkpoint_freq=args.checkpoint_freq,
        checkpoint_at_end=args.checkpoint_at_end,
        **({} if args.keep_checkpoints is None else {"keep_checkpoints": args.keep_checkpoints or None}),
        keep_best_by=args.keep_best_by,
        restore=args.restore,
        resume=args.resume,
        max_failures=args.max_failures,
        num_cpus=args.num_cpus,
        dashboard=args.dashboard,
        verbose=args.verbose,
        shared_storage=args.shared_storage,
        listen_all=args.listen_all,
    )
    return 1 if results.errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train_file(args)
    if args.command == "plot":
        return run_plot(args)
    if args.command == "evaluate":
        return run_evaluate(args)
    if args.command == "export":
        return run_export(args)
    if args.command == "sft":
        return run_sft(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
