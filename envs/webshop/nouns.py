"""Noun extraction for the reward's title match, pluggable because the original's spaCy model is optional.

The original counts the NOUN/PROPN tokens of the goal and purchased product names with spaCy's en_core_web_sm.
``spacy`` uses any installed English spaCy pipeline; ``fallback`` needs nothing: it keeps alphabetic words of two
or more letters that are not function words, numbers, units or common adjectives, which over-counts some
adjectives and so scores title overlap slightly differently. ``auto`` takes spaCy when a model loads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

__all__ = ["NounExtractor", "fallback_nouns", "make_noun_extractor", "spacy_nouns"]

logger = logging.getLogger(__name__)

_SPACY_MODELS = ("en_core_web_sm", "en_core_web_md", "en_core_web_lg")
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_NOT_NOUNS = frozenset(
    """
    a an the and or but nor for so yet of in on at by to from with without into onto over under up down out off
    about above below between among through during before after since until per via as than then this that these
    those it its is are was were be been being has have had do does did can could will would should may might must
    i you he she we they me him her us them my your his our their mine yours which who whom whose what when where
    why how all any both each every few more most other some such no not only own same very too just also
    new large small big little long short high low light dark soft hard hot cold warm cool old young good great
    best better easy free full half extra super ultra mini premium natural organic original classic modern
    perfect durable portable adjustable compatible comfortable waterproof lightweight heavy strong thick thin wide
    oz fl ml lb lbs kg g mm cm inch inches ft pcs pc count pack set
    """.split()  # noqa: SIM905 (a word list reads better as text)
)

NounExtractor = Callable[[str], list[str]]


def fallback_nouns(text: str) -> list[str]:
    """Lower-cased content words of ``text``: a dependency-free stand-in for a POS tagger's nouns."""
    return [
        w for w in (m.group().lower() for m in _WORD.finditer(text)) if len(w) > 1 and w not in _NOT_NOUNS
    ]


def spacy_nouns(nlp: Any) -> NounExtractor:
    """An extractor over a loaded spaCy pipeline: the lower-cased NOUN and PROPN tokens, memoised per text."""

    @lru_cache(maxsize=1 << 16)
    def nouns(text: str) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in nlp(text) if t.pos_ in ("NOUN", "PROPN"))

    return lambda text: list(nouns(text))


def _load_spacy() -> NounExtractor | None:
    try:
        import spacy
    except ImportError:
        return None
    for model in _SPACY_MODELS:
        try:
            return spacy_nouns(spacy.load(model, disable=["parser", "ner", "lemmatizer"]))
        except (OSError, ImportError, ValueError):
            continue
    return None


@cache
def make_noun_extractor(kind: str = "auto") -> tuple[NounExtractor, str]:
    """(extractor, name of what runs): kind 'auto', 'spacy' (error if no model loads) or 'fallback'."""
    if kind not in ("auto", "spacy", "fallback"):
        raise ValueError(f"noun_extractor must be 'auto', 'spacy' or 'fallback', got {kind!r}")
    if kind != "fallback":
        extractor = _load_spacy()
        if extractor is not None:
            return extractor, "spacy"
        if kind == "spacy":
            raise ValueError(
                f"noun_extractor 'spacy' needs one of the spaCy models {_SPACY_MODELS} installed"
            )
        logger.info("no spaCy English model installed: title nouns use the fallback extractor")
    return fallback_nouns, "fallback"
