"""The ``rllib`` command: ``rllib train file <file>`` with the semantics of RLlib's former CLI, plus the
project's evaluate, plot and export commands.

    rllib train file tuned_examples/gagpo_alfworld.py --stop '{"training_iteration": 50}'
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


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
        "--checkpoint-freq", type=int, default=0, help="checkpoint every N iterations (0: only at end)"
    )
    p.add_argument(
        "--checkpoint-at-end",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="checkpoint when done",
    )
    p.add_argument(
        "--storage-path", default=None, help="where results and checkpoints go (default ./results)"
    )
    p.add_argument("--name", default=None, help="experiment name (a folder under the storage path)")
    p.add_argument(
        "--num-env-runners", type=int, default=None, help="override the file's number of env runners"
    )
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray instance")
    p.add_argument("--restore", default=None, help="start from this Algorithm checkpoint")
    p.add_argument("--resume", default=None, help="continue this interrupted experiment folder")
    p.add_argument("--dashboard", action="store_true", help="serve the Ray dashboard on 127.0.0.1:8265")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rllib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_file(sub)
    _add_plot(sub)
    return parser


def run_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gagpo_rllib.plots import plot_runs

    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).name, item
        runs[label] = path
    print(f"wrote {plot_runs(runs, args.out)}")
    return 0


def run_train_file(args: argparse.Namespace) -> int:
    from gagpo_rllib.train import load_train_file, train

    spec = load_train_file(args.file)
    config = spec.config
    if args.num_env_runners is not None:
        config = config.copy(copy_frozen=False).env_runners(num_env_runners=args.num_env_runners)
    stop = args.stop if args.stop is not None else spec.stop
    results = train(
        config,
        stop=stop,
        storage_path=args.storage_path,
        name=args.name,
        checkpoint_freq=args.checkpoint_freq,
        checkpoint_at_end=args.checkpoint_at_end,
        restore=args.restore,
        resume=args.resume,
        num_cpus=args.num_cpus,
        dashboard=args.dashboard,
        verbose=args.verbose,
    )
    return 1 if results.errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train_file(args)
    if args.command == "plot":
        return run_plot(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
