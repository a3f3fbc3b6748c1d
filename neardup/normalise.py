"""Normalisation: NFKC (which folds full- and half-width forms), Traditional to Simplified,
whitespace, and punctuation variants, so that reprints in other scripts and widths compare equal."""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
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
# _PUNCT as (character, replacement) pairs. Replacing one after the other is the same as
# translating when no replacement holds a character that is replaced; checked here.
_PUNCT_PAIRS = tuple(
    (chr(k), v if isinstance(v, str) else "" if v is None else chr(v)) for k, v in _PUNCT.items()
)
_PUNCT_BY_REPLACE = not any(key in value for key, _ in _PUNCT_PAIRS for _, value in _PUNCT_PAIRS)
# Runs of CJK unified ideographs (U+4E00 to U+9FFF), captured so that split keeps them.
_IDEOGRAPHS = re.compile("([\u4e00-\u9fff]+)")


@lru_cache(maxsize=1)
def _t2s() -> opencc.OpenCC:
    # Immutable converter, built once: a pure function of its input, not decision state.
    # By the path of OpenCC's own t2s.json: OpenCC("t2s") takes a t2s.json in the working
    # directory first, so a file there would change every fingerprint.
    share = getattr(opencc, "_opencc_share_dir", "")
    config = os.path.join(share, "t2s.json")
    return opencc.OpenCC(config if share and os.path.isfile(config) else "t2s")


def normalise(text: str) -> str:
    """Canonical form of a text: NFKC, Simplified script, ASCII punctuation but 。, single spaces.

    Line breaks are kept so that paragraphs survive.
    """
    return "\n".join(line for line in _normalised_lines(text) if line)


def normalise_many(texts: Sequence[str]) -> list[str]:
    """``normalise`` of each text, with each distinct line normalised once: a page's prose
    repeats most of its main text's paragraphs. Every step of ``normalise`` works within a
    line, so the lines of all the texts go through it together."""
    split = [text.split("\n") for text in texts]
    distinct = list(dict.fromkeys(line for lines in split for line in lines))
    normalised = _normalised_lines("\n".join(distinct))
    if len(normalised) != len(distinct):  # no step makes or removes a line break
        return [normalise(text) for text in texts]
    done = dict(zip(distinct, normalised, strict=True))
    return ["\n".join(x for line in lines if (x := done[line])) for lines in split]


def _normalised_lines(text: str) -> list[str]:
    """Each line of ``text`` normalised, empty ones included."""
    # NFKC of the text between runs of ideographs: the same string, because a CJK unified
    # ideograph is left alone by NFKC and ends every composition and reordering before it,
    # so NFKC works on each stretch between them independently. A quarter of the time.
    parts = _IDEOGRAPHS.split(text)
    parts[::2] = [unicodedata.normalize("NFKC", p) for p in parts[::2]]
    text = _t2s().convert("".join(parts))
    if _PUNCT_BY_REPLACE:  # same as translate, and a tenth of its time: few keys occur
        for key, value in _PUNCT_PAIRS:
            if key in text:
                text = text.replace(key, value)
    else:
        text = text.translate(_PUNCT)
    return [line.strip().lower() for line in _SPACE.sub(" ", text).split("\n")]
