"""Tiny offline policies of the bundled environments: a random-init model whose tokenizer is trained on the
env's own texts (``gagpo_rllib.policy.models.build_tiny_policy``), cached by the inputs of its corpus.

They live with the tools, which may import the environments; the policy package stays env-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE
from envs.alfworld.wheel import grammar_path, read_grammar
from envs.maze import FIRST_PROMPT_TEMPLATE as MAZE_FIRST_PROMPT_TEMPLATE
from envs.maze import PROMPT_TEMPLATE as MAZE_PROMPT_TEMPLATE
from envs.maze import MazeEnv
from envs.protocol import TASK_ID
from envs.webshop import WebShopEnv
from envs.webshop.prompts import FIRST_PROMPT_TEMPLATE as WEBSHOP_FIRST_PROMPT_TEMPLATE
from envs.webshop.prompts import PROMPT_TEMPLATE as WEBSHOP_PROMPT_TEMPLATE
from gagpo_rllib.policy.models import build_tiny_policy, inputs_digest
from gagpo_rllib.tools.demonstrations import alfworld_demonstrations, demonstration_texts

__all__ = ["TinyPolicy", "alfworld_tiny_policy", "maze_tiny_policy", "webshop_tiny_policy"]

_ALFWORLD_CORPUS_VERSION = "alfworld walkthroughs + grammar, v1"


def alfworld_tiny_policy(
    out_dir: str | Path,
    *,
    vocab_size: int = 1024,
    seed: int = 0,
    demonstrations: Callable[[], object] | None = None,
    **architecture: int,
) -> Path:
    """A tiny policy whose tokenizer is trained on the bundled ALFWorld train games.

    Corpus: the task, every observation and every admissible command along each game's walkthrough (replayed
    through the env, about a minute), the engine's grammar (all feedback texts it can print) and the prompt
    templates. The cache key is a digest of those inputs (game files, grammar, templates), so the build is
    redone exactly when one changes. ``demonstrations`` (returning the walkthroughs' ``DemoSet``) lets a caller
    share one replay with its warm start.
    """
    games = [Path(g.game_file) for g in find_games(BUNDLED_DATA, "train").games]
    extra = [FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, "user assistant system"]
    key = inputs_digest(
        files=[*games, *(g.parent / "traj_data.json" for g in games), grammar_path()],
        texts=[*extra, _ALFWORLD_CORPUS_VERSION],
    )

    def corpus() -> list[str]:
        demo_set = (
            demonstrations() if demonstrations is not None else alfworld_demonstrations({"split": "train"})
        )
        return demonstration_texts(demo_set.demonstrations) + [read_grammar(), *extra]

    return build_tiny_policy(
        out_dir, corpus=corpus, corpus_key=key, vocab_size=vocab_size, seed=seed, **architecture
    )


def maze_tiny_policy(out_dir: str | Path, *, seed: int = 0) -> Path:
    """A tiny policy whose tokenizer is trained on the maze texts, the templates and the chat markup (cached)."""
    corpus = MazeEnv({"split": "train"}).corpus()
    corpus += [MAZE_FIRST_PROMPT_TEMPLATE, MAZE_PROMPT_TEMPLATE, "user assistant system"]
    return build_tiny_policy(out_dir, corpus=corpus, vocab_size=512, seed=seed)


# The WebShop CPU default's env: searches typed from the goal's words, the purchase score as the reward.
WEBSHOP_CPU_ENV_CONFIG = {
    "split": "train",
    "strip_instruction": True,
    "search_grammar": "goal_prefix",
    "reward_mode": "score",
}


def webshop_corpus(num_goals: int = 24) -> list[str]:
    """Goals, the search page, a results page and a product page for the first training goals."""
    env = WebShopEnv(WEBSHOP_CPU_ENV_CONFIG)
    texts: list[str] = []
    for task_id in range(min(num_goals, env.num_tasks)):
        obs, info = env.reset(seed=0, options={TASK_ID: task_id})
        texts += [obs, info["task"], *info["admissible_actions"]]
        obs, _, _, _, info = env.step(info["admissible_actions"][-1])
        texts += [obs, *info["admissible_actions"]]
        products = [a for a in info["admissible_actions"] if a.startswith("click[b0")]
        if products:
            obs, _, _, _, info = env.step(products[0])
            texts += [obs, *info["admissible_actions"]]
    return sorted(set(texts))


def webshop_tiny_policy(out_dir: str | Path, *, seed: int = 0) -> Path:
    """A tiny policy for the WebShop CPU default, built once (delete the folder to rebuild it)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer_config.json").is_file():
        return out_dir
    corpus = webshop_corpus() + [
        WEBSHOP_FIRST_PROMPT_TEMPLATE,
        WEBSHOP_PROMPT_TEMPLATE,
        "user assistant system",
    ]
    return build_tiny_policy(out_dir, corpus=corpus, vocab_size=1024, seed=seed)


@dataclass(frozen=True)
class TinyPolicy:
    """A set-up step (``GAGPOConfig.callbacks(on_setup_start=...)``): build the tiny policy in ``out_dir`` with
    ``build`` (one of this module's builders) when training starts, not when the config is read."""

    build: Callable[..., Path]
    out_dir: Path
    seed: int = 0

    def __call__(self, config: Any = None, **kwargs: Any) -> Path:
        """Build (or find cached) the policy; nothing to do for a config that plays another model."""
        if config is not None and str(config.model_path) != str(self.out_dir):
            return Path(config.model_path)
        return self.build(self.out_dir, seed=self.seed)
