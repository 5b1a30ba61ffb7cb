"""Evaluate a trained checkpoint or an untrained model on an evaluation split, in the papers' Table-1 layout.

The episodes are played by GAGPO's own rollout path (``GAGPO.sample_groups`` on its EnvRunners, with
``explore=False`` so the module samples at ``eval_temperature``): evaluation and training share prompts, action
parsing and decoding. A checkpoint brings its own configuration; an untrained model (the prompting baseline) takes
the environment and decoding settings from the command line or from a tuned-example file.

Layouts: the env class declares its own (``eval_table``, see ``envs.protocol.EvalTable``): ALFWorld's success per
task type (Pick, Look, Clean, Heat, Cool, Pick2, All), WebShop's score (mean final ``task_score`` x 100) and
success, any other env success per ``task_type`` and All. All numbers are percentages.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ray.rllib.utils.metrics import EVALUATION_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from envs.protocol import GENERIC_TABLE, PROVENANCE, TASK_TYPE, WON, EvalTable, check_env_class, outcome
from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.checkpoints import MODULE_PATH
from gagpo_rllib.rllib.config import GAGPOConfig, configure
from gagpo_rllib.rllib.group_sampling import (
    ask_env_runner,
    evaluation_plan,
    sample_whole_groups,
    validation_seed,
)

__all__ = [
    "EpisodeRecord",
    "EvalReport",
    "EvalSettings",
    "StepDump",
    "invalid_reasons",
    "build_evaluator",
    "play",
    "config_for_model",
    "evaluate",
    "evaluation_plan",
    "summarise",
    "BackgroundValidation",
    "report_validation",
    "validation_function",
    "with_validation",
]

logger = logging.getLogger(__name__)

# Where an Algorithm checkpoint keeps the policy (RLlib's component path of the single module).


@dataclass
class EvalSettings:
    """What to evaluate on: split (None: the env class's eval_split), temperature, how many tasks and episodes."""

    split: str | None = None
    temperature: float = 0.4
    num_tasks: int | None = None
    episodes_per_task: int = 1
    seed: int = 0
    batch_size: int | None = None
    num_env_runners: int | None = None
    max_steps: int | None = None

    def validate(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"EvalSettings.temperature must be a number > 0, got {self.temperature!r}")
        if self.num_tasks is not None and self.num_tasks < 1:
            raise ValueError(f"EvalSettings.num_tasks must be None or >= 1, got {self.num_tasks!r}")
        if self.episodes_per_task < 1:
            raise ValueError(f"EvalSettings.episodes_per_task must be >= 1, got {self.episodes_per_task!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"EvalSettings.batch_size must be None or >= 1, got {self.batch_size!r}")
        if self.num_env_runners is not None and self.num_env_runners < 0:
            raise ValueError(f"EvalSettings.num_env_runners must be >= 0, got {self.num_env_runners!r}")


@dataclass
class EpisodeRecord:
    """One evaluation episode, from its final info."""

    task_id: int
    member: int
    task_type: str
    won: bool
    episode_return: float
    length: int
    invalid_share: float
    task_score: float | None = None
    # What the env played on (data, noun extractor, split), from its info["provenance"] when it reports one.
    provenance: str | None = None


@dataclass
class EvalReport:
    """Per-episode records and the table; ``layout`` is the env's ``eval_table.name`` ("alfworld", "webshop") or
    "generic"."""

    source: str
    env: str
    split: str
    temperature: float
    episodes: list[EpisodeRecord]
    layout: str = "generic"
    table: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    tasks_requested: int | None = None
    # Invalid steps by reason over all episodes (see gagpo_rllib.rllib.connectors.rollout), and the number of steps played.
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    num_steps: int = 0

    @classmethod
    def build(cls, episodes: list[EpisodeRecord], eval_table: EvalTable, **meta: Any) -> EvalReport:
        """The report of ``episodes`` in the layout of the env's ``eval_table`` (``check_env_class(env)``)."""
        layout, table = summarise(episodes, eval_table)
        return cls(episodes=episodes, layout=layout, table=table, **meta)

    @property
    def provenance(self) -> str:
        """The envs' own account of data, noun extractor and split ("" when the env reports none)."""
        return "; ".join(sorted({e.provenance for e in self.episodes if e.provenance}))

    def format_table(self) -> str:
        """A Markdown table of the headline numbers (percentages), as the papers print them."""
        names = list(self.table)
        cells = ["-" if math.isnan(self.table[n]) else f"{self.table[n]:.1f}" for n in names]
        widths = [max(len(n), len(c)) for n, c in zip(names, cells, strict=True)]

        def row(items: list[str]) -> str:
            return "| " + " | ".join(i.rjust(w) for i, w in zip(items, widths, strict=True)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([row(names), rule, row(cells), self.format_invalid()])

    def format_invalid(self) -> str:
        """One line: invalid steps out of all steps, and their reasons by count (most frequent first)."""
        total = sum(self.invalid_reasons.values())
        share = f" ({100.0 * total / self.num_steps:.1f}%)" if self.num_steps else ""
        reasons = ", ".join(
            f"{r} {n}" for r, n in sorted(self.invalid_reasons.items(), key=lambda x: (-x[1], x[0]))
        )
        return f"invalid steps: {total} of {self.num_steps}{share}" + (f": {reasons}" if reasons else "")

    def header(self) -> str:
        tasks = len({e.task_id for e in self.episodes})
        asked = ""
        if self.tasks_requested is not None and self.tasks_requested > tasks:
            asked = f" ({self.tasks_requested} asked: the split has only {tasks})"
        line = (
            f"{self.env} split {self.split!r}: {len(self.episodes)} episodes on {tasks} tasks{asked}, "
            f"temperature {self.temperature}, source {self.source}"
        )
        return f"{line}\n{self.provenance}" if self.provenance else line

    def write(self, out_dir: str | os.PathLike) -> dict[str, Path]:
        """Write eval_table.csv (one row), eval_episodes.csv and eval.json into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "source": self.source,
            "env": self.env,
            "split": self.split,
            "provenance": self.provenance,
            "temperature": self.temperature,
            "episodes": len(self.episodes),
        }
        invalid = {"steps": self.num_steps, "invalid_reasons": dict(self.invalid_reasons)}
        paths = {
            "table": out / "eval_table.csv",
            "episodes": out / "eval_episodes.csv",
            "json": out / "eval.json",
        }
        with open(paths["table"], "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*self.table, *meta])
            writer.writerow([*(round(v, 4) for v in self.table.values()), *meta.values()])
        with open(paths["episodes"], "w", newline="") as handle:
            names = list(asdict(self.episodes[0])) if self.episodes else list(EpisodeRecord.__annotations__)
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            writer.writerows(asdict(e) for e in self.episodes)
        payload = {
            **meta,
            "layout": self.layout,
            "table": {k: (None if math.isnan(v) else v) for k, v in self.table.items()},
            "seconds": self.seconds,
            **invalid,
            "per_episode": [asdict(e) for e in self.episodes],
        }
        paths["json"].write_text(json.dumps(payload, indent=1))
        return paths


def summarise(episodes: list[EpisodeRecord], eval_table: EvalTable) -> tuple[str, dict[str, float]]:
    """(layout, table): the Table-1 row of the env's ``eval_table``, in percent (NaN: no episode of a type).

    The generic row (success per task type and All) when the episodes do not fit the env's layout.
    """
    used, table = _summary(episodes, eval_table)
    return used.name, table


def _summary(episodes: list[EpisodeRecord], eval_table: EvalTable) -> tuple[EvalTable, dict[str, float]]:
    """(the layout used, its row): ``eval_table`` when the episodes fit it, else the generic one."""
    if not episodes:
        raise ValueError("no episodes to summarise")
    overall = 100.0 * float(np.mean([e.won for e in episodes]))
    columns = eval_table.task_type_columns
    types = {e.task_type for e in episodes}
    if columns and types <= set(columns):
        by_column: dict[str, list[bool]] = defaultdict(list)
        for e in episodes:
            by_column[columns[e.task_type]].append(e.won)
        table = {
            name: 100.0 * float(np.mean(by_column[name])) if by_column[name] else math.nan
            for name in eval_table.columns[:-1]
        }
        return eval_table, {**table, "All": overall}
    if eval_table.score and all(e.task_score is not None for e in episodes):
        score = 100.0 * float(np.mean([e.task_score for e in episodes]))
        return eval_table, {"score": score, "success": overall}
    by_type: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e.won)
    table = {name: 100.0 * float(np.mean(wins)) for name, wins in sorted(by_type.items())}
    return GENERIC_TABLE, {**table, "All": overall}


def record(episode: Any) -> EpisodeRecord:
    """An EpisodeRecord from a finished SingleAgentEpisode (its custom_data and final info)."""
    final = episode.get_infos(-1)
    end = outcome(final)
    invalid = [bool(x) for x in episode.get_extra_model_outputs(Columns.INVALID)]
    provenance = final.get(PROVENANCE)
    return EpisodeRecord(
        task_id=int(episode.custom_data[Columns.TASK_ID]),
        member=int(episode.custom_data[Columns.MEMBER]),
        task_type=end.task_type,
        won=end.won,
        episode_return=float(episode.get_return()),
        length=len(episode),
        invalid_share=float(np.mean(invalid)) if invalid else 0.0,
        task_score=end.task_score,
        provenance=None if provenance is None else str(provenance),
    )


# ----------------------------------------------------------------------------------------------- configs
def config_for_model(
    model_path: str,
    env: type | None = None,
    *,
    base: GAGPOConfig | None = None,
    env_config: dict[str, Any] | None = None,
    **gagpo: Any,
) -> GAGPOConfig:
    """A config that plays ``model_path`` untrained (the prompting baseline) on ``env`` or ``base``'s env."""
    if base is not None:
        config = base.copy(copy_frozen=False)
        if env is not None:
            config.environment(env, env_config=dict(env_config or {}))
    else:
        if env is None:
            raise ValueError("evaluating a model needs an env (--env) or a tuned-example file (--file)")
        config = GAGPOConfig().environment(env, env_config=dict(env_config or {}))
    return configure(config, model_path=str(model_path), **gagpo)


def _env_name(config: GAGPOConfig) -> str:
    return config.env.__name__ if isinstance(config.env, type) else str(config.env)


def evaluation_config(config: GAGPOConfig, settings: EvalSettings) -> GAGPOConfig:
    """``config`` set up for evaluation: the eval split, eval temperature, no reference model or critic, runners."""
    settings.validate()
    config = config.copy(copy_frozen=False)
    spec = check_env_class(config.env)
    split = spec.check_split(settings.split, "EvalSettings.split") if settings.split else spec.eval_split
    env_config = {**dict(config.env_config or {}), "split": split}
    if settings.max_steps is not None:
        env_config["max_steps"] = settings.max_steps
    config.environment(env_config=env_config)
    config.llm(eval_temperature=float(settings.temperature)).training(kl_coeff=0.0)
    # The PPO critic only trains: evaluation builds the plain policy (a checkpoint's critic weights are ignored).
    config.build_critic = False
    if settings.max_steps is not None:
        config.gagpo(max_steps=settings.max_steps)
    if settings.num_env_runners is not None:
        config.env_runners(num_env_runners=settings.num_env_runners)
    batch = settings.batch_size or 16
    if settings.num_tasks is not None:
        batch = min(batch, settings.num_tasks * settings.episodes_per_task)
    config.env_runners(envs_per_runner=batch)
    config.debugging(seed=settings.seed)
    config.callbacks_on_algorithm_init = None
    # Periodic validation belongs to training; here the main runners already play the evaluation split.
    config.evaluation_interval = None
    config.custom_evaluation_function = None
    config.evaluation_config = None
    return config


# ---------------------------------------------------------------------------------------------- evaluate
def build_evaluator(
    config: GAGPOConfig, settings: EvalSettings, *, checkpoint: str | os.PathLike | None = None
) -> Any:
    """The GAGPO Algorithm set up for evaluation, with the checkpoint's policy on every EnvRunner."""
    algo = evaluation_config(config, settings).build_algo()
    if checkpoint is not None:
        module_dir = Path(checkpoint).resolve() / MODULE_PATH
        if not module_dir.is_dir():
            algo.stop()
            raise FileNotFoundError(f"no policy at {module_dir}")
        # Loads the weights on the learner and syncs them to every EnvRunner.
        algo.restore_from_path(module_dir, component=MODULE_PATH)
    return algo


def play(
    algo: Any,
    settings: EvalSettings,
    *,
    progress: bool = True,
    on_episode: Callable[[Any], None] | None = None,
) -> list[EpisodeRecord]:
    """Play the evaluation plan with ``GAGPO.sample_groups(explore=False)``, in waves of (sub-envs x runners).

    A progress line (episodes done, success so far, elapsed, ETA) follows each wave; ``on_episode`` sees every
    finished SingleAgentEpisode.
    """
    plan = evaluation_plan(algo.num_tasks(), settings)
    wave = algo.config.num_envs_per_env_runner * max(1, algo.config.num_env_runners)
    records: list[EpisodeRecord] = []
    started = time.monotonic()
    for i, start in enumerate(range(0, len(plan), wave)):
        episodes, _, _ = algo.sample_groups(plan[start : start + wave], i, explore=False)
        records.extend(record(ep) for ep in episodes)
        if on_episode is not None:
            for ep in episodes:
                on_episode(ep)
        if progress:
            elapsed = time.monotonic() - started
            eta = elapsed / len(records) * (len(plan) - len(records))
            wins = float(np.mean([r.won for r in records]))
            print(
                f"eval episodes {len(records)}/{len(plan)}  success {wins:6.1%}  "
                f"{elapsed:6.1f} s  ETA {eta:6.0f} s",
                flush=True,
            )
    records.sort(key=lambda r: (r.task_id, r.member))
    return records


def validation_function(
    settings: EvalSettings, *, background: bool = False
) -> Callable[[Any, Any], tuple[dict[str, float], int, int]]:
    """An RLlib ``custom_evaluation_function``: play the evaluation plan on the evaluation EnvRunners.

    The plan is played as training plays its groups (``sample_whole_groups`` on the evaluation runners, with the
    config's ``max_group_attempts`` and ``group_sampling_timeout_s``): members lost with a runner or ended by an
    env error are played again, groups still incomplete after the attempts are left out of the metrics (none
    left: only ``num_episodes`` = 0 is reported). Generation seeds: ``group_sampling.episode_gen_seed`` from
    ``group_sampling.validation_seed(settings.seed)``, the iteration, group, member and attempt, never the runner.
    The runners play with ``explore=False`` (the config's ``eval_temperature``); the metrics land under
    ``evaluation/valid/`` in the result: ``success`` (All or WebShop's success, in [0, 1]),
    ``by_type/<column>`` for each column of the Table-1 layout (in [0, 1]), ``score`` (WebShop, 0-100),
    ``episode_len_mean``, ``num_episodes`` and ``iteration`` (the iteration whose weights were validated).

    ``background``: the evaluation runners play beside training instead of blocking the iteration
    (``BackgroundValidation``): RLlib's call hands them the weights of the iteration just trained and starts the
    play; its metrics are reported in the iteration during which it ends. A validation due while the previous one
    still plays is skipped (``evaluation/valid/skipped``), so validation never holds training up.
    """

    def play_plan(
        algorithm: Any, eval_group: Any, iteration: int
    ) -> tuple[dict[tuple[str, ...], float], int]:
        """The validation's metrics and the env steps it played."""
        num_tasks = ask_env_runner(algorithm, lambda r: r.num_tasks(), env_runner_group=eval_group)
        plan = evaluation_plan(int(num_tasks), settings)
        # Training's whole-group sampling, on the evaluation runners: lost runners and env errors are played again,
        # groups still incomplete after the attempts are left out.
        sample = sample_whole_groups(
            algorithm,
            plan,
            iteration,
            explore=False,
            env_runner_group=eval_group,
            seed=validation_seed(settings.seed),
        )
        records = [record(e) for e in sample.episodes]
        metrics: dict[tuple[str, ...], float] = {
            ("num_episodes",): float(len(records)),
            ("iteration",): float(iteration),
        }
        if records:
            layout, table = _summary(records, check_env_class(algorithm.config.env).eval_table)
            metrics[("success",)] = table[layout.success_column] / 100.0
            metrics[("episode_len_mean",)] = float(np.mean([r.length for r in records]))
            if layout.score:
                metrics[("score",)] = table["score"]
            else:
                metrics.update({("by_type", k): v / 100.0 for k, v in table.items() if not math.isnan(v)})
        else:
            logger.warning(
                "validation at iteration %d: no whole group came back; nothing to report", iteration
            )
        return metrics, int(sum(r.length for r in records))

    def run(algorithm: Any, eval_group: Any) -> tuple[dict[str, float], int, int]:
        iteration = int(algorithm.iteration)
        if background:
            BackgroundValidation.of(algorithm).start(
                lambda: play_plan(algorithm, eval_group, iteration)[0], iteration
            )
            return {}, 0, 0
        metrics, steps = play_plan(algorithm, eval_group, iteration)
        report_validation(algorithm, metrics)
        return {"valid": {"/".join(k): v for k, v in metrics.items()}}, steps, steps

    return run


def report_validation(algorithm: Any, metrics: dict[tuple[str, ...], float]) -> None:
    """Log a validation's metrics under ``evaluation/valid/``: the new API stack reads evaluation results from the
    algorithm's metrics under "evaluation", merged in as EnvRunner metrics are."""
    logged = MetricsLogger()
    for key, value in metrics.items():
        logged.log_value(("valid", *key), value, window=1)
    algorithm.metrics.aggregate([logged.reduce()], key=EVALUATION_RESULTS)


class BackgroundValidation:
    """One validation at a time on a thread of the driver, beside training (see ``validation_function``).

    The Algorithm calls ``report`` at every iteration (``GAGPO.training_step``): a finished validation's metrics go
    into that iteration's result. While one plays, RLlib's weight sync to the evaluation runners before the next
    due validation is skipped (``busy``; the runners would make it wait) and so is that validation.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gagpo-validation")
        self._job: Any = None
        self.skipped = 0

    @staticmethod
    def of(algorithm: Any) -> BackgroundValidation:
        if getattr(algorithm, "background_validation", None) is None:
            algorithm.background_validation = BackgroundValidation()
        return algorithm.background_validation

    def busy(self) -> bool:
        return self._job is not None and not self._job.done()

    def start(self, play: Callable[[], dict], iteration: int) -> None:
        if self.busy():
            self.skipped += 1
            logger.warning(
                "validation at iteration %d skipped: the previous one is still playing (%d skipped so far)",
                iteration,
                self.skipped,
            )
            return
        self._job = self._executor.submit(play)

    def report(self, algorithm: Any, *, wait: bool = False) -> None:
        """Log the finished validation's metrics (``wait``: wait for a running one first)."""
        if self._job is None or not (wait or self._job.done()):
            return
        job, self._job = self._job, None
        metrics = job.result()
        metrics[("skipped",)] = float(self.skipped)
        report_validation(algorithm, metrics)

    def close(self) -> None:
        """Wait for a validation still playing and log its metrics (no result follows a stopped run)."""
        if self._job is not None:
            job, self._job = self._job, None
            try:
                metrics = job.result()
            except Exception:  # noqa: BLE001 - the run is over; what failed is logged, not raised from stop()
                logger.exception("the validation still playing when the run stopped failed")
            else:
                logger.info(
                    "validation of iteration %d, ended after the run: %s",
                    int(metrics.get(("iteration",), -1)),
                    {"/".join(k): v for k, v in metrics.items()},
                )
        self._executor.shutdown(wait=True)


def with_validation(
    config: GAGPOConfig,
    *,
    split: str,
    interval: int,
    settings: EvalSettings | None = None,
    num_env_runners: int | None = None,
    background: bool = False,
    **overrides: Any,
) -> GAGPOConfig:
    """``config`` plus validation every ``interval`` iterations on ``split``.

    ``num_env_runners``: evaluation EnvRunners; None: one remote runner with backend "vllm" (an engine needs a
    runner of its own; give it a GPU share with ``num_gpus_per_env_runner=...`` in ``overrides``), else 0 (the
    evaluation group's local runner plays). ``overrides`` are GAGPOConfig fields for the evaluation runners only
    (e.g. a smaller vLLM memory share). ``background``: validate beside training on the remote evaluation runners
    (``BackgroundValidation``; the paper set-up does on GPUs): no iteration waits for it, its metrics arrive in a
    later iteration's result, and one still playing when the run stops is only logged.
    """
    if interval < 1:
        raise ValueError(f"validation interval must be >= 1, got {interval!r}")
    check_env_class(config.env).check_split(split, "validation split")
    if num_env_runners is None:
        num_env_runners = 1 if overrides.get("backend", config.backend) == "vllm" else 0
    if background and int(num_env_runners) == 0:
        raise ValueError(
            "with_validation: background=True needs remote evaluation runners (num_env_runners >= 1); the local "
            "one lives in the driver's process"
        )
    env_config = {**dict(config.env_config or {}), "split": split}
    if config.max_steps is not None:
        env_config["max_steps"] = config.max_steps
    return config.evaluation(
        evaluation_interval=interval,
        evaluation_num_env_runners=int(num_env_runners),
        custom_evaluation_function=validation_function(
            settings or EvalSettings(split=split), background=bool(background)
        ),
        evaluation_config=GAGPOConfig.overrides(env_config=env_config, explore=False, **overrides),
    )


def evaluate(
    config: GAGPOConfig,
    settings: EvalSettings,
    *,
    checkpoint: str | os.PathLike | None = None,
    source: str | None = None,
    progress: bool = True,
    dump_steps: str | os.PathLike | None = None,
) -> EvalReport:
    """Evaluate ``checkpoint``'s policy (or ``config``'s model when None) and summarise in the Table-1 layout.

    ``dump_steps``: a JSON-lines file that gets one line per step (``StepDump``): the prompt, the raw output,
    the parsed action or the invalid reason, the reward.
    """
    started = time.monotonic()
    reasons: Counter[str] = Counter()
    steps = [0]
    dumper = StepDump(dump_steps, str(config.model_path)) if dump_steps is not None else None

    def on_episode(episode: Any) -> None:
        steps[0] += len(episode)
        reasons.update(invalid_reasons(episode))
        if dumper is not None:
            dumper.write(episode)

    algo = build_evaluator(config, settings, checkpoint=checkpoint)
    try:
        records = play(algo, settings, progress=progress, on_episode=on_episode)
        env_config = algo.config.env_config
    finally:
        algo.stop()
        if dumper is not None:
            dumper.close()
    return EvalReport.build(
        records,
        check_env_class(config.env).eval_table,
        source=source or (str(checkpoint) if checkpoint is not None else str(config.model_path)),
        env=_env_name(config),
        split=str(env_config["split"]),
        temperature=float(settings.temperature),
        seconds=time.monotonic() - started,
        tasks_requested=settings.num_tasks,
        invalid_reasons=dict(reasons),
        num_steps=steps[0],
    )


def invalid_reasons(episode: Any) -> Counter[str]:
    """The invalid steps of a finished episode, counted by reason."""
    if not len(episode):
        return Counter()
    invalid = episode.get_extra_model_outputs(Columns.INVALID)
    why = (
        episode.get_extra_model_outputs(Columns.INVALID_REASON)
        if Columns.INVALID_REASON in episode.extra_model_outputs
        else ["unknown"] * len(invalid)
    )
    return Counter(str(r) or "unknown" for bad, r in zip(invalid, why, strict=True) if bool(bad))


class StepDump:
    """Writes every step of finished episodes as one JSON line, so a user can see why a step was invalid.

    Keys: task_id, member, task_type, step (1-based), prompt (the chat-templated text the model saw, decoded
    from its token ids), prompt_tokens, raw_output (the generated text), output_tokens, stop ("end_token": the
    answer ended with the model's end token; "length": cut at max_new_tokens), valid, action (what the env
    received), invalid_reason ("" when valid), reward, done, won (the episode's verdict, on every line).
    """

    def __init__(self, path: str | os.PathLike, tokenizer_path: str):
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from gagpo_rllib.policy.generation.base import end_token_id

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.end_id = end_token_id(self.tokenizer)
        self._handle = open(self.path, "w")  # noqa: SIM115 - kept open across waves, closed by close()
        self.lines = 0

    def write(self, episode: Any) -> None:
        n = len(episode)
        if not n:
            return
        outputs = episode.extra_model_outputs
        raw = list(episode.get_actions())
        prompt_ids = (
            list(episode.get_extra_model_outputs(Columns.PROMPT_IDS))
            if Columns.PROMPT_IDS in outputs
            else [None] * n
        )
        action_ids = (
            list(episode.get_extra_model_outputs(Columns.ACTION_IDS))
            if Columns.ACTION_IDS in outputs
            else [None] * n
        )
        invalid = list(episode.get_extra_model_outputs(Columns.INVALID))
        why = (
            list(episode.get_extra_model_outputs(Columns.INVALID_REASON))
            if Columns.INVALID_REASON in outputs
            else [""] * n
        )
        env_action = (
            list(episode.get_extra_model_outputs(Columns.ENV_ACTION))
            if Columns.ENV_ACTION in outputs
            else raw
        )
        rewards = list(episode.get_rewards())
        end = outcome(episode.get_infos(-1))
        for t in range(n):
            ids, out_ids = prompt_ids[t], action_ids[t]
            stop = None
            if out_ids is not None:
                stop = "end_token" if len(out_ids) and int(out_ids[-1]) == self.end_id else "length"
            line = {
                Columns.TASK_ID: int(episode.custom_data.get(Columns.TASK_ID, -1)),
                Columns.MEMBER: int(episode.custom_data.get(Columns.MEMBER, 0)),
                TASK_TYPE: end.task_type,
                "step": t + 1,
                "prompt": None if ids is None else self.tokenizer.decode(list(ids)),
                "prompt_tokens": None if ids is None else len(ids),
                "raw_output": str(raw[t]),
                "output_tokens": None if out_ids is None else len(out_ids),
                "stop": stop,
                "valid": not bool(invalid[t]),
                "action": str(env_action[t]),
                Columns.INVALID_REASON: str(why[t]) if bool(invalid[t]) else "",
                "reward": float(rewards[t]),
                "done": t == n - 1,
                WON: end.won,
            }
            self._handle.write(json.dumps(line) + "\n")
            self.lines += 1
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()
