"""Similarity grouping: near-identical state texts of one group share one anchor state.

With ``GAGPOConfig.gagpo(similarity_threshold=t)`` the state keys of each group are replaced by anchor keys before
``compute_advantages``, so GAGPO's V(s) and GiGPO's step groups pool over near-identical observations (the GiGPO
reference's ``enable_similarity`` / ``similarity_thresh``).

- Text: the state key itself when it is a str (the env's key: the observation text in ALFWorld and the maze), else
  ``str(key)``.
- Ratio: ``rapidfuzz.distance.Indel.normalized_similarity`` = 1 - (insertions + deletions) / (len(a) + len(b)),
  i.e. ``fuzz.ratio / 100``; two texts are similar when it is >= t. It is 1 only for equal texts, so t = 1 is exact
  matching.
- One pass per group, deterministic and independent of row order: the group's distinct texts are visited by
  decreasing count, ties by text; each joins the most similar anchor so far (ties: the earliest anchor) or, if none
  reaches t, becomes a new anchor. Members are compared with anchors only, so a chain a~b~c with a not~c gives
  {a, b} and {c} (a is visited first), never one transitive cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["anchor_keys", "check_threshold"]


def check_threshold(threshold: object, field: str = "GAGPOConfig.similarity_threshold") -> float:
    """The threshold as a float in (0, 1]; raises ValueError naming ``field`` otherwise."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)):
        raise ValueError(f"{field} must be None or a number in (0, 1], got {threshold!r}")
    value = float(threshold)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{field} must be None or a number in (0, 1], got {threshold!r}")
    _rapidfuzz(field)
    return value


def _rapidfuzz(field: str):
    """rapidfuzz's (process, Indel), imported on first use: only similarity grouping needs it."""
    try:
        from rapidfuzz import process
        from rapidfuzz.distance import Indel
    except ImportError as err:
        raise ValueError(
            f"{field}: similarity grouping needs rapidfuzz (pip install 'rapidfuzz>=3.5'): {err}"
        ) from err
    return process, Indel


def _text(key: Hashable) -> str:
    return key if isinstance(key, str) else str(key)


def anchor_keys(group_id: Sequence[int] | np.ndarray, keys: Sequence[Hashable], threshold: float) -> list:
    """Per row, the key of its anchor state: keys of one group whose texts reach ``threshold`` share one."""
    threshold = check_threshold(threshold, "threshold")
    process, indel = _rapidfuzz("threshold")
    groups = np.asarray(group_id)
    if len(groups) != len(keys):
        raise ValueError(f"group_id ({len(groups)}) and keys ({len(keys)}) differ in length")
    out = list(keys)
    rows_of: dict[int, list[int]] = {}
    for row, g in enumerate(groups.tolist()):
        rows_of.setdefault(g, []).append(row)
    for rows in rows_of.values():
        counts = Counter(keys[r] for r in rows)
        texts = {k: _text(k) for k in counts}
        order = sorted(counts, key=lambda k: (-counts[k], texts[k]))
        anchors: list[Hashable] = []
        anchor_texts: list[str] = []
        anchor_of: dict[Hashable, Hashable] = {}
        for key in order:
            best = process.extractOne(
                texts[key], anchor_texts, scorer=indel.normalized_similarity, score_cutoff=threshold
            )
            if best is None:
                anchors.append(key)
                anchor_texts.append(texts[key])
                anchor_of[key] = key
            else:
                anchor_of[key] = anchors[best[2]]
        for r in rows:
            out[r] = anchor_of[keys[r]]
    return out
