"""Turn a page's bytes into text, choosing the charset in explicit, counted layers.

Layers, first winner taken (``Decoded.layer`` says which):

1. ``bom``      a UTF-8 or UTF-16 byte-order mark. It comes before the header, as in the
                WHATWG encoding standard: a BOM is never accidental, while a header is often
                a server default, and a UTF-16 body labelled UTF-8 would otherwise "decode".
2. ``header``   the charset of the HTTP Content-Type; a GB or Big5 charset that the
                ``<meta>`` names too is believed on weaker evidence (see below);
3. ``meta``     ``<meta charset>`` / ``http-equiv`` / ``<?xml encoding>`` in the first 4 KiB;
4. ``utf8``     the body is valid UTF-8;
5. ``detector`` Chinese codecs that read as common Chinese, else charset-normalizer;
6. ``replace``  UTF-8 with U+FFFD for what does not decode;
7. ``mixed``    only when replacement leaves too much U+FFFD to be a page: UTF-8 with
                GB or Big5 runs in it (a UTF-8 template around text pasted from a GBK
                page), each run of non-ASCII bytes decoded by whichever of the two reads it.

A charset (declared, UTF-8 or detected) is believed only if it decodes the body: strictly,
with at most an incomplete character at the end (truncated fetches), or with under 0.1% bad
bytes that are also under 1% of the non-ASCII bytes (GBK read as UTF-8 fails on nearly all).
A GB or Big5 decoding must also give common Chinese characters: Big5 bytes decode without
a single error as GB18030, into rare characters, kana and private-use code points. That
test samples the first few hundred non-ASCII characters, which may be a navigation bar of
rare characters; so when the header and the ``<meta>`` name the same GB or Big5 charset,
the charset is believed if it decodes the body and the page's prose (its long non-ASCII
runs) reads as Chinese in it, unless the body is UTF-8 or the prose reads better in the
other Chinese family. The detector judges the prose the same way when the sample fails.
Latin-1 and ASCII labels, often a server default, give way to valid UTF-8 and to bytes that
read as Chinese in GB18030 or Big5.

Label lookup and the test of reading as Chinese are in ``neardup.charset``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from neardup.charset import (
    PLAUSIBLE_SHARE,
    codec_for,
    header_charset,
    meta_charset,
    prose_share,
    reads_as_chinese,
)
from neardup.records import Decoded, RawPage, Reason, Rejected

LAYER_TEXT = "text"
LAYER_BOM = "bom"
LAYER_HEADER = "header"
LAYER_META = "meta"
LAYER_UTF8 = "utf8"
LAYER_DETECTOR = "detector"
LAYER_REPLACE = "replace"
LAYER_MIXED = "mixed"
LAYERS = (
    LAYER_TEXT,
    LAYER_BOM,
    LAYER_HEADER,
    LAYER_META,
    LAYER_UTF8,
    LAYER_DETECTOR,
    LAYER_REPLACE,
    LAYER_MIXED,
)

DETECTOR_SAMPLE_BYTES = 32 * 1024
MAX_BAD_SHARE = 0.10  # of U+FFFD plus control characters in the text; more is not a page

# A charset may leave this many undecodable bytes (a truncated multibyte character, a
# corrupt byte or two) ...
_TOLERATED_PER_BYTE = 0.001
# ... but no more than this share of the non-ASCII bytes: GBK labelled UTF-8 fails on
# nearly every Chinese character, however few there are on a mostly-ASCII page.
_TOLERATED_PER_HIGH_BYTE = 0.01
# Share of common Chinese in the prose below which even agreeing labels are not believed:
# the wrong one of the two Chinese codecs reads about 0.3-0.55, the right one over 0.9.
_AGREED_MIN_SHARE = 0.6

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"PK\x03\x04", "a ZIP archive (or docx/xlsx/epub)"),
    (b"\x1f\x8b", "gzip data (Content-Encoding not undone?)"),
    (b"\x28\xb5\x2f\xfd", "zstd data (Content-Encoding not undone?)"),
    (b"RIFF", "a RIFF file (WebP, WAV or AVI)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an OLE2 document (doc, xls or ppt)"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"wOFF", "a WOFF font"),
    (b"wOF2", "a WOFF2 font"),
    (b"OggS", "an Ogg media file"),
    (b"\x7fELF", "an ELF executable"),
    (b"MZ\x90\x00", "a Windows executable"),
)
_MAGIC_PREFIXES = tuple(magic for magic, _ in _MAGIC)

# application/* types that may well hold HTML: XML flavours and "don't know".
_HTMLISH_APPLICATION = frozenset(
    {
        "application/xhtml+xml",
        "application/xml",
        "application/octet-stream",
        "application/unknown",
        "application/x-unknown",
        "application/binary",
    }
)
_NON_TEXT_TOP_LEVEL = frozenset({"image", "audio", "video", "font", "model", "multipart"})

# Server defaults: believed only after the page's own bytes had their say.
_WEAK = frozenset({"cp1252"})
_CHINESE = frozenset({"gb18030", "big5hkscs", "cp950"})
# Tried strictly before a declared codec is allowed a few bad bytes: Taiwanese Big5 with the
# ETEN extensions (kana, circled numbers) that HKSCS lacks decodes strictly as cp950.
_STRICT_FALLBACKS: Mapping[str, tuple[str, ...]] = {"big5hkscs": ("cp950",)}

_CONTROL_BYTES = bytes(range(0x00, 0x09)) + b"\x0b\x0e\x0f" + bytes(range(0x10, 0x20)) + b"\x7f"
_HIGH_BYTES = bytes(range(0x80, 0x100))
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def not_html(content_type: str, raw: bytes) -> str | None:
    """What the body is if it is clearly not an HTML page, else None."""
    if raw.startswith(_MAGIC_PREFIXES):
        for magic, what in _MAGIC:
            if raw.startswith(magic):
                return f"body is {what} (starts with {magic!r})"
    if raw[4:8] == b"ftyp":
        return "body is an ISO media file (MP4, MOV or HEIF)"
    media = content_type.split(";", 1)[0].strip().lower()
    top, slash, _ = media.partition("/")
    if not slash:
        return None  # no usable media type: the bytes decide
    if top in _NON_TEXT_TOP_LEVEL:
        return f"content type is {media}"
    if top == "application" and media not in _HTMLISH_APPLICATION and not media.endswith("+xml"):
        return f"content type is {media}"
    return None


def _bom(raw: bytes) -> tuple[str, int] | None:
    if raw.startswith(b"\xef\xbb\xbf"):
        return "utf-8", 3
    if raw.startswith(b"\xff\xfe"):
        return "utf-16-le", 2
    if raw.startswith(b"\xfe\xff"):
        return "utf-16-be", 2
    return None


def _tolerated(raw: bytes, codec: str) -> str | None:
    """``raw`` decoded with replacement if few enough bytes fail, else None."""
    text = raw.decode(codec, "replace")
    try:
        literal = raw.count("\ufffd".encode(codec))
    except UnicodeEncodeError:
        literal = 0
    errors = text.count("\ufffd") - literal
    high = len(raw) - len(raw.translate(None, _HIGH_BYTES))
    if errors <= _TOLERATED_PER_BYTE * len(raw) and errors <= _TOLERATED_PER_HIGH_BYTE * high:
        return text
    return None


def _strict(raw: bytes, codec: str) -> str | None:
    """``raw`` decoded without error, but for an incomplete character at the very end."""
    try:
        return raw.decode(codec)
    except UnicodeDecodeError as exc:
        if exc.end >= len(raw):  # the one bad spot is the tail: a truncated fetch
            return raw[: exc.start].decode(codec) + "\ufffd"
    return None


def _decodes(raw: bytes, codec: str) -> tuple[str, str] | None:
    """(text, codec used) if ``codec`` decodes ``raw`` well enough to be believed."""
    for candidate in (codec, *_STRICT_FALLBACKS.get(codec, ())):
        text = _strict(raw, candidate)
        if text is not None:
            return text, candidate
    text = _tolerated(raw, codec)
    return None if text is None else (text, codec)


def _detector_sample(raw: bytes) -> bytes:
    """Up to 32 KiB from just before the first non-ASCII byte, cut between characters."""
    first_high = re.search(rb"[\x80-\xff]", raw)
    start = 0 if first_high is None else raw.rfind(b">", 0, first_high.start()) + 1
    end = start + DETECTOR_SAMPLE_BYTES
    if end >= len(raw):
        return raw[start:]
    # Bytes below 0x30 never occur inside a multibyte character in UTF-8, GB18030, Big5,
    # Shift_JIS or EUC; cutting after one keeps the detector from seeing a broken tail.
    cut = max(raw.rfind(sep, start, end) for sep in (b"<", b"\n", b" ", b'"'))
    return raw[start : cut if cut > start + DETECTOR_SAMPLE_BYTES // 2 else end]


class _Attempts:
    """Decodings tried for one page, so that no codec decodes the same body twice."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._decoded: dict[str, tuple[str, str] | None] = {}
        self._done: dict[str, tuple[str, str] | None] = {}

    def decodes(self, codec: str) -> tuple[str, str] | None:
        """(text, codec used) if ``codec`` decodes the body well enough, whatever it reads as."""
        if codec not in self._decoded:
            self._decoded[codec] = _decodes(self.raw, codec)
        return self._decoded[codec]

    def __call__(self, codec: str) -> tuple[str, str] | None:
        """(text, codec used) if ``codec`` is believable for this page, else None."""
        if codec not in self._done:
            found = self.decodes(codec)
            if found is not None and codec in _CHINESE and not reads_as_chinese(found[0]):
                found = None
            self._done[codec] = found
        return self._done[codec]

    def agreed(self, codec: str) -> tuple[str, str] | None:
        """(text, codec used) for a Chinese ``codec`` that the header and the ``<meta>`` both
        name: believed if it decodes the body and the page's prose reads mostly as common
        Chinese in it, unless the body is UTF-8 or the other Chinese family reads the
        prose better.

        The first non-ASCII characters that ``reads_as_chinese`` samples are often a
        navigation bar, and on a real page that bar may hold rare characters, kana or
        Cyrillic; two labels that agree outweigh it. Big5 bytes are, byte for byte, valid
        GB18030, so validity alone cannot catch Big5 labelled GB in both places: the
        comparison over the page's prose does, as a wrong reading is about half rare.
        """
        found = self.decodes(codec)
        # A GB or Big5 body is practically never valid UTF-8, while GB18030 decodes much
        # UTF-8 without an error.
        if found is None or self.decodes("utf-8") is not None:
            return None
        share = prose_share(found[0])
        if share < _AGREED_MIN_SHARE:
            return None
        other = self.decodes("big5hkscs" if codec == "gb18030" else "gb18030")
        if other is not None:
            other_share = prose_share(other[0])
            if other_share >= PLAUSIBLE_SHARE and other_share > share:
                return None
        return found


def _detect_chinese(attempt: _Attempts) -> tuple[str, str] | None:
    # charset-normalizer misses on about one Chinese dev page in a hundred (cp1250, or
    # nothing), so the two Chinese families go first, judged by what they decode to.
    for codec in ("gb18030", "big5hkscs"):
        found = attempt(codec)
        if found is not None:
            return found
    # Neither reads as Chinese in the first characters, which may be a navigation bar of
    # rare ones: judge the page's prose instead.
    best, best_share = None, PLAUSIBLE_SHARE
    for codec in ("gb18030", "big5hkscs"):
        found = attempt.decodes(codec)
        share = -1.0 if found is None else prose_share(found[0])
        if share >= best_share:
            best, best_share = found, share
    return best


def _detect_other(raw: bytes, attempt: _Attempts) -> tuple[str, str] | None:
    # Imported here: only a page no other layer settles needs it (0.05 s at start-up).
    from charset_normalizer import from_bytes

    for match in list(from_bytes(_detector_sample(raw), preemptive_behaviour=False))[:3]:
        codec = codec_for(match.encoding)
        found = attempt(codec) if codec else None
        if found is not None:
            return found
    return None


def _layers(raw: bytes, content_type: str) -> Iterator[tuple[str, tuple[str, str] | None]]:
    """Each layer with what it found, lazily: the first success ends the search."""
    attempt = _Attempts(raw)
    weak: list[tuple[str, str]] = []
    for layer in (LAYER_HEADER, LAYER_META):
        # The meta scan is cheap but not free: only done when the header did not settle it.
        declared = header_charset(content_type) if layer == LAYER_HEADER else meta_charset(raw)
        if declared is None:
            continue
        if declared in _WEAK and not raw.isascii():
            weak.append((layer, declared))
            continue
        found = attempt(declared)
        # Both labels naming one Chinese charset are trusted beyond the sample's judgement
        # (see ``_Attempts.agreed``); the meta scan only runs when the sample failed.
        if (
            found is None
            and layer == LAYER_HEADER
            and declared in _CHINESE
            and meta_charset(raw) == declared
        ):
            found = attempt.agreed(declared)
        yield layer, found
    yield LAYER_UTF8, attempt("utf-8")
    yield LAYER_DETECTOR, _detect_chinese(attempt)
    for layer, declared in weak:
        yield layer, attempt(declared)
    yield LAYER_DETECTOR, _detect_other(raw, attempt)


def _choose(raw: bytes, content_type: str) -> tuple[str, str, str]:
    """(text, codec, layer) for a body; always succeeds, the last layer being replacement."""
    bom = _bom(raw)
    if bom is not None:
        codec, skip = bom
        return raw[skip:].decode(codec, "replace"), codec, LAYER_BOM
    for layer, found in _layers(raw, content_type):
        if found is not None:
            return found[0], found[1], layer
    return raw.decode("utf-8", "replace"), "utf-8", LAYER_REPLACE


# A run of non-ASCII bytes, read two at a time from its first byte so that a GBK or Big5
# character whose second byte is ASCII (0x40-0x7E) stays whole. A UTF-8 run may swallow
# one ASCII letter this way, which it still decodes.
_HIGH_RUN = re.compile(rb"(?:[\x80-\xff][\x40-\x7e\x80-\xff]?)+")


def _mixed(raw: bytes) -> tuple[str, str] | None:
    """(text, codecs) for a body of UTF-8 with GB or Big5 runs in it, else None: each
    run of non-ASCII bytes is UTF-8 if it decodes so, else the Chinese codec under which
    the other runs read as common Chinese. Linear: each run is decoded at most 3 times."""
    parts: list[str] = []
    foreign: list[tuple[int, bytes]] = []  # (index in parts, bytes) of non-UTF-8 runs
    at = 0
    for m in _HIGH_RUN.finditer(raw):
        parts.append(raw[at : m.start()].decode("ascii"))
        try:
            parts.append(m.group().decode("utf-8"))
        except UnicodeDecodeError:
            foreign.append((len(parts), m.group()))
            parts.append("")
        at = m.end()
    parts.append(raw[at:].decode("ascii"))
    if not foreign or len(foreign) == len(parts) // 2:  # no runs of one of the two kinds
        return None
    for codec in ("gb18030", "big5hkscs"):
        texts = [run.decode(codec, "replace") for _, run in foreign]
        joined = "".join(texts)
        if joined.count("\ufffd") <= MAX_BAD_SHARE * len(joined) and reads_as_chinese(joined):
            for (i, _), text in zip(foreign, texts, strict=True):
                parts[i] = text
            return "".join(parts), f"utf-8+{codec}"
    return None


def bad_share(text: str) -> float:
    """Share of U+FFFD and control characters (tab, newlines and form feed excepted)."""
    if not text:
        return 0.0
    # Controls are counted on every 8th character: exact enough for a 10% limit, and
    # counting bytes in C is ten times faster than a regex over the whole text.
    every_8th = text[::8]
    sample = every_8th.encode("utf-8", "surrogatepass")
    controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    # ``in`` finds a character with memchr; ``count`` walks every one (5 against 27 us on
    # a 100,000-character page), and most pages hold no U+FFFD at all.
    bad = text.count("\ufffd") if "\ufffd" in text else 0
    return bad / len(text) + controls / len(every_8th)


def _checked(
    page: RawPage, text: str, codec: str, layer: str, utf8: bytes | None = None
) -> Decoded | Rejected:
    share = bad_share(text)
    if share > MAX_BAD_SHARE:
        return Rejected(
            Reason.DECODE,
            f"{share:.0%} of characters are U+FFFD or control characters "
            f"(decoded as {codec} by layer {layer})",
            page.page_id,
            page.url,
        )
    return Decoded(page=page, html=text, charset=codec, layer=layer, utf8=utf8)


def decode(page: RawPage, utf8: bytes | None = None) -> Decoded | Rejected:
    """The page's HTML as text and how its charset was chosen, or why it is not a page.

    ``utf8``: a text body's UTF-8, when the caller has it already (the sandbox's worker
    receives the body so): it must be exactly ``page.body.encode("utf-8")``, and saves
    encoding 100 KiB again (0.13 ms)."""
    body = page.body
    if isinstance(body, str):
        if utf8 is None:
            try:
                utf8 = body.encode("utf-8")
            except UnicodeEncodeError:  # JSON allows lone surrogates; nothing downstream does
                text = _LONE_SURROGATE.sub("\ufffd", body)
                return _checked(page, text, "utf-8", LAYER_TEXT)
        return _checked(page, body, "utf-8", LAYER_TEXT, utf8)
    what = not_html(page.content_type, body)
    if what is not None:
        return Rejected(Reason.NOT_HTML, what, page.page_id, page.url)
    text, codec, layer = _choose(body, page.content_type)
    if layer == LAYER_REPLACE and bad_share(text) > MAX_BAD_SHARE:
        mixed = _mixed(body)
        if mixed is not None:
            text, codec, layer = *mixed, LAYER_MIXED
    return _checked(page, text, codec, layer)
