"""Search commands a policy under constrained decoding can type: prefixes of the goal's query words.

A free-text ``search[...]`` cannot be sampled from a fixed list of admissible strings, so a tiny policy under
constrained decoding could only send the ``search[<your query>]`` placeholder. With ``search_grammar="goal_prefix"``
the env lists concrete search commands instead: ``search[w1]``, ``search[w1 w2]``, ..., ``search[w1 ... wn]``,
where w1..wn are the instruction's words in their order, lower-cased, without punctuation, stop words (Lucene's,
which the index drops anyway), request words ("i", "need", "looking", ...) and the price clause, at most
``max_search_words`` of them. Every prefix is a valid command (the grammar is "the goal's words in order; stop
anywhere"); as admissible strings they share prefixes, so a token trie over them lets the policy decide, word by
word, whether to type the next word or close the query. ``info["search_words"]`` holds w1..wn.
"""

from __future__ import annotations

import re

from envs.webshop.analyzer import LUCENE_STOP_WORDS

__all__ = ["GRAMMARS", "REQUEST_WORDS", "goal_search_commands", "goal_search_words"]

GRAMMARS = ("placeholder", "goal_prefix")
# Words of the request itself, not of the product ("i am looking for", "i would like", "i need").
REQUEST_WORDS = frozenset(
    {"i", "im", "am", "would", "like", "looking", "need", "want", "me", "please", "buy"}
)
_PRICE = re.compile(r",?\s*and price lower than .*$")
_WORD = re.compile(r"[a-z0-9]+(?:['.\-&][a-z0-9]+)*")


def goal_search_words(instruction: str, max_words: int = 10) -> list[str]:
    """The instruction's query words in order (see the module docstring), at most ``max_words``."""
    text = _PRICE.sub("", instruction.lower())
    words = [w for w in _WORD.findall(text) if w not in LUCENE_STOP_WORDS and w not in REQUEST_WORDS]
    return words[:max_words]


def goal_search_commands(words: list[str]) -> list[str]:
    """``search[...]`` for every non-empty prefix of ``words``, shortest first."""
    return [f"search[{' '.join(words[:n])}]" for n in range(1, len(words) + 1)]
