"""The line cleaning that every extractor and the title choice share (whitespace
squeezed, zero-width characters dropped), and the shape of an extractor's answer
(``Lines``)."""

from __future__ import annotations

import re

# (title, raw lines before noise filtering, the page's prose-like blocks wherever they are,
# the runner-up block's raw lines)
Lines = tuple[str, list[str], list[str], list[str]]

_SPACE = re.compile(r"\s+")
# Zero-width characters are invisible on the page but split words in later stages.
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff]")


def clean(line: str) -> str:
    return _SPACE.sub(" ", _ZERO_WIDTH.sub("", line)).strip()


def clean_lines(text: str) -> list[str]:
    return [c for line in text.split("\n") if (c := clean(line))]


def squeeze(text: str) -> str:
    """Text without any whitespace, for comparing and measuring."""
    return _SPACE.sub("", text)
