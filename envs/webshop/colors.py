"""Colour normalisation for option matching, with the original's behaviour and quirks.

A chosen or wanted option that contains a known colour word is replaced by the first such word in alphabetical
order ('dark navy blue' -> 'blue', 'light grey' -> 'grey'), so shades of one colour match and some distinct
colours conflate, as in the original. A synthetic goal passes its options as (name, value) tuples: for a tuple,
``in`` tests element equality, so only a value that is exactly a colour word is normalised.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLOR_WORDS", "normalize_color"]

COLOR_WORDS: tuple[str, ...] = tuple(
    sorted(
        """
        apricot aqua ash azure beige black blue blush bronze brown burgundy camel camo caramel champagne charcoal
        chestnut chocolate coffee copper coral cream crimson cyan denim espresso fuchsia gold gray green grey indigo
        ivory khaki lavender lemon lilac lime magenta maroon mauve mint mocha multicolor mustard natural navy nude
        olive orange peach pewter pink plum purple red rose ruby rust salmon sand silver slate tan taupe teal
        turquoise violet walnut wheat white wine yellow
        """.split()  # noqa: SIM905 (a word list reads better as text)
    )
)


def normalize_color(option: Any) -> Any:
    """The first colour word found in ``option`` (substring for str, element for tuple), else ``option``."""
    for color in COLOR_WORDS:
        if color in option:
            return color
    return option
