"""What a page's charset labels name, and whether a decoding reads as Chinese: the
evidence that the layers of ``neardup.decode`` weigh.

* ``codec_for``, ``header_charset``, ``meta_charset``: the Python codec a label names, in
  the HTTP Content-Type or in the page's own ``<meta charset>`` / ``<?xml encoding>``;
  browsers' aliases mapped, each legacy charset widened to the superset browsers decode
  it with, and only text codecs allowed.
* ``reads_as_chinese``, ``prose_share``: whether a GB or Big5 decoding is made of common
  Chinese characters, judged on a sample of its non-ASCII characters or on its prose.

Apart from ``neardup.decode`` because these are tables and tests of text: which layer
asks them, in what order, and what it then believes, is decode's.
"""

from __future__ import annotations

import codecs
import contextlib
import re
from collections.abc import Iterable, Mapping

META_SCAN_BYTES = 4 * 1024

# Share of sampled non-ASCII characters that must be common Chinese characters or
# punctuation for a GB or Big5 decoding to be believed. Measured on the dev pages: right
# codec >= 0.96 on every page, the other Chinese codec <= 0.55.
PLAUSIBLE_SHARE = 0.8
_PLAUSIBLE_MIN_SAMPLE = 24
# Non-ASCII runs at least this long are taken as prose rather than navigation labels.
_PROSE_RUN = 12

_CT_CHARSET = re.compile(r"charset\s*=\s*[\"']?\s*([\w.:\-]{1,40})", re.IGNORECASE | re.ASCII)
_META_CHARSET = re.compile(
    rb"<meta[^>]{0,512}?charset\s*=\s*[\"']?\s*([\w.:\-]{1,40})"
    rb"|<\?xml[^>]{0,128}?encoding\s*=\s*[\"']([\w.:\-]{1,40})",
    re.IGNORECASE,
)

# Labels that browsers know and Python does not, mapped to a name Python knows.
_LABEL_ALIASES: Mapping[str, str] = {
    "x-gbk": "gbk",
    "gb_2312-80": "gb2312",
    "gb_2312": "gb2312",
    "csgb2312": "gb2312",
    "csiso58gb231280": "gb2312",
    "iso-ir-58": "gb2312",
    "chinese": "gb2312",
    "x-euc-cn": "gb2312",
    "cn-big5": "big5",
    "x-x-big5": "big5",
    "x-big5": "big5",
    "x-sjis": "shift_jis",
    "windows-31j": "cp932",
    "ms_kanji": "shift_jis",
    "x-euc-jp": "euc_jp",
    "windows-874": "cp874",
    "dos-874": "cp874",
    "x-mac-cyrillic": "mac-cyrillic",
    "x-mac-ukrainian": "mac-cyrillic",
    "unicode-1-1-utf-8": "utf-8",
    "unicode11utf8": "utf-8",
    "unicode20utf8": "utf-8",
    "x-unicode20utf8": "utf-8",
    "utf8mb4": "utf-8",
    "iso-8859-8-i": "iso8859-8",
    "utf-16": "utf-16-le",  # WHATWG: a bare "utf-16" label means little-endian
}
# Python codec name -> the superset to decode with (what browsers actually do).
_SUPERSETS: Mapping[str, str] = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "euc_kr": "cp949",
    "shift_jis": "cp932",
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
}
# Text codecs a page may be decoded with, after the superset mapping. Anything else (hz,
# rot13, unicode_escape, base64 ...) is treated as an unknown label.
_ALLOWED = frozenset(
    {
        "utf-8",
        "utf-16-le",
        "utf-16-be",
        "gb18030",
        "big5hkscs",
        "cp950",
        "cp932",
        "euc_jp",
        "iso2022_jp",
        "cp949",
        "koi8-r",
        "koi8-u",
        "cp866",
        "mac-roman",
        "mac-cyrillic",
        "cp874",
        *(f"iso8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
        *(f"cp{n}" for n in range(1250, 1259)),
    }
)

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _common_chinese() -> frozenset[str]:
    """Characters that real Chinese text is made of, from the codecs' own tables.

    GB2312 level 1 (3,755 most used simplified characters) and Big5 level 1 (5,401 most used
    traditional ones), their punctuation rows, and Unicode punctuation and full-width forms.
    """
    chars: set[str] = set()

    def add(codec: str, leads: Iterable[int], trails: Iterable[int]) -> None:
        trail_list = list(trails)
        for lead in leads:
            for trail in trail_list:
                with contextlib.suppress(UnicodeDecodeError):
                    chars.add(bytes((lead, trail)).decode(codec))

    big5_trails = [*range(0x40, 0x7F), *range(0xA1, 0xFF)]
    add("gb2312", [0xA1, 0xA3, *range(0xB0, 0xD8)], range(0xA1, 0xFF))
    add("big5", range(0xA1, 0xA3), big5_trails)
    add("big5", range(0xA4, 0xC7), big5_trails)
    for first, last in ((0x00A0, 0x00FF), (0x2000, 0x206F), (0x3000, 0x303F), (0xFF00, 0xFFEF)):
        chars.update(map(chr, range(first, last + 1)))
    return frozenset(chars)


# A constant derived from the codec tables, built once at import; not a cache.
_COMMON_CHINESE = _common_chinese()


def codec_for(label: str) -> str | None:
    """The Python codec to decode a charset label with, or None if it is unknown or unsafe."""
    key = label.strip().strip("\"'").lower()
    key = _LABEL_ALIASES.get(key, key)
    try:
        name = codecs.lookup(key).name
    except (LookupError, ValueError):
        return None
    name = _SUPERSETS.get(name, name)
    return name if name in _ALLOWED else None


def header_charset(content_type: str) -> str | None:
    """The codec named by a Content-Type's charset parameter, if any and known."""
    match = _CT_CHARSET.search(content_type)
    return codec_for(match.group(1)) if match else None


def meta_charset(raw: bytes) -> str | None:
    """The codec named by the page's own declaration in its first 4 KiB, if any and known."""
    match = _META_CHARSET.search(raw, 0, META_SCAN_BYTES)
    if match is None:
        return None
    codec = codec_for((match.group(1) or match.group(2)).decode("ascii"))
    # WHATWG: a page that can state "utf-16" in ASCII is not UTF-16.
    return "utf-8" if codec in ("utf-16-le", "utf-16-be") else codec


def _non_ascii_sample(text: str, want: int = 256, chunk: int = 1024, most: int = 64) -> str:
    """The first ``want`` or so non-ASCII characters of the text.

    A regex over a whole 600 KB page takes milliseconds, so ASCII-only chunks (scripts,
    styles, inline images) are skipped with ``str.isascii``, which costs almost nothing.
    """
    parts: list[str] = []
    got = scanned = 0
    for start in range(0, len(text), chunk):
        piece = text[start : start + chunk]
        if piece.isascii():
            continue
        found = "".join(_NON_ASCII.findall(piece))
        parts.append(found)
        got += len(found)
        scanned += 1
        if got >= want or scanned >= most:
            break
    return "".join(parts)


def reads_as_chinese(text: str) -> bool:
    """False if a sample of the text's non-ASCII characters is mostly not common Chinese."""
    sample = _non_ascii_sample(text)
    if len(sample) < _PLAUSIBLE_MIN_SAMPLE:
        return True  # too little to judge, and too little to matter
    common = sum(map(_COMMON_CHINESE.__contains__, sample))
    return common >= PLAUSIBLE_SHARE * len(sample)


def prose_share(text: str) -> float:
    """Share of common Chinese among the whole text's non-ASCII runs of sentence length
    (all runs if there is none so long); 1.0 if it has no non-ASCII character.

    Navigation labels are short runs between tags, so a bar of rare characters does not
    outweigh a paragraph, however early on the page it comes.
    """
    runs = _NON_ASCII.findall(text)
    found = "".join(run for run in runs if len(run) >= _PROSE_RUN) or "".join(runs)
    return sum(map(_COMMON_CHINESE.__contains__, found)) / len(found) if found else 1.0
