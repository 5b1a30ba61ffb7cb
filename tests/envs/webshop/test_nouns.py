"""The pluggable noun extractors: the spaCy adapter on a real pipeline, the choice logic, the fallback."""

from __future__ import annotations

import pytest

from envs.webshop.nouns import _SPACY_MODELS, fallback_nouns, make_noun_extractor, spacy_nouns


def test_spacy_adapter_keeps_noun_and_propn_tokens():
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("attribute_ruler")
    ruler.add([[{"LOWER": "shoes"}]], {"POS": "NOUN"})
    ruler.add([[{"LOWER": "nike"}]], {"POS": "PROPN"})
    ruler.add([[{"LOWER": "red"}]], {"POS": "ADJ"})
    assert spacy_nouns(nlp)("Red Nike Shoes for running") == ["nike", "shoes"]


def test_choice_of_extractor():
    extractor, name = make_noun_extractor("fallback")
    assert extractor is fallback_nouns and name == "fallback"
    with pytest.raises(ValueError, match="noun_extractor"):
        make_noun_extractor("nltk")
    auto_extractor, auto_name = make_noun_extractor("auto")
    if auto_name == "fallback":
        # No English spaCy model is installed: 'auto' falls back and 'spacy' is refused with the model names.
        assert auto_extractor is fallback_nouns
        with pytest.raises(ValueError, match=_SPACY_MODELS[0]):
            make_noun_extractor("spacy")
    else:
        assert auto_name == "spacy" and make_noun_extractor("spacy")[1] == "spacy"
