"""The tiny offline policy builder and the policy loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gagpo_rllib.policy.models import (
    SPECIAL_TOKENS,
    build_tiny_policy,
    cpu_compute_dtype,
    inputs_digest,
    load_policy,
)

CORPUS = ["go north. go south. go east. go west. take the key. open the door. you are in the kitchen."] * 50


def test_build_round_trips_through_auto_classes(tiny_policy_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_policy_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert tok.padding_side == "left"
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    text = "Go north to the kitchen: 3 exits, café ∑ 日本"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_chat_template_is_chatml(tiny_policy_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_policy_path)
    out = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(out)["input_ids"]
    assert ids.count(1) == 2 and ids.count(2) == 1  # special tokens are single ids, never split


def test_tokenizer_applies_nfc(tiny_policy_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_policy_path)
    assert tok("e\u0301")["input_ids"] == tok("\u00e9")["input_ids"]


def test_build_is_cached_and_deterministic(tmp_path: Path) -> None:
    a = build_tiny_policy(tmp_path / "a", corpus=CORPUS, vocab_size=300, seed=3)
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_policy(tmp_path / "a", corpus=CORPUS, vocab_size=300, seed=3) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp
    b = build_tiny_policy(tmp_path / "b", corpus=CORPUS, vocab_size=300, seed=3)
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads((b / "tokenizer.json").read_text())
    ma, _ = load_policy(a)
    mb, _ = load_policy(b)
    for (na, pa), (_, pb) in zip(ma.state_dict().items(), mb.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), na


def test_changed_parameters_rebuild(tmp_path: Path) -> None:
    a = build_tiny_policy(tmp_path / "a", corpus=CORPUS, vocab_size=300, seed=0)
    w0 = load_policy(a)[0].model.embed_tokens.weight.clone()
    build_tiny_policy(tmp_path / "a", corpus=CORPUS, vocab_size=300, seed=1)
    w1 = load_policy(a)[0].model.embed_tokens.weight
    assert not torch.equal(w0, w1)


def test_an_untied_build_has_its_own_output_projection(tmp_path: Path) -> None:
    tied = build_tiny_policy(tmp_path / "m", corpus=CORPUS, vocab_size=300, seed=0)
    key = json.loads((tied / "gagpo_tiny_build.json").read_text())
    assert "tie_word_embeddings" not in key  # existing tied builds keep their cache key
    untied = build_tiny_policy(
        tmp_path / "m", corpus=CORPUS, vocab_size=300, seed=0, tie_word_embeddings=False
    )
    model = load_policy(untied)[0]
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    tied_model = load_policy(build_tiny_policy(tmp_path / "m", corpus=CORPUS, vocab_size=300, seed=0))[0]
    assert tied_model.lm_head.weight.data_ptr() == tied_model.model.embed_tokens.weight.data_ptr()


def test_bad_build_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_policy(tmp_path, corpus=CORPUS, vocab_size=10)
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_policy(tmp_path, corpus=CORPUS, hidden_size=63, num_heads=2)
    with pytest.raises(ValueError, match="corpus"):
        build_tiny_policy(tmp_path, corpus=[])


def test_load_policy_is_ready_for_rl(tiny_policy_path: Path) -> None:
    model, tok = load_policy(tiny_policy_path)
    assert not model.training
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert model.config.attention_dropout == 0.0
    ids = torch.tensor([tok("go north")["input_ids"]])
    with torch.no_grad():
        a = model(ids).logits
        model.train()
        b = model(ids).logits
    assert torch.equal(a, b)  # no dropout left in train mode


def test_load_policy_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_policy(missing)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty_dir"):
        load_policy(empty)


def test_local_looking_names_never_reach_the_hub(tmp_path: Path, tiny_policy_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="models/tiny/policy"):
        load_policy("models/tiny/policy")  # more than one slash: a path, not a hub id
    broken = tmp_path / "no_weights"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_policy_path / "config.json").read_text())
    with pytest.raises(ValueError, match="no_weights"):
        load_policy(broken)


def test_inputs_digest_follows_file_bytes_names_and_texts(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("go north")
    b.write_text("go north")
    key = inputs_digest(files=[a], texts=["t"])
    assert inputs_digest(files=[a], texts=["t"]) == key
    assert inputs_digest(files=[b], texts=["t"]) != key  # another file name
    assert inputs_digest(files=[a], texts=["u"]) != key
    a.write_text("go south")
    assert inputs_digest(files=[a], texts=["t"]) != key
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        inputs_digest(files=[tmp_path / "missing.txt"])


def test_cache_keyed_by_inputs_skips_the_corpus_and_rebuilds_when_they_change(tmp_path: Path) -> None:
    source = tmp_path / "texts.txt"
    source.write_text("go north. take the key. open the door.")
    calls: list[str] = []

    def corpus() -> list[str]:
        calls.append(source.read_text())
        return [source.read_text()] * 50

    def build() -> Path:
        key = inputs_digest(files=[source])
        return build_tiny_policy(tmp_path / "p", corpus=corpus, corpus_key=key, vocab_size=300)

    out = build()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build() == out and len(calls) == 1  # cache hit: the corpus is not even produced
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    source.write_text("climb the xylophone. zigzag quietly.")
    build()
    assert len(calls) == 2
    tok = AutoTokenizer.from_pretrained(out)
    assert "Ġxylophone" in tok.get_vocab() and "Ġnorth" not in tok.get_vocab()


def test_cpu_compute_dtype_is_bf16_only_where_the_cpu_computes_it(tmp_path: Path) -> None:
    """bf16 needs AMX or AVX-512 BF16 (elsewhere torch emulates it, far slower than float32); an unreadable
    cpuinfo means float32."""
    cases = {
        "flags\t\t: fpu sse2 avx2 fma avx512f avx512bw amx_bf16 amx_tile": "bfloat16",
        "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16": "bfloat16",
        "flags\t\t: fpu sse2 avx2 fma": "float32",
        "flags\t\t: fpu avx512f avx512_bf16x": "float32",
    }
    for i, (text, want) in enumerate(cases.items()):
        info = tmp_path / f"cpuinfo{i}"
        info.write_text(f"processor\t: 0\n{text}\n")
        assert cpu_compute_dtype(info) == want, text
    assert cpu_compute_dtype(tmp_path / "missing") == "float32"
