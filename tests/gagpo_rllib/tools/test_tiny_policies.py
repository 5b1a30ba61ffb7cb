"""The tiny policies of the bundled environments (built offline, cached by their corpus's inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gagpo_rllib.tools.tiny_policies import alfworld_tiny_policy


def test_alfworld_tokenizer_reaches_its_vocabulary_and_fits_every_admissible_action(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gagpo_rllib.tools.demonstrations import alfworld_demonstrations

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld_data"))
    demo_set = alfworld_demonstrations({"split": "train"})
    replays: list[int] = []

    def demonstrations():
        replays.append(1)
        return demo_set

    out = alfworld_tiny_policy(tmp_path / "alfworld", vocab_size=1024, demonstrations=demonstrations)
    assert alfworld_tiny_policy(tmp_path / "alfworld", demonstrations=demonstrations) == out
    assert len(replays) == 1
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 1024
    actions = sorted({a for d in demo_set.demonstrations for s in d.steps for a in s.admissible})
    lengths = []
    for action in actions:
        ids = tok(action, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == action
        lengths.append(len(ids))
    # With the end token every action fits the CPU default's max_new_tokens=16, most words are single tokens.
    assert max(lengths) + 1 <= 16
    words = [len(a.split()) + sum(c.isdigit() for c in a) for a in actions]  # digits are split one by one
    whole = sum(n <= w for n, w in zip(lengths, words, strict=True))
    assert whole >= 0.99 * len(actions), whole
