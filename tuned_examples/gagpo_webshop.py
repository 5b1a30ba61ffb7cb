"""GAGPO on WebShop: the paper's set-up when a model is given, the embedded CPU default otherwise.

With ``GAGPO_MODEL=/path/to/Qwen2.5-1.5B-Instruct`` (or ``--model``) this is the paper's configuration:
16 goals x 8 rollouts per iteration, at most 15 steps, history 2, gamma 0.95, lr 1e-6, k3 KL 0.01, sampling at
temperature 1.0, free-form ``<think>/<action>`` answers (the model writes its own search queries), pages shown
without the instruction (verl-agent's page text), vLLM rollouts and bf16 on a GPU (``GAGPO_GPUS``), the GiGPO
reference's goals (split scheme 'gigpo': train [500:], eval [:500], so a reported number is on the papers' goals;
with fewer than 3,000 goals the cut points scale, see envs/webshop/goals.py), and validation
every 5 iterations on the eval split at temperature 0.4 (``evaluation/valid/score`` and ``.../success``;
``rllib evaluate`` prints the same columns for a checkpoint).

Without a model it is the embedded CPU default: a tiny random-init policy whose tokenizer is trained on the bundled
catalogue's pages (built when training starts, cached), constrained decoding over the admissible actions, where a search is typed from the goal's own
words (the env's ``search_grammar="goal_prefix"``: ``search[w1 ... wk]`` for any k, see envs/webshop/search_grammar.py),
the purchase score (0-1) as the reward (``reward_mode="score"``: the tiny policy learns from partial matches before
it ever buys the exact product), 4 goals x 4 rollouts, ``CPU_ITERATIONS`` iterations (about 25 minutes on 2 cores),
validation on 8 eval goals every 5 iterations.

    rllib train file tuned_examples/gagpo_webshop.py --stop '{"training_iteration": 2}'
    GAGPO_MODEL=/models/Qwen2.5-1.5B-Instruct python tuned_examples/gagpo_webshop.py --iterations 150
"""

from __future__ import annotations

import os
from pathlib import Path

from envs.webshop import WebShopEnv
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib import paper_setup
from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation
from gagpo_rllib.tools.tiny_policies import WEBSHOP_CPU_ENV_CONFIG, TinyPolicy, webshop_tiny_policy

VALID_SPLIT = "eval"
POLICY_DIR = Path(
    os.environ.get(
        "GAGPO_TINY_WEBSHOP_DIR", Path.home() / ".cache" / "gagpo_rllib" / "tiny_webshop_search_policy"
    )
)
# Learners (DDP, whole groups each) and EnvRunners (one rollout backend each): README "Scaling out".
NUM_LEARNERS, NUM_ENV_RUNNERS = paper_setup.scale_out_from_env()
# The CPU default types searches from the goal's words and learns from the purchase score.
CPU_ENV_CONFIG = WEBSHOP_CPU_ENV_CONFIG
CPU_ITERATIONS = 40
# The GiGPO reference's goals: train on [500:], validate on [:500] (WebShop's own baselines: test [:500]).
PAPER_ENV_CONFIG = {"split": "train", "strip_instruction": True, "split_scheme": "gigpo"}


def paper_config(model_path: str, *, num_gpus: int | None = None, seed: int = 0) -> GAGPOConfig:
    """The paper's WebShop set-up (Qwen2.5-1.5B-Instruct); validation every 5 iterations on the eval split."""
    return paper_setup.paper_config(
        WebShopEnv,
        PAPER_ENV_CONFIG,
        model_path=model_path,
        max_steps=15,
        max_prompt_tokens=4096,
        valid_split=VALID_SPLIT,
        num_learners=NUM_LEARNERS,
        num_env_runners=NUM_ENV_RUNNERS,
        num_gpus=num_gpus,
        seed=seed,
    )


def cpu_config(
    *, policy_dir: Path = POLICY_DIR, num_env_runners: int = NUM_ENV_RUNNERS, seed: int = 0
) -> GAGPOConfig:
    """The embedded default: a tiny policy on the bundled catalogue, constrained decoding, CPU only."""
    config = (
        GAGPOConfig()
        .environment(WebShopEnv, env_config=dict(CPU_ENV_CONFIG))
        .llm(
            model_path=str(policy_dir),
            history_length=2,
            max_prompt_tokens=1024,
            constrained_decoding=True,
            max_new_tokens=48,
        )
        .gagpo(estimator="gagpo", group_size=4, groups_per_iteration=4, max_steps=15)
        .training(lr=5e-4, num_epochs=1, minibatch_size=512, grad_clip=1.0, kl_coeff=0.01, entropy_coeff=0.01)
        .env_runners(num_env_runners=num_env_runners)
        .learners(num_learners=NUM_LEARNERS)
        .callbacks(on_setup_start=TinyPolicy(webshop_tiny_policy, policy_dir))
        .debugging(seed=seed)
    )
    # Validation after every 5 iterations on 8 tasks of eval.
    settings = EvalSettings(split=VALID_SPLIT, num_tasks=8, seed=seed)
    return with_validation(config, split=VALID_SPLIT, interval=5, settings=settings)


def make_config(model_path: str | None = None, **kwargs) -> GAGPOConfig:
    """The paper's set-up for a model path, the CPU default without one."""
    return paper_config(model_path, **kwargs) if model_path else cpu_config(**kwargs)


MODEL = os.environ.get("GAGPO_MODEL")
config = make_config(MODEL)
stop = {"training_iteration": 150 if MODEL else CPU_ITERATIONS}


if __name__ == "__main__":
    from gagpo_rllib.tools.train import example_main

    example_main(
        __doc__,
        paper_config=paper_config,
        cpu_config=cpu_config,
        cpu_iterations=CPU_ITERATIONS,
        name="gagpo_webshop",
    )
