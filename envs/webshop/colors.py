"""Colour normalisation for option matching, with the original's vocabulary and quirks.

A chosen or wanted option that contains a word of the original's 102-word colour vocabulary is replaced by the
first such word in the vocabulary's (alphabetical) order ('dark navy blue' -> 'blue', 'light grey' -> 'grey'),
so shades of one colour match and some distinct colours conflate, as in the original. The vocabulary holds
non-colours too ('dark', 'light', 'royal', 'christmas', 'skull'): 'dark grey' and 'dark green' both become
'dark' and match, while 'light grey' becomes 'grey' (which precedes 'light') and no longer matches 'dark grey'.
A synthetic goal passes its options as (name, value) tuples: for a tuple, ``in`` tests element equality, so only
a value that is exactly a vocabulary word is normalised.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLOR_WORDS", "normalize_color"]

COLOR_WORDS: tuple[str, ...] = tuple(
    """
    alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel camo
    caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry cream crystal
    dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey heather indigo
    ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha multicolor
    mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand
    sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut
    wheat white wine yellow
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


def normalize_color(option: Any) -> Any:
    """The first vocabulary word found in ``option`` (substring for str, element for tuple), else ``option``."""
    for color in COLOR_WORDS:
        if color in option:
            return color
    return option
