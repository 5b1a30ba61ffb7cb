"""Supervised warm start: fine-tune a causal LM on demonstrations with the prompts and softmax of training.

Every demonstrated step becomes the prompt the RL policy would see (``PromptBuilder`` with the env's templates,
history and token budget) and the action tokens the rollout would emit: with constrained decoding the action text
plus the end token, scored by ``action_logprobs`` over the same allowed-token sets as the sampler (the token trie
of the step's admissible actions); in free mode the answer format a chat model must produce,
``<think>reason</think><action>...</action>`` (a short reason from ``demonstrations.reasoning_line``) plus the
end token, unconstrained: the format warm start that makes a small or base model's answers parseable. The
loss is the mean negative log-prob per action token. Demonstrations are split into training and held-out episodes
from an explicit seed; each epoch prints one progress line with the held-out loss, and the result is a model
folder that ``GAGPOConfig.llm(model_path=...)`` starts from.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gagpo_rllib.method.seeds import SFT_HELDOUT_SALT, SFT_ORDER_SALT, SFT_SUBSET_SALT, salted_rng
from gagpo_rllib.policy.generation.base import ActionTrie, action_token_ids, end_token_id
from gagpo_rllib.policy.logprobs import action_logprobs
from gagpo_rllib.policy.models import DTYPES, load_policy
from gagpo_rllib.rllib.connectors.rollout import PromptBuilder
from gagpo_rllib.tools.demonstrations import Demonstration, DemoSet, reasoning_line

__all__ = ["Example", "SFTResult", "SFTSettings", "build_examples", "finetune", "split_demonstrations"]

logger = logging.getLogger(__name__)

MANIFEST = "sft.json"


@dataclass
class SFTSettings:
    """How to fine-tune; the prompt fields must match the RL config the model is trained with afterwards."""

    epochs: int = 30
    lr: float = 2e-3
    batch_size: int = 16
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    heldout_fraction: float = 0.1
    seed: int = 0
    history_length: int = 2
    max_prompt_tokens: int | None = None
    constrained: bool = True
    temperature: float = 1.0
    # Compute dtype: the weights and AdamW state stay float32 (masters), forwards run in this dtype (autocast),
    # and the saved model is written in it.
    dtype: str = "float32"
    device: str | None = None
    # Free mode: put a short reason in <think> before the action (False: the bare <action> tag).
    think: bool = True
    system_prompt: str | None = None
    # At most this many training steps (drawn from ``seed``; None: all): sizes a warm start to a time budget.
    max_train_steps: int | None = None

    def validate(self) -> None:
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"SFTSettings.{name} must be {expected}, got {getattr(self, name)!r}")

        need(isinstance(self.epochs, int) and self.epochs >= 1, "epochs", "an int >= 1")
        need(self.lr > 0, "lr", "> 0")
        need(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", "an int >= 1")
        need(self.weight_decay >= 0, "weight_decay", ">= 0")
        need(self.grad_clip > 0, "grad_clip", "> 0")
        need(0.0 <= self.heldout_fraction < 1.0, "heldout_fraction", "in [0, 1)")
        need(
            isinstance(self.history_length, int) and self.history_length >= 0, "history_length", "an int >= 0"
        )
        need(
            self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "max_prompt_tokens", "None or >= 1"
        )
        need(self.temperature > 0, "temperature", "> 0")
        need(self.dtype in DTYPES, "dtype", f"one of {sorted(DTYPES)}")
        need(
            self.system_prompt is None or isinstance(self.system_prompt, str),
            "system_prompt",
            "None or a str",
        )
        need(
            self.max_train_steps is None
            or (isinstance(self.max_train_steps, int) and self.max_train_steps >= 1),
            "max_train_steps",
            "None or an int >= 1",
        )


@dataclass
class Example:
    """One demonstrated step as token ids; ``allowed[k]`` lists the tokens allowed at action position k."""

    prompt_ids: list[int]
    action_ids: list[int]
    allowed: list[list[int]] | None
    demo: int


@dataclass
class SFTResult:
    """What ``finetune`` wrote and measured (also stored as ``sft.json`` in the model folder)."""

    out_dir: str
    base_model: str
    settings: dict
    train_episodes: int
    heldout_episodes: int
    train_steps: int
    heldout_steps: int
    epochs: list[dict] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    cache_key: str | None = None


def split_demonstrations(
    demos: Sequence[Demonstration], fraction: float, seed: int
) -> tuple[list[Demonstration], list[Demonstration]]:
    """(train, held-out) by whole episodes, drawn from ``seed``; at least one held-out episode when fraction > 0."""
    if not demos:
        raise ValueError("demonstrations: none to train on")
    n_held = 0 if fraction <= 0 else max(1, round(fraction * len(demos)))
    if n_held >= len(demos):
        raise ValueError(
            f"heldout_fraction {fraction} leaves no training episode out of {len(demos)} demonstrations"
        )
    order = salted_rng(seed, SFT_HELDOUT_SALT).permutation(len(demos))
    held = set(order[:n_held].tolist())
    return [d for i, d in enumerate(demos) if i not in held], [d for i, d in enumerate(demos) if i in held]


def build_examples(
    demos: Sequence[Demonstration],
    tokenizer: PreTrainedTokenizerBase,
    *,
    first_template: str,
    template: str,
    history_length: int = 2,
    max_prompt_tokens: int | None = None,
    constrained: bool = True,
    think: bool = True,
    system_prompt: str | None = None,
) -> list[Example]:
    """Token-level examples of every step, with the prompts and allowed sets the RL rollout would use."""
    builder = PromptBuilder(
        tokenizer,
        template=template,
        first_template=first_template,
        history_length=history_length,
        max_prompt_tokens=max_prompt_tokens,
        system_prompt=system_prompt,
    )
    eos = end_token_id(tokenizer)
    examples: list[Example] = []
    for d, demo in enumerate(demos):
        for step in demo.steps:
            prompt = builder.build(
                task=step.task,
                observation=step.observation,
                admissible_actions=list(step.prompt_actions),
                history=list(step.history),
                step=step.step,
            )
            prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if constrained:
                if step.action not in step.admissible:
                    raise ValueError(
                        f"demonstration {demo.source} step {step.step}: action {step.action!r} is not admissible"
                    )
                action_ids = action_token_ids(tokenizer, [step.action])[0]
                trie = ActionTrie(action_token_ids(tokenizer, list(step.admissible)))
                allowed = [trie.allowed(action_ids[:k]) for k in range(len(action_ids))]
            else:
                text = f"<action>{step.action}</action>"
                if think:
                    text = f"<think>{reasoning_line(step)}</think>" + text
                action_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos]
                allowed = None
            examples.append(Example(prompt_ids, action_ids, allowed, d))
    return examples


def _batches(examples: Sequence[Example], batch_size: int, rng: np.random.Generator) -> list[list[Example]]:
    """Shuffled batches of similar prompt lengths (less padding): shuffle, sort within windows of 8 batches."""
    order = rng.permutation(len(examples))
    window = batch_size * 8
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].prompt_ids))
        batches += [
            [examples[i] for i in chunk[b : b + batch_size]] for b in range(0, len(chunk), batch_size)
        ]
    return [batches[i] for i in rng.permutation(len(batches))]


def _masks(batch: Sequence[Example], vocab_size: int) -> list[torch.Tensor] | None:
    if batch[0].allowed is None:
        return None
    masks = []
    for ex in batch:
        mask = torch.zeros(len(ex.action_ids), vocab_size, dtype=torch.bool)
        for k, ids in enumerate(ex.allowed or []):
            mask[k, ids] = True
        masks.append(mask)
    return masks


def _batch_loss(
    model: PreTrainedModel,
    batch: Sequence[Example],
    *,
    pad_token_id: int,
    vocab_size: int,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean NLL per token, summed NLL, per-example action log-prob) of a batch."""
    logp, mask, _ = action_logprobs(
        model,
        [ex.prompt_ids for ex in batch],
        [ex.action_ids for ex in batch],
        pad_token_id=pad_token_id,
        temperature=temperature,
        allowed_masks=_masks(batch, vocab_size),
    )
    total = -(logp * mask).sum()
    return total / mask.sum(), total, (logp * mask).sum(-1)


def _evaluate(model: PreTrainedModel, examples: Sequence[Example], batch_size: int, **kw) -> dict[str, float]:
    if not examples:
        return {"loss": math.nan, "action_prob": math.nan}
    nll, tokens, probs = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            _, total, seq_logp = _batch_loss(model, batch, **kw)
            nll += float(total)
            tokens += sum(len(ex.action_ids) for ex in batch)
            probs.extend(torch.exp(seq_logp).tolist())
    return {"loss": nll / tokens, "action_prob": float(np.mean(probs))}


def _read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        logger.warning("finetune: unreadable %s, training again", path)
        return None


def finetune(
    model_path: str | Path,
    demos: DemoSet | Callable[[], DemoSet],
    out_dir: str | Path,
    *,
    first_template: str,
    template: str,
    settings: SFTSettings | None = None,
    cache_key: str | None = None,
    progress: Callable[[str], None] | None = print,
) -> SFTResult:
    """Fine-tune ``model_path`` on ``demos`` and save the model folder to ``out_dir``.

    With ``cache_key`` (a digest of the base model, the demonstrations' sources and the settings) an ``out_dir``
    already trained with that key is returned as is; ``demos`` may then be a callable, only called on a rebuild.
    """
    settings = settings or SFTSettings()
    settings.validate()
    out = Path(out_dir)
    if cache_key is not None:
        manifest = _read_manifest(out)
        if (
            manifest is not None
            and manifest.get("cache_key") == cache_key
            and (out / "config.json").is_file()
        ):
            return SFTResult(**manifest)
    demo_set = demos() if callable(demos) else demos
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_policy(model_path, dtype=torch.float32, device=device)
    compute = DTYPES[settings.dtype]
    precision = (
        torch.autocast(device_type=torch.device(device).type, dtype=compute)
        if compute != torch.float32
        else contextlib.nullcontext()
    )
    torch.manual_seed(settings.seed)
    train_demos, held_demos = split_demonstrations(
        demo_set.demonstrations, settings.heldout_fraction, settings.seed
    )
    common = dict(
        first_template=first_template,
        template=template,
        history_length=settings.history_length,
        max_prompt_tokens=settings.max_prompt_tokens,
        constrained=settings.constrained,
        think=settings.think,
        system_prompt=settings.system_prompt,
    )
    train_ex = build_examples(train_demos, tokenizer, **common)
    if settings.max_train_steps is not None and len(train_ex) > settings.max_train_steps:
        keep = salted_rng(settings.seed, SFT_SUBSET_SALT).choice(
            len(train_ex), size=settings.max_train_steps, replace=False
        )
        train_ex = [train_ex[i] for i in sorted(keep.tolist())]
    held_ex = build_examples(held_demos, tokenizer, **common)
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    kw = dict(
        pad_token_id=int(tokenizer.pad_token_id), vocab_size=vocab_size, temperature=settings.temperature
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    rng = salted_rng(settings.seed, SFT_ORDER_SALT)
    result = SFTResult(
        out_dir=str(out),
        base_model=str(model_path),
        settings=asdict(settings),
        train_episodes=len(train_demos),
        heldout_episodes=len(held_demos),
        train_steps=len(train_ex),
        heldout_steps=len(held_ex),
        skipped=dict(demo_set.skipped),
        cache_key=cache_key,
    )
    if progress:
        progress(
            f"sft: {len(train_demos)} episodes / {len(train_ex)} steps to train on, "
            f"{len(held_demos)} / {len(held_ex)} held out; {settings.epochs} epochs on {device}"
        )
    started = time.monotonic()
    model.eval()
    with precision:
        before = _evaluate(model, held_ex, settings.batch_size, **kw)
    result.epochs.append(
        {
            "epoch": 0,
            "train_loss": None,
            "heldout_loss": before["loss"],
            "heldout_action_prob": before["action_prob"],
            "elapsed_s": time.monotonic() - started,
        }
    )
    if progress:
        progress(
            f"sft before training  held-out loss {before['loss']:.4f}  "
            f"held-out action prob {before['action_prob']:.3f}"
        )
    for epoch in range(1, settings.epochs + 1):
        model.train()
        losses = []
        for batch in _batches(train_ex, settings.batch_size, rng):
            with precision:
                loss, _, _ = _batch_loss(model, batch, **kw)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            losses.append(float(loss.detach()))
        model.eval()
        with precision:
            held = _evaluate(model, held_ex, settings.batch_size, **kw)
        elapsed = time.monotonic() - started
        row = {
            "epoch": epoch,
            "train_loss": float(np.mean(losses)),
            "heldout_loss": held["loss"],
            "heldout_action_prob": held["action_prob"],
            "elapsed_s": elapsed,
        }
        result.epochs.append(row)
        if progress:
            eta = elapsed / epoch * (settings.epochs - epoch)
            progress(
                f"sft epoch {epoch}/{settings.epochs}  train loss {row['train_loss']:.4f}  "
                f"held-out loss {row['heldout_loss']:.4f}  held-out action prob {row['heldout_action_prob']:.3f}  "
                f"{elapsed:6.1f} s  ETA {eta:6.0f} s"
            )
    out.mkdir(parents=True, exist_ok=True)
    model.to(compute)
    model.config.dtype = settings.dtype
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MANIFEST).write_text(json.dumps(asdict(result), indent=1))
    del model, optimizer
    release_freed_memory()
    return result


def release_freed_memory() -> None:
    """Hand freed tensors back to the OS: glibc keeps freed heap pages mapped, so a warm start or a stopped
    algorithm in the driver would otherwise hold its memory (gigabytes at WebShop's prompt lengths) through the
    next stage, and the next stage's EnvRunners get killed by Ray's memory monitor."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to hand back this way
        ctypes.CDLL("libc.so.6").malloc_trim(0)
