"""The LLM RLModule: batched exploration through the backend; train log-probs match behaviour log-probs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns as RLlibColumns

from envs.spaces import TextSpace
from gagpo_rllib.columns import Columns
from gagpo_rllib.policy.generation.base import action_token_ids
from gagpo_rllib.policy.logprobs import cache_keyword
from gagpo_rllib.policy.rl_module import LLMRLModule, unpad_token_batch

ADM = [["go left", "go right"], ["look", "take key", "go left"], ["open door"]]


def _module(path: Path, *, inference_only: bool, constrained: bool = False) -> LLMRLModule:
    return LLMRLModule(
        observation_space=TextSpace(),
        action_space=TextSpace(),
        inference_only=inference_only,
        model_config={
            "model_path": str(path),
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "constrained": constrained},
        },
    )


def _prompts(module: LLMRLModule) -> list[str]:
    texts = ["short", "a much longer observation " * 6, "mid length prompt here"]
    return [
        module.tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
        )
        for t in texts
    ]


def _train_batch(out: dict, module: LLMRLModule, constrained: bool, admissible: list | None = None) -> dict:
    """The learner batch layout for the exploration outputs (left-padded prompts, right-padded actions)."""
    from gagpo_rllib.policy.generation.base import allowed_token_masks
    from gagpo_rllib.rllib.connectors.grouped_advantages import _pad

    prompts, actions = list(out[Columns.PROMPT_IDS]), list(out[Columns.ACTION_IDS])
    pw, aw = max(map(len, prompts)), max(map(len, actions))
    batch = {
        "prompt_ids": _pad(prompts, pw, module.pad_token_id, torch.long, left=True),
        "prompt_len": torch.tensor([len(p) for p in prompts]),
        "action_ids": _pad(actions, aw, module.pad_token_id, torch.long, left=False),
        "action_len": torch.tensor([len(a) for a in actions]),
    }
    if constrained:
        depth = module.vocab_size
        allowed = torch.full((len(actions), aw, depth), -1, dtype=torch.long)
        for i, (adm, act) in enumerate(zip(admissible or ADM, actions, strict=True)):
            mask = allowed_token_masks(module.tokenizer, adm, act, module.vocab_size)
            for k in range(len(act)):
                ids = torch.nonzero(mask[k]).flatten()
                allowed[i, k, : len(ids)] = ids
        batch["allowed_ids"] = allowed
    return batch


@pytest.mark.parametrize("constrained", [False, True])
def test_train_logprobs_equal_behaviour_logprobs(tiny_policy_path: Path, constrained: bool) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True, constrained=constrained)
    learner_side = _module(tiny_policy_path, inference_only=False, constrained=constrained)
    prompts = _prompts(runner_side)
    out = runner_side.forward_exploration(
        {Columns.PROMPTS: prompts, Columns.ADMISSIBLE: ADM, Columns.GEN_SEED: 5}
    )
    assert isinstance(out[RLlibColumns.ACTIONS], np.ndarray) and out[RLlibColumns.ACTIONS].dtype == object
    for p, ids in zip(prompts, out[Columns.PROMPT_IDS], strict=True):
        assert ids == runner_side.tokenizer(p, add_special_tokens=False)["input_ids"]
    if constrained:
        for adm, ids, text in zip(ADM, out[Columns.ACTION_IDS], out[RLlibColumns.ACTIONS], strict=True):
            assert ids in action_token_ids(runner_side.tokenizer, adm) and text in adm
    fwd = learner_side.forward_train(_train_batch(out, learner_side, constrained))
    for i, lp in enumerate(out[Columns.ACTION_LOGP]):
        n = len(lp)
        torch.testing.assert_close(fwd["logp"][i, :n].detach(), torch.tensor(lp), atol=1e-5, rtol=0)
        torch.testing.assert_close(fwd["ref_logp"][i, :n], torch.tensor(lp), atol=1e-5, rtol=0)
        assert fwd["mask"][i, :n].all() and not fwd["mask"][i, n:].any()
    assert fwd["logp"].requires_grad and not fwd["ref_logp"].requires_grad


def test_same_seed_same_sample_and_reference_stays_out_of_state(tiny_policy_path: Path) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True)
    prompts = _prompts(runner_side)
    a = runner_side.forward_exploration({Columns.PROMPTS: prompts, Columns.GEN_SEED: 11})
    b = runner_side.forward_exploration({Columns.PROMPTS: prompts, Columns.GEN_SEED: 11})
    assert list(a[Columns.ACTION_IDS]) == list(b[Columns.ACTION_IDS])
    assert runner_side.reference_model is None
    learner_side = _module(tiny_policy_path, inference_only=False)
    assert learner_side.reference_model is not None
    names = set(learner_side.get_state())
    assert names == {f"model.{k}" for k in learner_side.model.state_dict()}
    n_params = sum(p.numel() for p in learner_side.parameters())
    assert n_params == sum(p.numel() for p in learner_side.model.parameters())


def test_set_state_moves_the_sampling_policy(tiny_policy_path: Path) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True)
    learner_side = _module(tiny_policy_path, inference_only=False)
    prompts = _prompts(runner_side)
    before = runner_side.forward_exploration({Columns.PROMPTS: prompts, Columns.GEN_SEED: 2})
    with torch.no_grad():
        for p in learner_side.model.parameters():
            p.add_(torch.randn_like(p))
    runner_side.set_state(learner_side.get_state(inference_only=True))
    for k, v in learner_side.model.state_dict().items():
        torch.testing.assert_close(runner_side.model.state_dict()[k], v)
    after = runner_side.forward_exploration({Columns.PROMPTS: prompts, Columns.GEN_SEED: 2})
    assert list(before[Columns.ACTION_LOGP]) != list(after[Columns.ACTION_LOGP])
    # The reference keeps the initial weights.
    ref = learner_side.reference_model.state_dict()
    assert any(not torch.equal(ref[k], v) for k, v in learner_side.model.state_dict().items())


def test_unpad_token_batch_round_trip() -> None:
    batch = {
        "prompt_ids": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
        "prompt_len": torch.tensor([2, 4]),
        "action_ids": torch.tensor([[1, 2, 0], [3, 0, 0]]),
        "action_len": torch.tensor([3, 1]),
        "allowed_ids": torch.tensor([[[1, 4], [2, -1], [0, -1]], [[3, -1], [-1, -1], [-1, -1]]]),
    }
    prompts, actions, masks = unpad_token_batch(batch, vocab_size=6)
    assert prompts == [[5, 6], [7, 8, 9, 10]] and actions == [[1, 2, 0], [3]]
    assert masks[0].shape == (3, 6) and masks[0][0].nonzero().flatten().tolist() == [1, 4]
    assert masks[1].shape == (1, 6) and masks[1][0].nonzero().flatten().tolist() == [3]


def test_missing_model_path_is_an_error() -> None:
    with pytest.raises(ValueError, match="model_path"):
        LLMRLModule(observation_space=TextSpace(), action_space=TextSpace(), model_config={})


def _repeat_rows(batch: dict, rows: list[int]) -> dict:
    return {k: v[torch.as_tensor(rows)] for k, v in batch.items()}


def _rows_forwarded(model: torch.nn.Module) -> tuple[list[tuple[int, bool]], object]:
    """Per forward of ``model``: (rows, whether it continues a KV cache). A forward without a cache reads prompts;
    one with a cache reads the rows' last prompt token and action tokens."""
    seen: list[tuple[int, bool]] = []
    keyword = cache_keyword(model)
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["input_ids"].shape[0], kw.get(keyword) is not None)),
        with_kwargs=True,
    )
    return seen, hook


@pytest.mark.parametrize("constrained", [False, True])
def test_repeated_rows_are_forwarded_once_with_the_whole_batch_values_and_gradient(
    tiny_policy_path: Path, constrained: bool
) -> None:
    from gagpo_rllib.policy.logprobs import action_logprobs

    runner_side = _module(tiny_policy_path, inference_only=True, constrained=constrained)
    learner_side = _module(tiny_policy_path, inference_only=False, constrained=constrained)
    out = runner_side.forward_exploration(
        {Columns.PROMPTS: _prompts(runner_side), Columns.ADMISSIBLE: ADM, Columns.GEN_SEED: 3}
    )
    rows = [0, 1, 0, 2, 1, 0, 0]
    batch = _repeat_rows(_train_batch(out, learner_side, constrained), rows)
    seen, hook = _rows_forwarded(learner_side.model)
    fwd = learner_side.forward_train(batch)
    hook.remove()
    assert seen == [(3, False), (3, True)]  # the three distinct rows, not the seven
    assert float(fwd["unique_row_share"]) == pytest.approx(3 / 7)

    # the whole batch, row by row, as the learner computed it before repeats were shared
    prompts, actions, masks = unpad_token_batch(batch, learner_side.vocab_size)
    kw = dict(pad_token_id=learner_side.pad_token_id, temperature=1.0, allowed_masks=masks)
    model = learner_side.model
    logp, mask, entropy = action_logprobs(model, prompts, actions, with_entropy=True, **kw)
    with torch.no_grad():
        ref, _, _ = action_logprobs(learner_side.reference_model, prompts, actions, **kw)
    torch.testing.assert_close(fwd["logp"], logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(fwd["entropy"], entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(fwd["ref_logp"], ref, atol=1e-5, rtol=0)
    assert torch.equal(fwd["mask"], mask)

    # per-row weights stand in for the advantages: the gradient of the shared forward is the whole batch's
    weights = torch.linspace(-1.0, 2.0, len(rows)).unsqueeze(1)
    shared = torch.autograd.grad(
        (fwd["logp"] * weights).sum() + fwd["entropy"].sum(), list(model.parameters())
    )
    whole = torch.autograd.grad((logp * weights).sum() + entropy.sum(), list(model.parameters()))
    for a, b in zip(shared, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_reference_log_probs_of_rows_seen_before_come_from_the_cache(tiny_policy_path: Path) -> None:
    runner_side = _module(tiny_policy_path, inference_only=True)
    learner_side = _module(tiny_policy_path, inference_only=False)
    out = runner_side.forward_exploration({Columns.PROMPTS: _prompts(runner_side), Columns.GEN_SEED: 4})
    batch = _train_batch(out, learner_side, constrained=False)
    first = learner_side.forward_train(_repeat_rows(batch, [0, 1]))
    assert float(first["reference_cache_hit_share"]) == 0.0
    # the policy moves; the reference does not, so its values for rows 0 and 1 are reused
    with torch.no_grad():
        for p in learner_side.model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    seen, hook = _rows_forwarded(learner_side.reference_model)
    second = learner_side.forward_train(_repeat_rows(batch, [1, 2, 0, 1]))
    hook.remove()
    assert seen == [(1, False), (1, True)]  # only row 2 is new
    assert float(second["reference_cache_hit_share"]) == pytest.approx(2 / 3)
    torch.testing.assert_close(second["ref_logp"][0], first["ref_logp"][1], atol=1e-6, rtol=0)
    torch.testing.assert_close(second["ref_logp"][2], first["ref_logp"][0], atol=1e-6, rtol=0)
    assert not torch.allclose(second["logp"][2], first["logp"][0])  # the policy's own values are fresh
    uncached = _module(tiny_policy_path, inference_only=False)
    uncached.reference_cache.max_rows = 0
    with torch.no_grad():
        fresh = uncached.forward_train(_repeat_rows(batch, [1, 2, 0, 1]))["ref_logp"]
    torch.testing.assert_close(second["ref_logp"], fresh, atol=1e-5, rtol=0)


def test_a_prompt_shared_by_several_actions_is_forwarded_once(tiny_policy_path: Path) -> None:
    from gagpo_rllib.policy.logprobs import action_logprobs

    learner_side = _module(tiny_policy_path, inference_only=False, constrained=True)
    tok = learner_side.tokenizer
    prompt = tok(_prompts(learner_side)[1], add_special_tokens=False)["input_ids"]
    other = tok(_prompts(learner_side)[0], add_special_tokens=False)["input_ids"]
    acts = action_token_ids(tok, ADM[1])  # three actions from one state
    out = {
        Columns.PROMPT_IDS: [prompt, prompt, prompt, other],
        Columns.ACTION_IDS: [acts[0], acts[1], acts[2], acts[1]],
    }
    batch = _train_batch(out, learner_side, constrained=True, admissible=[ADM[1]] * 4)
    seen, hook = _rows_forwarded(learner_side.model)
    fwd = learner_side.forward_train(batch)
    hook.remove()
    # the two distinct prompts, then the four rows' actions on copies of their caches
    assert seen == [(2, False), (4, True)]
    prompts, actions, masks = unpad_token_batch(batch, learner_side.vocab_size)
    logp, _, entropy = action_logprobs(
        learner_side.model,
        prompts,
        actions,
        pad_token_id=learner_side.pad_token_id,
        allowed_masks=masks,
        with_entropy=True,
    )
    torch.testing.assert_close(fwd["logp"], logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(fwd["entropy"], entropy, atol=1e-5, rtol=0)
