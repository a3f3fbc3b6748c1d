"""Extraction stage: the title and main-text paragraphs of a decoded Chinese news page.

``extract(decoded, extractor)`` returns an ``Extracted`` record, or ``Rejected(NO_TEXT)``
when nothing is left, ``Rejected(TOO_LARGE)`` for elements nested so deep that parsing
would stall, or ``Rejected(INTERNAL)`` when a parser fails; no exception escapes for any
HTML. Three extractors are selectable by name:

* ``density`` (default): one lexbor parse, then paragraph scoring in the spirit of
  readability/GNE: every ``<p>`` (and every block with its own text) gives its
  container a score from its length and its Chinese punctuation; the best container,
  discounted by link density and class/id hints, is the article. Link-list blocks inside
  it are dropped before its text is cut into lines at block boundaries.
* ``resiliparse``: resiliparse's ``main_content`` heuristics.
* ``trafilatura``: slow (about 27 pages/s against about 600) but well known; kept for
  comparison.

Every extractor's lines then pass through ``strip_noise`` (``neardup.noise``, re-exported
here), which drops the lines that reprinting sites add (editor, source and copyright
lines, share widgets, related links) and lines that read as site furniture.

The stage is here; the density extractor is ``density.py`` (which block is the article)
and ``blocks.py`` (that block's lines), over ``nodes.py`` (lexbor tag ids and node
measures); ``title.py`` chooses the title for every extractor, and ``text.py`` holds the
line cleaning they share.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import numpy as np
from selectolax.lexbor import LexborHTMLParser

from neardup import config
from neardup.extract.density import density_lines
from neardup.extract.text import Lines, clean_lines, squeeze
from neardup.extract.title import lexbor_title, pick_title
from neardup.noise import strip_noise
from neardup.records import Decoded, Extracted, Reason, Rejected

__all__ = ["DEFAULT_EXTRACTOR", "EXTRACTORS", "extract", "strip_noise"]

#: The extractor used when none is named; see ``bench/extraction.py`` for why.
DEFAULT_EXTRACTOR: Final = "density"
#: The extractors by name (``neardup.config.EXTRACTORS``, where ``EngineConfig`` checks
#: the name without importing the parsers). Prefer ``density`` to its alias ``fast``:
#: the name is what decisions record.
EXTRACTORS: Final = config.EXTRACTORS
# An extractor gets the page twice: as text, and as UTF-8 bytes (what lexbor parses;
# "replace" because a decoder's lone surrogates must not make a page unparseable).
_Extractor = Callable[[str, bytes], Lines]


# -------------------------------------------------------------- resiliparse extractor


def _resiliparse(html: str, data: bytes) -> Lines:
    # Imported here: resiliparse is optional (not a dependency of the default extractor).
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse_from_bytes(data, "utf-8")
    head = tree.head
    og = head.query_selector('meta[property="og:title"]') if head is not None else None
    body = tree.body
    h1s = [h.text or "" for h in body.get_elements_by_tag_name("h1")][:5] if body else []
    title = pick_title(tree.title or "", (og.getattr("content") or "") if og else "", h1s)
    text = extract_plain_text(
        tree,
        preserve_formatting=True,
        main_content=True,
        list_bullets=False,
        alt_texts=False,
        comments=False,
    )
    return title, clean_lines(text), [], []


# ------------------------------------------------------------- trafilatura extractor


def _trafilatura(html: str, data: bytes) -> Lines:
    # Imported here: trafilatura takes ~0.5 s to import and most workers never use it.
    import trafilatura

    tree = LexborHTMLParser(data)
    title = lexbor_title(tree)
    # Default balance: favor_precision lost whole articles on NetEase pages (mean F1
    # 0.875 against 0.916 on the dev references, see bench/extraction.py).
    doc = trafilatura.bare_extraction(
        html,
        include_comments=False,
        include_tables=True,
        include_images=False,
        include_links=False,
        deduplicate=False,  # never: it keeps a process-wide cache (see STYLE.md)
        with_metadata=False,
    )
    text = getattr(doc, "text", None) if doc is not None else None
    return title, clean_lines(text or ""), [], []


_IMPLEMENTATIONS: Final[dict[str, _Extractor]] = {
    "density": density_lines,
    "fast": density_lines,
    "resiliparse": _resiliparse,
    "trafilatura": _trafilatura,
}

# ------------------------------------------------------------------------------ stage


# lexbor (like every HTML5 parser) walks the stack of open elements for each block start
# tag, so parse time grows with the square of the nesting depth: 100,000 nested <div>s
# take 14 s. A page with few tags cannot nest deeply enough to matter (10,000 nested
# <div>s parse in 0.12 s); a larger one has its depth estimated before it is parsed.
_TAGS_WITHOUT_DEPTH_CHECK: Final = 10_000
_MAX_DEPTH: Final = 3_000
_TAG_TOKEN = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)")
# Tags that never hold children, or are closed implicitly by the next sibling; counting
# them as opened would overestimate the depth of ordinary pages.
_FLAT_TAGS: Final = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr", "p", "li", "dt", "dd", "option", "tr", "td", "th", "image",
})  # fmt: skip


_LT: Final = np.uint8(ord("<"))


def _count_lt(data: bytes) -> int:
    """How many ``<`` bytes ``data`` holds. numpy compares 16 or 32 bytes an instruction;
    ``bytes.count`` of one byte is a plain loop: 10 against 48 us on a 114 KB page."""
    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == _LT))


def _nesting_depth(html: str) -> int:
    """An estimate of the deepest element nesting, from start and end tags alone."""
    depth = deepest = 0
    for m in _TAG_TOKEN.finditer(html):
        if m.group(1):
            depth = max(depth - 1, 0)
        elif m.group(2).lower() not in _FLAT_TAGS:
            depth += 1
            deepest = max(deepest, depth)
    return deepest


def _drop_title_lines(title: str, lines: list[str]) -> list[str]:
    """Drop the repeated headline at the top of the article container."""
    key = squeeze(title)
    if not key:
        return lines
    head = [line for line in lines[:5] if squeeze(line) != key]
    return head + lines[5:]


def extract(decoded: Decoded, extractor: str = DEFAULT_EXTRACTOR) -> Extracted | Rejected:
    """Title and main-text paragraphs of ``decoded``, or a ``Rejected`` saying why not.

    Raises ``ValueError`` only for an extractor name not in ``EXTRACTORS``: that is a
    configuration defect, not a property of the page.
    """
    impl = _IMPLEMENTATIONS.get(extractor)
    if impl is None:
        raise ValueError(f"unknown extractor {extractor!r}; choose one of {EXTRACTORS}")
    page = decoded.page
    html = decoded.html
    data = html.encode("utf-8", "replace") if decoded.utf8 is None else decoded.utf8
    if _count_lt(data) > _TAGS_WITHOUT_DEPTH_CHECK and (
        (depth := _nesting_depth(html)) > _MAX_DEPTH
    ):
        detail = f"elements nested about {depth} deep, more than {_MAX_DEPTH}"
        return Rejected(Reason.TOO_LARGE, detail, page.page_id, page.url)
    try:
        title, lines, prose, runner_up = impl(html, data)
        paragraphs = strip_noise(_drop_title_lines(title, lines))
        alternative = strip_noise(_drop_title_lines(title, runner_up))
    except Exception as exc:  # a parser failure on one page is data, not a crash
        detail = f"{extractor}: {type(exc).__name__}: {exc}"[:300]
        return Rejected(Reason.INTERNAL, detail, page.page_id, page.url)
    if not paragraphs:
        return Rejected(Reason.NO_TEXT, f"{extractor}: no main text", page.page_id, page.url)
    return Extracted(page, title, paragraphs, tuple(prose), alternative)
