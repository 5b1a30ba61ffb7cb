"""Lucene-like English text analysis for the product search index.

The original WebShop searched with Lucene's English analysis (standard tokenisation, possessive stripping,
lower-casing, Lucene's 33 default stop words, Porter stemming). Queries and documents go through the same
analyser, so the same words meet in the index whatever their surface form.

Lucene's Porter stemmer is Martin Porter's reference implementation, which departs from the published 1980
algorithm: words of one or two letters are left alone ('xs', 'us'), 'logi' becomes 'log' ('technology' ->
'technolog') and 'bli' becomes 'ble' ('possibly' -> 'possibl'). NLTK's ``PorterStemmer`` in its
``MARTIN_EXTENSIONS`` mode implements exactly that variant (the Snowball 'porter' stemmer implements the paper).
"""

from __future__ import annotations

import re
from functools import lru_cache

from nltk.stem.porter import PorterStemmer

__all__ = ["LUCENE_STOP_WORDS", "analyze", "stem"]

LUCENE_STOP_WORDS: frozenset[str] = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)

# Word runs joined as in Unicode word segmentation: letters across an apostrophe, period or colon (don't, u.s),
# digits across a comma, period or semicolon (1,000 and 3.5); underscores and letter-digit runs stay one token.
_TOKEN = re.compile(r"\w+(?:(?:(?<=[^\W\d])[.'’:](?=[^\W\d])|(?<=\d)[.,;'’](?=\d))\w+)*")
_POSSESSIVE = re.compile(r"['’]s$")
_MAX_TOKEN_LENGTH = 255

_STEMMER = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)


@lru_cache(maxsize=1 << 18)
def stem(word: str) -> str:
    """Lucene's Porter stem of a lower-cased word (memoised: catalogues repeat their words)."""
    return _STEMMER.stem(word, to_lowercase=False)


def analyze(text: str) -> list[str]:
    """Index terms of ``text`` in order, repeated as often as they occur."""
    terms = []
    for match in _TOKEN.finditer(text.lower()):
        token = _POSSESSIVE.sub("", match.group())
        if not token or token in LUCENE_STOP_WORDS or len(token) > _MAX_TOKEN_LENGTH:
            continue
        terms.append(stem(token))
    return terms
