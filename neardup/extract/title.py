"""The title of a page: the heading that matches its ``<title>``, else ``og:title``, else
the ``<title>`` less the site and channel names it appends.

Every extractor takes its title from here (``lexbor_title`` for a lexbor tree,
``pick_title`` for the texts another parser found), so a page gets the same title
whichever extractor reads its text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from selectolax.lexbor import LexborHTMLParser

from neardup.extract.text import clean, squeeze

# Separators between an article title and the site/channel names a <title> appends:
# "标题_网易新闻", "标题|辟谣_新浪财经_新浪网", "标题 - 新浪", "标题——人民网".
_TITLE_SEP = re.compile(r"\s*(?:[_|｜]|\s[-–—－]+\s|——|--)\s*")
# A short unspaced tail after a hyphen that names a site: "标题-中新网", "标题-某县人民政府".
_SITE_TAIL = re.compile(
    r"\s*[-–—－]\s*[^-–—－]{1,12}(?:网|报|在线|新闻|频道|中心|政府|官网|网站|门户)$"
)


def _clean_title(raw: str) -> str:
    """The article part of a <title>: the first segment, unless that is a mere prefix."""
    title = clean(raw)
    parts = [p for p in _TITLE_SEP.split(title) if p]
    if not parts:
        return title
    head = parts[0]
    if len(head) < 4 and len(parts) > 1:  # "新闻 | 标题": a channel name came first
        head = max(parts, key=len)
    return _SITE_TAIL.sub("", head) or head


def pick_title(
    title_tag: str,
    og_title: str,
    h1s: Sequence[str],
    more_headings: Callable[[], Sequence[str]] | None = None,
) -> str:
    """Choose the title: the heading that best matches <title>, else og:title, else <title>.

    A heading matches when it is part of the raw <title> (and not a mere site name), or
    holds the cleaned <title>. <h1>s are tried first; ``more_headings`` (other title-like
    elements) only when no <h1> matches and the <title> has several segments, because
    then the cleaned <title> may be the site's name. og:title is skipped when it is a
    prefix of the cleaned <title>: sites that do not escape quotes cut it at the first ``"``.
    """
    raw = clean(title_tag)
    cleaned = _clean_title(raw) if raw else ""
    key_raw, key_cleaned = squeeze(raw), squeeze(cleaned)

    def best_match(candidates: Sequence[str], may_hold: bool = True) -> str:
        found = ""
        for text in candidates:
            heading = clean(text)
            key = squeeze(heading)
            if len(key) < 4 or len(heading) <= len(found):
                continue
            part_of_title = key in key_raw and 2 * len(key) >= len(key_cleaned)
            holds_title = (
                may_hold and bool(key_cleaned) and key_cleaned in key
                and len(key) <= 2 * len(key_cleaned)
            )  # fmt: skip
            if part_of_title or holds_title:
                found = heading
        return found

    if raw and (found := best_match(h1s)):
        return found
    # Only headings that are part of the <title>: a breadcrumb "首页 - 新闻动态" holds
    # the channel name the cleaned <title> may have become.
    if (
        raw
        and more_headings is not None
        and _TITLE_SEP.search(raw)
        and (found := best_match(more_headings(), may_hold=False))
    ):
        return found
    og = clean(og_title)
    if og and not (cleaned.startswith(og) and len(og) < len(cleaned)):
        return og
    if cleaned:
        return cleaned
    return next((h for h in (clean(x) for x in h1s) if len(h) >= 4), "")


# Title-like elements other than <h1>, for pages whose <title> puts the site name first.
_TITLE_LIKE: Final = 'h2,[class*="title"],[id*="title"]'


def lexbor_title(tree: LexborHTMLParser, h1s: Sequence[str] | None = None) -> str:
    head = tree.head
    title = head.css_first("title") if head is not None else None
    if title is None:  # a <title> misplaced into <body>; css_first stops at the first
        title = tree.css_first("title")
    og = head.css_first('meta[property="og:title"]') if head is not None else None
    body = tree.body
    if h1s is None:
        h1s = [h.text() for h in body.css("h1")] if body is not None else []

    def more_headings() -> list[str]:
        return [n.text() for n in body.css(_TITLE_LIKE)[:40]] if body is not None else []

    return pick_title(
        title.text() if title is not None else "",
        (og.attributes.get("content") or "") if og is not None else "",
        h1s[:5],
        more_headings,
    )
