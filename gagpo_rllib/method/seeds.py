"""Every seed salt of the project and the two seed hashes, in one dependency-free module.

It lives in ``method`` because this layer imports nothing else of ours (numpy only) and every other layer may
import it: ``method.stats`` (bootstrap), ``policy`` (per-row generation seeds), ``rllib`` (task plans, episode
seeds: see ``gagpo_rllib.rllib.group_sampling``) and ``tools`` (demonstrations, SFT). A salt keeps one draw's random
stream apart from every other draw made from the same user seed; the values are fixed, since changing one changes
which tasks, episodes and samples a seed gives.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BOOTSTRAP_SALT",
    "DEMONSTRATION_TASKS_SALT",
    "EXPERT_FALLBACK_SALT",
    "EVALUATION_SALT",
    "EXTRA_PLAN_SALT",
    "SALTS",
    "SFT_HELDOUT_SALT",
    "SFT_ORDER_SALT",
    "SFT_SUBSET_SALT",
    "TASK_PLAN_SALT",
    "derive_seed",
    "mix_seed",
    "salted_rng",
    "shuffle_rng",
]

# The tasks of an iteration's plan (rllib.group_sampling.task_plan).
TASK_PLAN_SALT = 0x6A6
# The tasks of a dynamic-sampling extra round (rllib.group_sampling.extra_plan).
EXTRA_PLAN_SALT = 0xD5
# Evaluation: the subset of the split's tasks (rllib.group_sampling.evaluation_plan) and validation's generation seeds.
EVALUATION_SALT = 0xE7A1
# The bootstrap resamples of a confidence interval (method.stats).
BOOTSTRAP_SALT = 0x626F6F74
# The tasks whose expert demonstrations are replayed when only some are asked for (tools.demonstrations).
DEMONSTRATION_TASKS_SALT = 0xDE30
# The random fallback of ALFWorld's hand-coded expert, per game (tools.demonstrations).
EXPERT_FALLBACK_SALT = 0xDE31
# Which demonstrations are held out from SFT training (tools.sft.split_demonstrations).
SFT_HELDOUT_SALT = 0x5F7
# The order of SFT's training examples, epoch after epoch (tools.sft).
SFT_ORDER_SALT = 0x5F8
# The training examples SFT keeps when capped by max_train_steps (tools.sft).
SFT_SUBSET_SALT = 0x5F9

SALTS: dict[str, int] = {
    "TASK_PLAN_SALT": TASK_PLAN_SALT,
    "EXTRA_PLAN_SALT": EXTRA_PLAN_SALT,
    "EVALUATION_SALT": EVALUATION_SALT,
    "BOOTSTRAP_SALT": BOOTSTRAP_SALT,
    "DEMONSTRATION_TASKS_SALT": DEMONSTRATION_TASKS_SALT,
    "EXPERT_FALLBACK_SALT": EXPERT_FALLBACK_SALT,
    "SFT_HELDOUT_SALT": SFT_HELDOUT_SALT,
    "SFT_ORDER_SALT": SFT_ORDER_SALT,
    "SFT_SUBSET_SALT": SFT_SUBSET_SALT,
}


def salted_rng(seed: int, salt: int) -> np.random.Generator:
    """The random stream of one draw: the user seed mixed with the draw's salt (``seed`` must be >= 0)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(salt)]))


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integer parts, each cut to its low 32 bits (the plans' env and generation seeds)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)


def shuffle_rng(seed: int, update: int, epoch: int, rank: int) -> np.random.Generator:
    """The minibatch order of one learner's epoch within an update (``update``: the weights' sequence number,
    checkpointed, so a restored run shuffles as the uninterrupted one)."""
    return np.random.default_rng([int(seed), int(update), int(epoch), int(rank)])


def mix_seed(*parts: int) -> int:
    """A 31-bit seed hashed from whole integer parts (low and high 32-bit words), so (call seed, request index)
    pairs never collide by addition; the generation backends' per-row seeds.

    Not ``derive_seed``: that one drops the high words, and the two give different seeds for the same parts.
    """
    words = [int(p) & 0xFFFFFFFF for p in parts] + [int(p) >> 32 & 0xFFFFFFFF for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1)[0] >> 1)
