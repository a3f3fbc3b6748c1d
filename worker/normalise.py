"""Normalisation: NFKC (which folds full- and half-width forms), Traditional to Simplified,
whitespace, and punctuation variants, so that reprints in other scripts and widths compare equal."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import opencc

# NFKC keeps the ideographic full stop and comma; only the punctuation variants that
# reprints swap freely are folded. The 。 must survive: period feature strings hang on it.
_PUNCT = str.maketrans(
    {
        "．": "。",  # full-width full stop used as a period
        "｡": "。",
        "“": '"',
        "”": '"',
        "‘": "'",
        "’": "'",
        "「": '"',
        "」": '"',
        "『": '"',
        "』": '"',
        "﹁": '"',
        "﹂": '"',
        "—": "-",
        "–": "-",
        "…": "...",
        "、": ",",
        "，": ",",
        "；": ";",
        "：": ":",
        "！": "!",
        "？": "?",
        "（": "(",
        "）": ")",
        "\u3000": " ",
        "\u00a0": " ",
        # invisible characters go: copied text carries them, and they split words
        "\u200b": None,
        "\u200c": None,
        "\u200d": None,
        "\u2060": None,
        "\ufeff": None,
        "\u00ad": None,
    }
)
_SPACE = re.compile(r"[ \t\r\f\v]+")


@lru_cache(maxsize=1)
def _t2s() -> opencc.OpenCC:
    # Immutable converter, built once: a pure function of its input, not decision state.
    return opencc.OpenCC("t2s")


def normalise(text: str) -> str:
    """Canonical form of a text: NFKC, Simplified script, ASCII punctuation but 。, single spaces.

    Line breaks are kept so that paragraphs survive.
    """
    text = unicodedata.normalize("NFKC", text)
    text = _t2s().convert(text)
    text = text.translate(_PUNCT)
    lines = (_SPACE.sub(" ", line).strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line).lower()
