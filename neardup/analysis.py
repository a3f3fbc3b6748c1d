"""Analysis: one raw page to its fingerprints, pure.

Decode, extract, normalise and fingerprint (``analyse``) read no state, so this, the
expensive part, runs anywhere: in ``neardup dedup``'s sandbox, or on any worker of the
Kafka topology. What the template stage needs of the page (its lines' block keys, its
prose's period strings, its text when short) travels with it in ``Analysed``.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from neardup.config import EngineConfig
from neardup.decode import decode
from neardup.extract import extract
from neardup.fingerprint import Fingerprints, fingerprint, period_hashes
from neardup.normalise import normalise_many
from neardup.records import Extracted, RawPage, Reason, Rejected
from neardup.simhash import hash64

log = logging.getLogger(__name__)

#: A page whose non-template sentences hold at most this share of its 5-grams, and no
#: period string, is template-only.
TEMPLATE_ONLY_SHARE = 0.2
#: The template filter counts at most this many of a page's prose strings (the lowest
#: hashes): a page with thousands of comments must not write thousands of counts.
MAX_PROSE_STRINGS = 256
#: A main-text line this long or longer counts in the host's template statistics as a
#: block (``block_key``); shorter lines are bylines and labels, left to ``strip_noise``.
BLOCK_MIN_CHARS = 20
#: A page whose main text is at most this long carries it (and the runner-up block) to the
#: template stage, which fingerprints what is left once the host's template lines are
#: dropped. A template block that wins the main text is at most a few hundred characters;
#: a longer main text has its article in it, and the period-string filter suffices.
SWITCH_MAX_CHARS = 3000
STAGES = ("decode", "extract", "normalise", "template", "fingerprint", "index", "cluster")


def page_pid(page_id: str) -> int:
    """The 64-bit id under which the index and the clusters know a page."""
    return hash64(page_id)


# RFC 3339 allows a leap second and a lower-case "z"; fromisoformat takes neither.
_LEAP_SECOND = re.compile(r"(?<=[Tt ]\d{2}:\d{2}:)60")


def page_order(fetched_at: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time (naive times are UTC). A leap
    second (``23:59:60``) counts as the first moment of the next minute."""
    text, leap = _LEAP_SECOND.subn("59", fetched_at.strip())
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    ts = dt.datetime.fromisoformat(text)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return int(ts.timestamp() * 1000) + 1000 * leap


def page_host(page: RawPage) -> str:
    """The template filter's scope: the ``site`` field, else the URL's host. Raises
    ``ValueError`` for a URL whose host cannot be read (``http://[::1/``)."""
    return page.site or (urlsplit(page.url).hostname or "").removeprefix("www.")


@dataclass(frozen=True, slots=True)
class Analysed:
    """A page ready to decide: its fingerprints and what the decision reports."""

    page: RawPage
    pid: int
    order: int
    host: str
    title: str
    text_chars: int
    fps: Fingerprints
    charset: str
    layer: str
    #: Every period string of the page is template text of its host and template
    #: sentences carry most of its 5-grams: nothing is left to compare, so the page is
    #: decided unique and kept out of the index (it must not join unrelated pages).
    template_only: bool = False
    #: Period strings of the prose anywhere on the page (``Extracted.prose``): the
    #: template filter counts them with the main text's, so that a template's leftover
    #: paragraph is learned as template also from the pages whose main text left it out.
    prose_strings: tuple[int, ...] = ()
    #: Block keys (``block_key``) of each main-text line (0: too short to count), of each
    #: line of the runner-up block, and of the page's prose. The template filter counts
    #: them per host: a line on many of a host's pages is template, however its sentences
    #: end, and a main text made of such lines gives way to the runner-up block.
    line_keys: tuple[int, ...] = ()
    alt_keys: tuple[int, ...] = ()
    prose_keys: tuple[int, ...] = ()
    #: The normalised main text and runner-up block, for a main text of at most
    #: ``SWITCH_MAX_CHARS`` (else empty): what the template stage fingerprints again.
    text: str = ""
    alt_text: str = ""
    #: The primary fingerprint of the main text as extracted, when the template stage
    #: fingerprinted other text (0: ``fps.fp1`` is it). Decisions report it, so that a
    #: page seen again is known by what it carries (``conflicts_with``).
    extracted_fp: int = 0


@dataclass
class Stats:
    """Counts and time per stage; the Prometheus metrics and the benchmark read these."""

    pages: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    merges: int = 0
    repeated: int = 0
    #: Repeated page ids whose content differs from what was decided under them.
    conflicts: int = 0
    template_dropped: int = 0
    template_only: int = 0

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0


def _over(body: str | bytes, limit: int) -> bool:
    """Whether the body is over ``limit`` bytes (a text body counted in UTF-8)."""
    if isinstance(body, bytes) or len(body) > limit:
        return len(body) > limit
    # 1 to 4 bytes a character: only a text near the limit is worth encoding
    return 4 * len(body) > limit and len(body.encode("utf-8", "surrogatepass")) > limit


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_unencodable(page: RawPage) -> Rejected | None:
    """A rejection if a field holds a lone surrogate (a code point, no character).

    parse_raw never makes such a page (its JSON parser refuses them), but a RawPage built
    by other code may: no UTF-8 record can carry one, and mmh3 crashes the process on one
    (hashing the page id, or the host). The body is decode's business: it replaces them.
    """
    fields = (page.page_id, page.url, page.fetched_at, page.content_type, page.site or "")
    if all(f.isascii() for f in fields) or not any(map(_LONE_SURROGATE.search, fields)):
        return None
    return Rejected(
        Reason.SCHEMA,
        "a field holds a lone surrogate, which is no character",
        _LONE_SURROGATE.sub("\ufffd", page.page_id),
        _LONE_SURROGATE.sub("\ufffd", page.url),
    )


# One early return per stage's rejection: a pipeline reads better flat than nested.
def analyse(  # noqa: PLR0911
    page: RawPage, cfg: EngineConfig, stats: Stats | None = None, utf8: bytes | None = None
) -> Analysed | Rejected:
    """Decode, extract, normalise and fingerprint one page. Pure: no state is read, so this,
    the expensive part, runs anywhere (any worker, any partition). ``utf8``: see
    ``decode``."""
    st = stats or Stats()
    refused = refuse_unencodable(page)
    if refused is not None:
        return refused
    try:
        order = page_order(page.fetched_at)
    except ValueError as exc:
        return Rejected(Reason.SCHEMA, f"fetched_at: {exc}", page.page_id, page.url)
    try:
        host = page_host(page)
    except ValueError as exc:
        return Rejected(Reason.SCHEMA, f"url: {exc}", page.page_id, page.url)
    # parse_raw enforces the cap already; a page from any other source must not skip it
    if _over(page.body, cfg.max_bytes):
        detail = f"body is over {cfg.max_bytes} bytes"
        return Rejected(Reason.TOO_LARGE, detail, page.page_id, page.url)
    with st.timed("decode"):
        decoded = decode(page, utf8)
    if isinstance(decoded, Rejected):
        return decoded
    with st.timed("extract"):
        extracted = extract(decoded, cfg.extractor)
    if isinstance(extracted, Rejected):
        return extracted
    with st.timed("normalise"):  # the prose too (for the template filter, below)
        text, prose_text, alt_text = normalise_many(
            [extracted.text, "\n".join(extracted.prose), "\n".join(extracted.alternative)]
        )
    if len(text) < cfg.min_text_chars:
        return Rejected(
            Reason.NO_TEXT,
            f"main text has {len(text)} characters, fewer than {cfg.min_text_chars}",
            page.page_id,
            page.url,
        )
    if len(text) > cfg.max_text_chars:
        detail = f"main text has {len(text)} characters, more than {cfg.max_text_chars}"
        return Rejected(Reason.TOO_LARGE, detail, page.page_id, page.url)
    with st.timed("fingerprint"):
        fps = fingerprint(text, cfg)
    if fps.words < 2:
        return Rejected(Reason.NO_TEXT, "fewer than two words of main text", page.page_id, page.url)
    with st.timed("template"):
        prose = prose_strings(prose_text, cfg)
        line_keys = tuple(map(block_key, text.split("\n")))
        alt_keys = tuple(map(block_key, alt_text.split("\n"))) if alt_text else ()
        prose_keys = {k for k in map(block_key, prose_text.split("\n")) if k}
        switchable = len(text) <= SWITCH_MAX_CHARS
    return Analysed(
        page,
        page_pid(page.page_id),
        order,
        host,
        extracted.title.strip(),
        len(text.replace("\n", "")),
        fps,
        decoded.charset,
        decoded.layer,
        prose_strings=prose,
        line_keys=line_keys,
        alt_keys=alt_keys,
        prose_keys=tuple(sorted(prose_keys)[:MAX_PROSE_STRINGS]),
        text=text if switchable else "",
        alt_text=alt_text if switchable else "",
    )


def extract_page(
    page: RawPage, cfg: EngineConfig, stats: Stats | None = None, utf8: bytes | None = None
) -> Extracted | Rejected:
    """Decode and extract one page: ``analyse``'s first stages, for ``neardup extract``."""
    st = stats or Stats()
    with st.timed("decode"):
        decoded = decode(page, utf8)
    if isinstance(decoded, Rejected):
        return decoded
    with st.timed("extract"):
        return extract(decoded, cfg.extractor)


def internal_rejection(page: RawPage, exc: Exception) -> Rejected:
    """A page dead-lettered for a bug (an exception), logged with its traceback once."""
    log.exception("engine failed on page %s (%s)", page.page_id, page.url)
    detail = f"{type(exc).__name__}: {exc}"[:500]
    return Rejected(Reason.INTERNAL, detail, page.page_id, page.url)


def prose_strings(prose: str, cfg: EngineConfig) -> tuple[int, ...]:
    """Hashed period strings of a page's prose, normalised (``normalise``) like its main
    text."""
    return tuple(period_hashes(prose, cfg.period_len)[:MAX_PROSE_STRINGS])


def block_key(line: str) -> int:
    """A main-text or prose line's key in the host's template counts; 0 for a short line.
    Whitespace is left out; the prefix keeps block keys apart from period-string hashes."""
    squeezed = "".join(line.split())
    if len(squeezed) < BLOCK_MIN_CHARS:
        return 0
    return hash64("\x00block\x00" + squeezed)


def without_template_blocks(a: Analysed, template: set[int], cfg: EngineConfig) -> Analysed:
    """The page with its main-text lines that are template blocks of its host dropped,
    fingerprinted again: when nothing worth comparing is left, the runner-up block less
    its own template lines; when that is empty too, the page is template-only. A page
    that carries no text (a long main text) or no template line is returned as it is."""
    if not a.text or not any(k in template for k in a.line_keys if k):
        return a
    kept = [x for x, k in zip(a.text.split("\n"), a.line_keys, strict=True) if k not in template]
    if sum(map(len, kept)) < cfg.min_text_chars and a.alt_text:
        alt = a.alt_text.split("\n")
        kept = [x for x, k in zip(alt, a.alt_keys, strict=True) if k not in template]
    chars = sum(map(len, kept))
    fps = fingerprint("\n".join(kept), cfg) if chars >= cfg.min_text_chars else None
    if fps is None or fps.words < 2:
        return replace(a, template_only=True)
    return replace(a, fps=fps, text_chars=chars, extracted_fp=a.extracted_fp or a.fps.fp1)


def without_template(a: Analysed, template: set[int], cfg: EngineConfig) -> Analysed:
    """The page with its template sentences dropped from the containment features (period
    strings) and from the verification sketch. SimHash keeps the whole text."""
    if not template:
        return a
    fps = a.fps.without(template, cfg.sketch_size, cfg.exact_shingles)
    only = not fps.strings and fps.shingles <= TEMPLATE_ONLY_SHARE * a.fps.shingles
    return replace(a, fps=fps, template_only=only or a.template_only)


def for_decision(a: Analysed) -> Analysed:
    """``a`` without what only the template filter reads: the per-piece data of its
    fingerprints and the prose's period strings. What the stages after the filter keep of
    a page (the worker's pages in flight are stored so): the decision reads neither."""
    fps = a.fps
    if not (
        fps.piece_strings or fps.shingle_hashes or fps.piece_chars or fps.piece_facts
        or a.prose_strings
        or a.line_keys or a.alt_keys or a.prose_keys or a.text or a.alt_text
    ):  # fmt: skip
        return a
    slim = replace(fps, piece_strings=b"", shingle_hashes=b"", piece_chars=b"", piece_facts=b"")
    return replace(
        a, fps=slim, prose_strings=(), line_keys=(), alt_keys=(), prose_keys=(), text="",
        alt_text="",
    )  # fmt: skip
