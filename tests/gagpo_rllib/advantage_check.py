"""A test check shared by the EnvRunner tests: the learner connector's advantages are the engine's on the episodes."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.advantages import compute_advantages
from gagpo_rllib.rllib.algorithm import GAGPO


def assert_connector_advantages_are_the_engines(algo: GAGPO, episodes: list) -> None:
    """Rebuild the step columns by hand, run ``compute_advantages`` and compare with the learner connector's."""
    cfg = algo.config
    cols = defaultdict(list)
    for ep in episodes:
        invalid = ep.get_extra_model_outputs(Columns.INVALID)
        for t in range(len(ep)):
            cols["group_id"].append(ep.custom_data["group_id"])
            cols["episode_id"].append(ep.id_)
            cols["reward"].append(ep.get_rewards(t) - cfg.invalid_penalty * invalid[t])
            cols["state_key"].append(ep.get_infos(t)["state_key"])
    expected = compute_advantages(cols, estimator=cfg.estimator, gamma=cfg.gamma, lam=cfg.lam, norm=cfg.norm)
    learner = algo.learner_group._learner
    batch = cfg.grouped_advantages()(rl_module=learner.module, batch={}, episodes=episodes)
    np.testing.assert_allclose(batch["default_policy"]["advantages"].numpy(), expected, atol=1e-6)
