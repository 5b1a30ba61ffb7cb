"""The supervised warm start: training prompts and constrained softmax, the ``rllib sft`` command, caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from envs.alfworld.games import BUNDLED_DATA, find_games
from envs.alfworld.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE
from envs.alfworld.tasks import TASK_TYPES
from gagpo_rllib import GAGPOConfig
from gagpo_rllib.policy.generation.base import action_token_ids, allowed_token_masks
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.models import build_tiny_policy, load_policy
from gagpo_rllib.rllib.connectors.rollout import PromptBuilder, parse_action
from gagpo_rllib.tools.cli import main
from gagpo_rllib.tools.demonstrations import (
    DemoSet,
    DemoStep,
    alfworld_demonstrations,
    demonstration_texts,
    reasoning_line,
)
from gagpo_rllib.tools.sft import SFTSettings, build_examples, finetune, split_demonstrations

TEMPLATES = {"first_template": FIRST_PROMPT_TEMPLATE, "template": PROMPT_TEMPLATE}


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> DemoSet:
    """Walkthroughs of one bundled train game per task type ($ALFWORLD_DATA in a temporary folder)."""
    games = find_games(BUNDLED_DATA, "train").games
    ids = [next(i for i, g in enumerate(games) if g.task_type == t) for t in TASK_TYPES]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALFWORLD_DATA", str(tmp_path_factory.mktemp("alfworld_data")))
        return alfworld_demonstrations({"split": "train"}, ids)


@pytest.fixture(scope="module")
def policy(demos: DemoSet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A very small random-init policy whose tokenizer knows the games' words (short prompts, fast steps)."""
    corpus = demonstration_texts(demos.demonstrations) + [FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE]
    return build_tiny_policy(
        tmp_path_factory.mktemp("sft_policy"),
        corpus=corpus,
        vocab_size=512,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
    )


def test_examples_carry_the_rollout_prompts_tokens_and_allowed_sets(demos: DemoSet, policy) -> None:
    model, tok = load_policy(policy)
    examples = build_examples(demos.demonstrations[:2], tok, history_length=2, **TEMPLATES)
    steps = [s for d in demos.demonstrations[:2] for s in d.steps]
    assert len(examples) == len(steps)
    builder = PromptBuilder(tok, history_length=2, **TEMPLATES)
    vocab = model.get_output_embeddings().weight.shape[0]
    for ex, step in zip(examples, steps, strict=True):
        prompt = builder.build(
            task=step.task,
            observation=step.observation,
            admissible_actions=list(step.admissible),
            history=list(step.history),
            step=step.step,
        )
        assert ex.prompt_ids == tok(prompt, add_special_tokens=False)["input_ids"]
        assert ex.action_ids == action_token_ids(tok, [step.action])[0]
        dense = torch.zeros(len(ex.action_ids), vocab, dtype=torch.bool)
        for k, ids in enumerate(ex.allowed):
            dense[k, ids] = True
        # Exactly the learner's masks for a constrained rollout step.
        assert torch.equal(dense, allowed_token_masks(tok, list(step.admissible), ex.action_ids, vocab))
    # The constrained softmax puts at least as much mass on each expert token as the full one.
    ex = examples[3]
    mask = allowed_token_masks(tok, list(steps[3].admissible), ex.action_ids, vocab)
    with torch.no_grad():
        constrained, _, _ = action_logprobs(
            model, [ex.prompt_ids], [ex.action_ids], pad_token_id=tok.pad_token_id, allowed_masks=[mask]
        )
        full, _, _ = action_logprobs(model, [ex.prompt_ids], [ex.action_ids], pad_token_id=tok.pad_token_id)
    assert bool((constrained >= full - 1e-6).all()) and bool((constrained > full).any())


def test_free_mode_targets_parse_back_to_the_expert_action(demos: DemoSet, policy) -> None:
    _, tok = load_policy(policy)
    examples = build_examples(demos.demonstrations[:1], tok, constrained=False, **TEMPLATES)
    for ex, step in zip(examples, demos.demonstrations[0].steps, strict=True):
        assert ex.allowed is None and ex.action_ids[-1] == tok.eos_token_id
        text = tok.decode(ex.action_ids[:-1])
        parsed = parse_action(text, constrained=False)
        assert parsed.valid and parsed.action == step.action
        # The format warm start's target: a short reason in <think>, then the action.
        assert text == f"<think>{reasoning_line(step)}</think><action>{step.action}</action>"
    bare = build_examples(demos.demonstrations[:1], tok, constrained=False, think=False, **TEMPLATES)
    assert (
        tok.decode(bare[0].action_ids[:-1]) == f"<action>{demos.demonstrations[0].steps[0].action}</action>"
    )
    own = build_examples(
        demos.demonstrations[:1], tok, constrained=False, system_prompt="Be brief.", **TEMPLATES
    )
    assert tok.decode(own[0].prompt_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_prompts_list_what_the_env_listed_and_targets_type_the_real_query(policy) -> None:
    """A typed search the env offered only as a template: the prompt shows the template, the target the query."""
    from gagpo_rllib.tools.demonstrations import SEARCH_TEMPLATE, Demonstration

    query = "search[red cotton shirt]"
    step = DemoStep("buy a red shirt", "WebShop [SEP] Search", (query,), (), 0, query, (SEARCH_TEMPLATE,))
    demo = Demonstration("goal", 0, "webshop", (step,), True)
    _, tok = load_policy(policy)
    for constrained in (False, True):
        (ex,) = build_examples([demo], tok, constrained=constrained, **TEMPLATES)
        prompt = tok.decode(ex.prompt_ids)
        assert SEARCH_TEMPLATE in prompt and query not in prompt
        assert query in tok.decode(ex.action_ids)


def test_reasoning_lines_name_the_purpose_of_each_kind_of_action(demos: DemoSet) -> None:
    steps = [s for d in demos.demonstrations for s in d.steps]
    lines = [reasoning_line(s) for s in steps]
    assert all(0 < len(line) <= 120 and "<" not in line and "\n" not in line for line in lines)
    go = next(s for s in steps if s.action.startswith("go to "))
    assert go.action[len("go to ") :] in reasoning_line(go)

    def step(action: str) -> DemoStep:
        return DemoStep("buy a red shirt", "WebShop [SEP] Search", (action,), (), 0, action)

    assert "search" in reasoning_line(step("search[red shirt]"))
    assert "buy" in reasoning_line(step("click[buy now]"))
    assert "red" in reasoning_line(step("click[red]"))
    assert "open it" in reasoning_line(step("click[b07xyz1234]"))


def test_heldout_split_is_by_episode_and_seeded(demos: DemoSet) -> None:
    train, held = split_demonstrations(demos.demonstrations, 0.34, seed=1)
    assert len(held) == 2 and len(train) == 4
    assert {d.task_id for d in train}.isdisjoint(d.task_id for d in held)
    assert split_demonstrations(demos.demonstrations, 0.34, seed=1) == (train, held)
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_demonstrations(demos.demonstrations[:1], 0.5, seed=0)
    with pytest.raises(ValueError, match="SFTSettings.epochs"):
        SFTSettings(epochs=0).validate()


def test_sft_command_writes_a_model_folder_whose_heldout_loss_falls(
    tmp_path: Path, policy, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld_data"))
    out = tmp_path / "warm"
    args = ["sft", str(policy), str(out), "--env", "alfworld", "--num-tasks", "4", "--seed", "2"]
    args += ["--epochs", "3", "--heldout", "0.25", "--lr", "5e-3", "--batch-size", "8", "--constrained"]
    args += ["--history-length", "0"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "demonstrations: 4 episodes" in text
    assert [line.startswith(f"sft epoch {e}/3") for e in (1, 2, 3) for line in text.splitlines()].count(
        True
    ) == 3
    report = json.loads((out / "sft.json").read_text())
    losses = [row["heldout_loss"] for row in report["epochs"]]
    assert report["heldout_episodes"] == 1 and report["train_episodes"] == 3
    assert [row["epoch"] for row in report["epochs"]] == [0, 1, 2, 3]  # 0: before training
    assert losses[-1] < losses[0], losses
    model, tok = load_policy(out)
    base, _ = load_policy(policy)
    assert len(tok) == len(load_policy(policy)[1])
    assert not torch.equal(model.model.embed_tokens.weight, base.model.embed_tokens.weight)
    GAGPOConfig().llm(model_path=str(out)).validate_gagpo()


def test_cached_warm_start_is_reused_until_its_key_changes(demos: DemoSet, policy, tmp_path) -> None:
    small = DemoSet(demos.demonstrations[:3])
    settings = SFTSettings(epochs=1, heldout_fraction=0.34, batch_size=8)
    calls = []

    def source() -> DemoSet:
        calls.append(1)
        return small

    kwargs = dict(settings=settings, progress=None, **TEMPLATES)
    first = finetune(policy, source, tmp_path / "w", cache_key="a", **kwargs)
    stamp = (tmp_path / "w" / "model.safetensors").stat().st_mtime_ns
    again = finetune(policy, source, tmp_path / "w", cache_key="a", **kwargs)
    assert len(calls) == 1 and again.epochs == first.epochs
    assert (tmp_path / "w" / "model.safetensors").stat().st_mtime_ns == stamp
    finetune(policy, source, tmp_path / "w", cache_key="b", **kwargs)
    assert len(calls) == 2 and json.loads((tmp_path / "w" / "sft.json").read_text())["cache_key"] == "b"


def test_a_bf16_warm_start_trains_fp32_masters_and_saves_bf16(demos: DemoSet, policy, tmp_path) -> None:
    small = DemoSet(demos.demonstrations[:3])
    base = load_policy(policy)[0].state_dict()
    settings = SFTSettings(epochs=3, heldout_fraction=0.34, batch_size=8, lr=1e-5, dtype="bfloat16")
    finetune(policy, small, tmp_path / "w", settings=settings, progress=None, **TEMPLATES)
    saved, _ = load_policy(tmp_path / "w", dtype=torch.bfloat16)
    weights = {n: p for n, p in saved.named_parameters() if n.endswith("proj.weight")}
    assert all(p.dtype == torch.bfloat16 for p in weights.values())
    # An lr-1e-5 AdamW step is below bf16's resolution on most weights: only fp32 masters accumulate it. Over three
    # epochs most saved bf16 weights differ from the base's (0.57 here; pure-bf16 training changes 0.16).
    changed = sum(int((p != base[n].to(torch.bfloat16)).sum()) for n, p in weights.items())
    assert changed / sum(p.numel() for p in weights.values()) > 0.4
