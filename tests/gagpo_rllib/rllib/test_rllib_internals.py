"""The chunked optimizer step: the one-shot gradient, with the saved activations of one chunk at a time.

Saved activations are counted with ``torch.autograd.graph.saved_tensors_hooks``: bytes packed for backward and
still alive, at their peak over the update.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.logprobs import checkpointing
from gagpo_rllib.rllib.config import configure
from gagpo_rllib.rllib.env_runner import GAGPOEnvRunner
from gagpo_rllib.rllib.group_sampling import task_plan
from tests.gagpo_rllib.tolerances import assert_equal_sums, token_positions
from tests.gagpo_rllib.toy_env import CorridorEnv, make_config

GROUPS = 4


class _Live:
    """Bytes of tensors saved for backward that are still alive; the peak; the bytes packed per chunk."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.per_chunk: list[int] = []


class _Saved:
    """A saved tensor, held detached (keeping ``t`` itself would tie the graph into a reference cycle)."""

    def __init__(self, live: _Live, t: torch.Tensor):
        self.live, self.t, self.nbytes = live, t.detach(), t.numel() * t.element_size()
        live.now += self.nbytes
        live.peak = max(live.peak, live.now)
        if live.per_chunk:
            live.per_chunk[-1] += self.nbytes

    def __del__(self) -> None:
        self.live.now -= self.nbytes


def _update(learner, episodes, live: _Live | None = None) -> dict[str, torch.Tensor]:
    """One full-batch update; the gradients it applied (they stay on the parameters after the step)."""
    module = learner.module[DEFAULT_MODULE_ID]
    if live is None:
        learner.update(episodes=episodes, num_epochs=1, minibatch_size=None)
    else:
        forward = module.forward_train

        def counted(batch, **kwargs):
            live.per_chunk.append(0)
            return forward(batch, **kwargs)

        module.forward_train = counted
        try:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: _Saved(live, t), lambda s: s.t):
                learner.update(episodes=episodes, num_epochs=1, minibatch_size=None)
        finally:
            del module.forward_train
    return {n: p.grad.detach().clone() for n, p in module.model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module", params=[True, False], ids=["constrained", "free"])
def setup(request, tiny_policy_path: Path):
    config = make_config(
        tiny_policy_path, groups_per_iteration=GROUPS, constrained_decoding=request.param, max_new_tokens=6
    ).training(minibatch_size=None, num_epochs=1)
    config.validate()
    runner = GAGPOEnvRunner(config=config)
    plan = task_plan(
        runner.num_tasks(), groups=GROUPS, group_size=config.group_size, seed=config.seed, iteration=0
    )
    episodes, _ = runner.sample_groups(plan, gen_seed=0)
    return config, episodes


def _learner(config, **gagpo):
    cfg = configure(config.copy(copy_frozen=False), **gagpo)
    cfg.validate()
    return cfg.build_learner(env=CorridorEnv())


def test_chunked_backward_gives_the_one_shot_gradient_with_one_chunks_activations(setup) -> None:
    config, episodes = setup
    one_shot = _learner(config, train_chunk_tokens=1 << 20)
    chunked = _learner(config, train_chunk_tokens=1)  # every distinct prompt a chunk of its own
    batch = config.grouped_advantages()(rl_module=chunked.module, batch={}, episodes=episodes)[
        DEFAULT_MODULE_ID
    ]
    batch[Columns.ROW_WEIGHT] = torch.ones(len(batch["advantages"]))
    chunks = chunked.module[DEFAULT_MODULE_ID].train_chunks(batch)
    assert len(chunks) >= 8
    # The K rollouts of a group share their first prompt: some chunks hold several rows of one prompt.
    assert max(len(c) for c in chunks) >= 2

    whole, parts = _Live(), _Live()
    expected = _update(one_shot, episodes, whole)
    got = _update(chunked, episodes, parts)
    assert_equal_sums(got, expected, token_positions(batch))
    assert len(whole.per_chunk) == 1 and len(parts.per_chunk) == len(chunks)
    # The chunked step holds at most one chunk's activations at a time; the one-shot step all of them at once.
    assert parts.peak <= max(parts.per_chunk) * 1.05
    assert parts.peak < whole.peak / 3


def test_gradient_checkpointing_keeps_the_gradient_and_saves_less(setup) -> None:
    config, episodes = setup
    plain = _learner(config, gradient_checkpointing=False)
    recomputing = _learner(config, gradient_checkpointing=True)
    assert checkpointing(recomputing.module[DEFAULT_MODULE_ID].model)
    assert not checkpointing(plain.module[DEFAULT_MODULE_ID].model)
    full, less = _Live(), _Live()
    expected = _update(plain, episodes, full)
    got = _update(recomputing, episodes, less)
    batch = config.grouped_advantages()(rl_module=plain.module, batch={}, episodes=episodes)[
        DEFAULT_MODULE_ID
    ]
    assert_equal_sums(got, expected, token_positions(batch))
    assert less.peak < full.peak
