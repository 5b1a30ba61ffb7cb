"""Lucene-like analysis and BM25 scoring against scores worked out from the BM25 formula by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.webshop.analyzer import LUCENE_STOP_WORDS, analyze, stem
from envs.webshop.bm25 import BM25Index, lucene_length
from envs.webshop.catalogue import build_catalogue
from envs.webshop.shop import WebShop


def test_analyzer_stop_words_possessives_stemming_and_tokens():
    assert len(LUCENE_STOP_WORDS) == 33
    assert analyze("The Women's Running Shoes, for the Beach") == ["women", "run", "shoe", "beach"]
    # Numbers keep their separators; hyphens split; letters across an apostrophe stay one token.
    assert analyze("3.5 oz 1,000 x-large don't") == ["3.5", "oz", "1,000", "x", "larg", "don't"]


@pytest.mark.parametrize(
    ("length", "rounded"), [(0, 0), (23, 23), (24, 24), (40, 40), (41, 40), (100, 96), (1000, 984)]
)
def test_lucene_length_rounding(length, rounded):
    # Above 23: 24 + (length - 24) cut to its 4 leading bits, e.g. 76 = 0b1001100 -> 0b1001000 = 72,
    # 976 = 0b1111010000 -> 0b1111000000 = 960.
    assert lucene_length(length) == rounded


def test_bm25_scores_match_the_formula():
    docs = ["red apple", "green apple apples", "red car"]
    index = BM25Index(docs, k1=0.9, b=0.4)
    average = 7 / 3  # lengths 2, 3, 2 after analysis (apple and apples stem alike)
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))

    def term(tf, length):
        return idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * length / average))

    scores = index.scores("apple")
    assert scores == pytest.approx([term(1, 2), term(2, 3), 0.0])
    # A repeated query word counts twice (Lucene's boost), an unknown word adds nothing.
    assert index.scores("apple apple zebra") == pytest.approx(2 * scores)
    assert index.search("apple") == [1, 0]
    assert index.search("zebra") == []


def test_bm25_uses_rounded_lengths_with_exact_average():
    long_doc = "word " * 99 + "target"
    docs = [long_doc, "target other", "filler text"]
    index = BM25Index(docs)
    average = (100 + 2 + 2) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    expected = idf / (1 + 0.9 * (1 - 0.4 + 0.4 * 96 / average))
    assert index.scores("target")[0] == pytest.approx(expected)


def test_ties_keep_document_order_and_k_cuts():
    index = BM25Index(["shoe"] * 8 + ["boot"])
    assert index.search("shoe", k=3) == [0, 1, 2]


def test_empty_index_is_an_error():
    with pytest.raises(ValueError, match="at least one document"):
        BM25Index([])


@pytest.mark.parametrize(
    ("word", "stemmed"),
    [
        # Lucene's Porter stemmer (Martin Porter's reference code), not the 1980 paper's algorithm:
        ("technology", "technolog"),  # 'logi' -> 'log' (the paper keeps 'technologi')
        ("possibly", "possibl"),  # 'bli' -> 'ble', then the final e goes (the paper keeps 'possibli')
        ("xs", "xs"),  # words of one or two letters are left alone (the paper gives 'x')
        ("us", "us"),
        ("is", "is"),
        # Rules both share:
        ("running", "run"),
        ("generalization", "gener"),
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("happy", "happi"),
    ],
)
def test_stemmer_follows_lucene_porter(word, stemmed):
    assert stem(word) == stemmed


def test_analyzer_keeps_short_words_and_lucene_stems():
    assert analyze("XS Technology for us, possibly") == ["xs", "technolog", "us", "possibl"]


def test_ties_are_ordered_by_doc_id_ascending_also_at_the_cut():
    docs = ["shoe"] * 5 + ["shoe shoe", "boot"]
    ids = ["B05", "B03", "B04", "B01", "B02", "B09", "B00"]
    index = BM25Index(docs, doc_ids=ids)
    # The two-'shoe' document scores highest; the five equal ones follow by id, and k cuts inside the tie.
    assert index.search("shoe", k=4) == [5, 3, 4, 1]
    assert index.search("shoe") == [5, 3, 4, 1, 2, 0]
    with pytest.raises(ValueError, match="2 doc_ids for 7 documents"):
        BM25Index(docs, doc_ids=ids[:2])


def test_shop_search_orders_tied_products_by_asin():
    file_order = ["B0000000Z9", "B0000000A2", "B0000000M5", "B0000000A1"]
    records = [
        {"asin": asin, "name": "Canvas Tote Bag", "pricing": "$10.00", "small_description": "Roomy."}
        for asin in file_order
    ]
    attributes = {a: {"instruction": "a tote bag", "instruction_attributes": ["roomy"]} for a in file_order}
    shop = WebShop(build_catalogue(records, attributes, {}), noun_extractor="fallback")
    assert [p["asin"] for p in shop.catalogue.products] == file_order
    assert shop.search("canvas tote") == sorted(file_order)


def test_scores_are_lucene_float32():
    docs = ["red apple", "green apple apples", "red car"]
    index = BM25Index(docs)
    scores = index.scores("apple apple apple")
    assert scores.dtype == np.float32
    f = np.float32
    idf = f(math.log(1 + (3 - 2 + 0.5) / (2 + 0.5)))
    average = f(7 / 3)
    factor = f(1) / (f(0.9) * ((f(1) - f(0.4)) + f(0.4) * f(3) / average))  # the length-3 document
    weight = f(3) * idf
    assert scores[1] == weight - weight / (f(1) + f(2) * factor)
