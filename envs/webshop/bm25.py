"""BM25 retrieval scored as Lucene scores it, over a sparse term-document matrix.

Lucene (the original WebShop's engine) stores each document's length in one byte, so lengths above 23 are
rounded down to four significant bits before scoring; the average length stays exact. Reproducing that rounding
and Lucene's query-term boosts (a word repeated in the query counts that many times) gives the original's scores
and rankings, which a plain BM25 does not. Scores per (term, document) are precomputed, so a query costs one
sparse row gather and a partial sort.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from envs.webshop.analyzer import analyze

__all__ = ["BM25Index", "lucene_length"]

_FREE_VALUES = 24  # byte codes kept for exact small lengths (255 minus the 4-bit code of 2**31 - 1)


def _int4_round(value: int) -> int:
    """``value`` rounded down to its four most significant bits (the implicit leading bit plus three)."""
    bits = value.bit_length()
    if bits < 4:
        return value
    shift = bits - 4
    return (value >> shift) << shift


def lucene_length(length: int) -> int:
    """The document length Lucene scores with after its one-byte length encoding."""
    if length < _FREE_VALUES:
        return length
    return _FREE_VALUES + _int4_round(length - _FREE_VALUES)


class BM25Index:
    """Top-k BM25 (Lucene's variant) over analysed documents; ties keep document order."""

    def __init__(self, documents: Sequence[str], *, k1: float = 0.9, b: float = 0.4):
        if not documents:
            raise ValueError("BM25Index needs at least one document")
        self.k1, self.b = k1, b
        vocabulary: dict[str, int] = {}
        rows, cols, counts, lengths = [], [], [], np.empty(len(documents), dtype=np.float64)
        for doc_id, text in enumerate(documents):
            terms = Counter(analyze(text))
            lengths[doc_id] = sum(terms.values())
            for term, count in terms.items():
                rows.append(vocabulary.setdefault(term, len(vocabulary)))
                cols.append(doc_id)
                counts.append(count)
        self.vocabulary = vocabulary
        self.num_docs = len(documents)
        tf = np.asarray(counts, dtype=np.float64)
        cols_arr = np.asarray(cols, dtype=np.int64)
        rows_arr = np.asarray(rows, dtype=np.int64)
        doc_freq = np.bincount(rows_arr, minlength=len(vocabulary)).astype(np.float64)
        idf = np.log1p((self.num_docs - doc_freq + 0.5) / (doc_freq + 0.5))
        average = lengths.sum() / self.num_docs if lengths.sum() > 0 else 1.0
        rounded = np.array([lucene_length(int(n)) for n in lengths], dtype=np.float64)
        norm = k1 * (1.0 - b + b * rounded / average)
        weights = idf[rows_arr] * tf / (tf + norm[cols_arr])
        self._matrix = sparse.csr_matrix(
            (weights, (rows_arr, cols_arr)), shape=(len(vocabulary), self.num_docs), dtype=np.float64
        )

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (0 where no query term occurs)."""
        terms = Counter(t for t in analyze(query) if t in self.vocabulary)
        out = np.zeros(self.num_docs, dtype=np.float64)
        for term, boost in terms.items():
            row = self.vocabulary[term]
            start, end = self._matrix.indptr[row], self._matrix.indptr[row + 1]
            out[self._matrix.indices[start:end]] += boost * self._matrix.data[start:end]
        return out

    def search(self, query: str, k: int = 50) -> list[int]:
        """Indices of the top ``k`` matching documents, best first; only documents sharing a term match."""
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        if matched.size == 0:
            return []
        if matched.size > k:
            matched = matched[np.argpartition(-scores[matched], k - 1)[:k]]
            # Ties at the cut-off: keep the earliest documents, as Lucene does.
            cutoff = scores[matched].min()
            candidates = np.flatnonzero(scores >= cutoff)
            matched = candidates
        order = np.lexsort((matched, -scores[matched]))
        return matched[order][:k].tolist()
