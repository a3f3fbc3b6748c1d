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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Final

import numpy as np
from selectolax.lexbor import LexborHTMLParser, LexborNode

from neardup import config
from neardup.boilerplate import is_boilerplate
from neardup.noise import is_noise as _is_noise
from neardup.noise import strip_noise
from neardup.records import Decoded, Extracted, Reason, Rejected

__all__ = ["DEFAULT_EXTRACTOR", "EXTRACTORS", "extract", "strip_noise"]

#: The extractor used when none is named; see ``bench/extraction.py`` for why.
DEFAULT_EXTRACTOR: Final = "density"
#: The extractors by name (``neardup.config.EXTRACTORS``, where ``EngineConfig`` checks
#: the name without importing the parsers). Prefer ``density`` to its alias ``fast``:
#: the name is what decisions record.
EXTRACTORS: Final = config.EXTRACTORS

# (title, raw lines before noise filtering, the page's prose-like blocks wherever they are,
# the runner-up block's raw lines)
_Lines = tuple[str, list[str], list[str], list[str]]
# An extractor gets the page twice: as text, and as UTF-8 bytes (what lexbor parses;
# "replace" because a decoder's lone surrogates must not make a page unparseable).
_Extractor = Callable[[str, bytes], _Lines]

# --------------------------------------------------------------------------- text helpers

_SPACE = re.compile(r"\s+")
# Zero-width characters are invisible on the page but split words in later stages.
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff]")
# Sentence punctuation (and the half-width comma, and 「」 quotes of Traditional text):
# the signal that a block is prose.
_PUNCT = re.compile(r"[，。！？；：、“”「」,]")
# A sentence end in ASCII punctuation ("恢复供水. 请储水!"): a short line written with a
# half-width keyboard is prose too, though it has none of the marks above.
_ASCII_STOP = re.compile(r"\w[.!?;](?:\s|$)")


def _clean(line: str) -> str:
    return _SPACE.sub(" ", _ZERO_WIDTH.sub("", line)).strip()


def _clean_lines(text: str) -> list[str]:
    return [c for line in text.split("\n") if (c := _clean(line))]


def _squeeze(text: str) -> str:
    """Text without any whitespace, for comparing and measuring."""
    return _SPACE.sub("", text)


# --------------------------------------------------------------------------------- title

# Separators between an article title and the site/channel names a <title> appends:
# "标题_网易新闻", "标题|辟谣_新浪财经_新浪网", "标题 - 新浪", "标题——人民网".
_TITLE_SEP = re.compile(r"\s*(?:[_|｜]|\s[-–—－]+\s|——|--)\s*")
# A short unspaced tail after a hyphen that names a site: "标题-中新网", "标题-某县人民政府".
_SITE_TAIL = re.compile(
    r"\s*[-–—－]\s*[^-–—－]{1,12}(?:网|报|在线|新闻|频道|中心|政府|官网|网站|门户)$"
)


def _clean_title(raw: str) -> str:
    """The article part of a <title>: the first segment, unless that is a mere prefix."""
    title = _clean(raw)
    parts = [p for p in _TITLE_SEP.split(title) if p]
    if not parts:
        return title
    head = parts[0]
    if len(head) < 4 and len(parts) > 1:  # "新闻 | 标题": a channel name came first
        head = max(parts, key=len)
    return _SITE_TAIL.sub("", head) or head


def _pick_title(
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
    raw = _clean(title_tag)
    cleaned = _clean_title(raw) if raw else ""
    key_raw, key_cleaned = _squeeze(raw), _squeeze(cleaned)

    def best_match(candidates: Sequence[str], may_hold: bool = True) -> str:
        found = ""
        for text in candidates:
            heading = _clean(text)
            key = _squeeze(heading)
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
    og = _clean(og_title)
    if og and not (cleaned.startswith(og) and len(og) < len(cleaned)):
        return og
    if cleaned:
        return cleaned
    return next((h for h in (_clean(x) for x in h1s) if len(h) >= 4), "")


# Title-like elements other than <h1>, for pages whose <title> puts the site name first.
_TITLE_LIKE: Final = 'h2,[class*="title"],[id*="title"]'


def _lexbor_title(tree: LexborHTMLParser, h1s: Sequence[str] | None = None) -> str:
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

    return _pick_title(
        title.text() if title is not None else "",
        (og.attributes.get("content") or "") if og is not None else "",
        h1s[:5],
        more_headings,
    )


# ------------------------------------------------------------------ density extractor

# Elements whose text is never article text; dropped from the chosen container.
_JUNK_TAGS: Final = frozenset({
    "script", "style", "noscript", "iframe", "svg", "math", "textarea", "select", "option",
    "button", "input", "template", "object", "embed", "canvas", "video", "audio",
})  # fmt: skip
# Inline elements are unwrapped before the text is cut into lines, so that a line ends
# only at a block boundary or a <br>, never at a link or a <strong> inside a sentence.
_INLINE_TAGS: Final = [
    "a", "span", "strong", "b", "em", "i", "u", "font", "small", "big", "sub", "sup",
    "label", "abbr", "cite", "q", "s", "strike", "del", "ins", "mark", "time", "var", "tt",
    "kbd", "samp", "bdi", "bdo", "nobr", "acronym", "code", "img", "wbr", "picture",
]  # fmt: skip
# Paragraphs: <p>, and WeChat's <section><span>text</span></section> (only a leaf
# <section> is a paragraph; others wrap whole articles).
_PARAGRAPH_TAGS: Final = frozenset({"p", "section"})
# Children that make a <section> a wrapper rather than a paragraph.
_BLOCK_CHILDREN: Final = frozenset({
    "p", "div", "section", "article", "table", "ul", "ol", "dl", "blockquote", "h1", "h2",
    "h3", "h4", "h5", "h6", "header", "footer", "aside", "nav", "figure",
})  # fmt: skip
# A child that stops a block from being a leaf whose deep text is prose: a block, or an
# element whose text is code ("var a = 1, b = 2" is full of commas).
_NOT_LEAF_CHILDREN: Final = _BLOCK_CHILDREN | _JUNK_TAGS
# Blocks that may hold paragraph text of their own: "text<br>text" without <p>.
_TEXT_BLOCKS: Final = frozenset({
    "div", "article", "td", "li", "dd", "blockquote", "pre", "center", "main", "body",
})  # fmt: skip
# Blocks inside the chosen container that are dropped when mostly link text, plus junk.
_PRUNE_SELECTOR: Final = ",".join(
    sorted(_JUNK_TAGS | {"div", "p", "li", "ul", "ol", "dl", "dd", "dt", "td", "tr", "table",
                         "section", "h1", "h2", "h3", "h4", "h5", "h6"})
)  # fmt: skip
_PRUNE_LINK_DENSITY: Final = 0.6
# Elements a browser does not show: templates keep dialogs, tabs and old copy hidden
# with an inline style or the ``hidden`` attribute. The selector finds candidates cheaply
# (an attribute substring); the pattern decides.
_HIDDEN_SELECTOR: Final = '[hidden],[style*="none"],[style*="hidden"]'
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
# class/id words of article bodies and of page furniture. Whole words between - _ or
# digits, so "content" matches "article-content" but "right" does not match "copyright".
_POSITIVE_HINT = re.compile(
    r"(?:^|[-_\s])(?:article|artibody|art|post|entry|content|cont|text|story|main|body|"
    r"detail|txt|zw|zhengwen)(?:[-_\s\d]|$)",
    re.IGNORECASE,
)
_NEGATIVE_HINT = re.compile(
    r"(?:^|[-_\s])(?:side|sidebar|aside|right|comment|comments|footer|foot|nav|menu|"
    r"recommend|related|relate|hot|rank|ranking|share|ad|ads|advert|banner|popup|login|"
    r"tie|tw|list|links|breadcrumb|crumb)(?:[-_\s\d]|$)",
    re.IGNORECASE,
)
# class/id words of reader comments and replies. Readability drops such elements before
# scoring ("unlikely candidates"); here a container inside one keeps a tenth of its score,
# so that a long comment cannot outvote a short article, yet a page made of nothing else
# still yields its text. A name that also says article/body/main (readability's
# "okMaybe") is not one: "article-comment-count" sits inside many article bodies.
_COMMENT_HINT = re.compile(
    r"(?:^|[-_\s])(?:comment|comments|reply|replies|disqus|remark|remarks|tie)(?:[-_\s\d]|$)",
    re.IGNORECASE,
)
_OK_MAYBE_HINT = re.compile(r"article|body|main|column|shadow", re.IGNORECASE)
_COMMENT_FACTOR: Final = 0.1
_HINT_ANCESTORS: Final = 12
# Candidates whose link/hint-adjusted score is computed, at most; enough in practice
# because candidates are visited best first and the walk stops when none can win.
_MAX_CANDIDATES: Final = 20
_BEST_HINT: Final = 1.5
# Below this adjusted score (about two short paragraphs) the quick pass found too little
# and the thorough pass runs.
_WEAK_SCORE: Final = 12.0
# Teaser lists put each summary in its own <li>/<dd>; articles do not, so the thorough
# pass does not read list items as paragraphs.
_LIST_ITEMS: Final = frozenset({"li", "dd"})
# Text in inline wrappers counts in the thorough pass only with this much punctuation:
# menus of channel blurbs ("人塑造地方，地方也塑造人") would otherwise outvote a short article.
_THOROUGH_MIN_PUNCT: Final = 2
# ... and at half weight: it is weaker evidence than a <p>, and a short article the quick
# pass found should not lose to a column of teasers.
_THOROUGH_WEIGHT: Final = 0.5
# The thorough pass replaces the quick pass's container only when it scores this much
# higher: a short article found by the quick pass is better than its parent plus teasers.
_THOROUGH_MARGIN: Final = 1.5
# Paragraph <div>s are read as one article only in a parent with at most this link density.
_SIBLINGS_MAX_LINKS: Final = 0.2
# Blocks scoring less are judged for furniture (``_Credits``): a template block is a few
# paragraphs at most, and judging every paragraph of a long article costs a tenth of it.
_JUDGE_BELOW: Final = 40.0
# A block whose score is this much furniture is furniture as a whole.
_FURNITURE_SHARE: Final = 0.5
# Below this adjusted score (a few paragraphs) the best block may be a template block the
# host repeats, and the runner-up outside it is kept for the engine to fall back on.
_RUNNER_UP_BELOW: Final = 40.0


def _unit_score(text: str, min_punct: int = 0) -> float:
    """Paragraph weight: readability's 1 + commas + length bonus, with Chinese punctuation."""
    n = len(text)
    if n < 8:
        return 0.0
    k = len(_PUNCT.findall(text))
    if k < min_punct:
        return 0.0
    if k == 0 and n < 40 and not _ASCII_STOP.search(text):  # a menu item, a label
        return 0.0
    if _is_noise(text):  # a long reprint notice is not prose
        return 0.0
    return 1.0 + k + min(n / 100.0, 3.0)


def _text_len(node: LexborNode) -> int:
    # strip=True trims each text node: close enough to a whitespace-free count, and
    # five times cheaper than a regex over the joined text.
    return len(node.text(strip=True))


def _link_density(node: LexborNode) -> float:
    total = _text_len(node)
    if total == 0:
        return 1.0
    return min(sum(_text_len(a) for a in node.css("a")) / total, 1.0)


def _class_id(node: LexborNode) -> str:
    attrs = node.attributes
    return f"{attrs.get('class') or ''} {attrs.get('id') or ''}"


def _hint(node: LexborNode) -> float:
    """Class/id factor: 1.5 for an article-like name, 0.5 inside a sidebar or list, 0.1
    inside readers' comments."""
    factor = _BEST_HINT if _POSITIVE_HINT.search(_class_id(node)) else 1.0
    negative = 1.0
    cur: LexborNode | None = node
    for _ in range(_HINT_ANCESTORS):
        if cur is None or cur.tag_id in _PAGE_ROOT_IDS:
            break
        names = _class_id(cur)
        if _COMMENT_HINT.search(names) and not _OK_MAYBE_HINT.search(names):
            return _COMMENT_FACTOR  # readers' comments: never the article's positive hint
        if negative == 1.0 and _NEGATIVE_HINT.search(names):
            negative = 0.5
        cur = cur.parent
    return factor * negative


@dataclass(slots=True)
class _Scan:
    """What one walk over the body finds."""

    paragraphs: list[LexborNode] = field(default_factory=list)
    blocks: list[LexborNode] = field(default_factory=list)
    breaks: list[LexborNode] = field(default_factory=list)
    h1s: list[str] = field(default_factory=list)


def _scan(body: LexborNode) -> _Scan:
    """Paragraph-like elements, text blocks, <br>s and <h1> texts, in one walk.

    One walk instead of several selector queries: each query over a whole 150 KB page
    costs about as much as the walk (~0.2 ms).
    """
    found = _Scan()
    lists = (found.paragraphs, found.blocks, found.breaks)
    kind_of = _SCAN_KINDS.get
    # tag_id, not tag: ``tag`` decodes the element's name into a new string every time
    for node in body.traverse():
        kind = kind_of(node.tag_id)
        if kind is None:
            continue
        if kind == _H1:
            found.h1s.append(node.text())
        else:
            lists[kind].append(node)
    return found


def _tag_ids(tags: Iterable[str]) -> dict[str, int]:
    """lexbor's tag id of each of ``tags``, standard HTML tags.

    The ids of the standard HTML tags are constants of lexbor (other tags get ids above
    them), so these hold for every document; a probe document reads them off.
    """
    tags = list(tags)
    probe = LexborHTMLParser(
        "<table><tr><td></td></tr></table>"
        + "".join(f"<{tag}></{tag}>" for tag in tags if tag not in ("td", "body"))
    )
    ids = {node.tag: node.tag_id for node in probe.root.traverse()} if probe.root else {}
    if missing := set(tags) - ids.keys():  # cannot happen with lexbor's parser
        raise RuntimeError(f"tags not found in the probe: {sorted(missing)}")
    return {tag: ids[tag] for tag in tags}


_H1: Final = 3
# _scan's list for each tag id it looks for (an index into its lists, or _H1)
_SCAN_KINDS: Final = {
    tag_id: kind
    for tags, kind in ((_PARAGRAPH_TAGS, 0), (_TEXT_BLOCKS, 1), (["br"], 2), (["h1"], _H1))
    for tag_id in _tag_ids(tags).values()
}
_INLINE_IDS: Final = frozenset(_tag_ids(_INLINE_TAGS).values())
# Tag ids for the tests of the container search: ``node.tag`` decodes the name into a new
# string at every call, and the search asks it of most elements of a page.
_SECTION_ID: Final = _tag_ids(["section"])["section"]
_A_ID: Final = _tag_ids(["a"])["a"]
_LIST_ITEM_IDS: Final = frozenset(_tag_ids(_LIST_ITEMS).values())
_NOT_LEAF_IDS: Final = frozenset(_tag_ids(_NOT_LEAF_CHILDREN).values())
_PAGE_ROOT_IDS: Final = frozenset(_tag_ids(["body", "html"]).values())
_DIV_ID: Final = _tag_ids(["div"])["div"]
_DIV_OR_P: Final = frozenset(_tag_ids(["div", "p"]).values())


def _unwrap_inline(container: LexborNode) -> None:
    """``container.unwrap_tags(_INLINE_TAGS)`` in one walk instead of one selector query
    per tag (a twentieth of the time). Unwrapping moves children up and leaves empty
    elements alone, so the order does not change the result."""
    for node in [n for n in container.traverse() if n.tag_id in _INLINE_IDS]:
        node.unwrap()


def _best_container(
    scan: _Scan, thorough: bool, prose: list[str] | None = None, title: str = ""
) -> tuple[LexborNode | None, float, LexborNode | None]:
    """The block whose paragraphs score highest, discounted by links and class hints.

    Every paragraph credits its owner in full and the owner's parent by half
    (readability's scheme), so text split over sibling wrappers still wins together.
    A paragraph's owner is its parent; text a block holds itself (``text<br>text``)
    makes the block its own owner. The ``thorough`` pass also reads text that sits in
    inline wrappers (``<div><span>text</span></div>``, ``<font>text<br>text</font>``);
    it costs twice as much, so it runs only when the quick pass finds little.
    Every scored text goes into ``prose``, when given. The score a block owes to text
    that reads as furniture (``is_boilerplate``) is taken off again in ``_rank``, for the
    few blocks that compete. A text that is the page's ``title`` (whitespace aside) is a
    heading and credits nothing. Returns the block, its score and the runner-up (``_rank``).
    """
    title_key = _squeeze(title)
    scores: dict[LexborNode, float] = {}
    credits = _Credits()

    def credit(owner: LexborNode | None, score: float, text: str, to_prose: bool = True) -> None:
        if owner is None:
            return
        if len(text) <= len(title_key) + 8 and title_key and _squeeze(text) == title_key:
            return
        if to_prose and prose is not None:
            prose.append(text)
        scores[owner] = scores.get(owner, 0.0) + score
        parent = owner.parent
        credits.add(owner, parent, text, score)
        if parent is not None:
            scores[parent] = scores.get(parent, 0.0) + score / 2

    wrappers: list[LexborNode] = []
    for p in scan.paragraphs:
        if p.tag_id == _SECTION_ID and not _is_leaf(p):
            wrappers.append(p)  # only its own text counts, as for a <div>
            continue
        owner = p.parent
        if owner is None or owner.tag_id == _A_ID:  # a linked teaser: "related news" furniture
            continue
        text = p.text().strip()
        score = _unit_score(text)
        if score:
            credit(owner, score, text)
    held: set[int] = set()  # blocks credited for text of their own
    for block in chain(scan.blocks, wrappers):
        text = block.text(deep=False).strip()
        score = _unit_score(text)
        if score:
            credit(block, score, text)
            held.add(block.mem_id)
        elif thorough and block.tag_id not in _LIST_ITEM_IDS and _is_leaf(block):
            text = block.text().strip()
            score = _unit_score(text, _THOROUGH_MIN_PUNCT)
            if score:
                credit(block.parent, score * _THOROUGH_WEIGHT, text, False)
                held.add(block.mem_id)
    if thorough:
        for br in scan.breaks:
            holder = br.parent
            while holder is not None and holder.tag_id in _INLINE_IDS:
                holder = holder.parent
            if holder is None or holder.mem_id in held:
                continue
            held.add(holder.mem_id)
            if not _is_leaf(holder):  # its deep text would be every block inside it
                continue
            text = holder.text().strip()
            score = _unit_score(text, _THOROUGH_MIN_PUNCT)
            if score:
                credit(holder, score * _THOROUGH_WEIGHT, text, False)
    return _rank(scores, credits)


class _Credits:
    """Which texts credited which block, so that the score a candidate owes to furniture
    can be taken off it: only the few candidates ``_rank`` visits are judged, because
    ``is_boilerplate`` over every paragraph of a page would cost a tenth of extraction."""

    __slots__ = ("by_owner", "judged", "owners_under")

    def __init__(self) -> None:
        self.by_owner: dict[int, list[tuple[str, float]]] = {}
        self.owners_under: dict[int, set[int]] = {}
        self.judged: dict[str, bool] = {}

    def add(self, owner: LexborNode, parent: LexborNode | None, text: str, score: float) -> None:
        key = owner.mem_id
        self.by_owner.setdefault(key, []).append((text, score))
        if parent is not None:
            self.owners_under.setdefault(parent.mem_id, set()).add(key)

    def _owed(self, key: int) -> float:
        owed = 0.0
        for text, score in self.by_owner.get(key, ()):
            bad = self.judged.get(text)
            if bad is None:
                bad = self.judged[text] = is_boilerplate(text.strip())
            if bad:
                owed += score
        return owed

    def furniture(self, node: LexborNode, score: float) -> float:
        """The part of ``node``'s ``score`` that furniture text gave it: all of it when
        that is half or more, because the rest of a footer or a rules list is furniture
        too, though no line of it says so."""
        key = node.mem_id
        owed = self._owed(key) + sum(self._owed(k) for k in self.owners_under.get(key, ())) / 2
        return score if owed >= _FURNITURE_SHARE * score else owed


def _rank(
    scores: dict[LexborNode, float], credits: _Credits
) -> tuple[LexborNode | None, float, LexborNode | None]:
    """The best of the scored blocks once discounted by furniture, link density and
    class hints; and, when the best is small, the runner-up outside it: the block that
    is the article when the best proves to be a block the host repeats on every page
    (``neardup.engine.without_template_blocks``)."""
    if not scores:
        return None, 0.0, None
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)[:_MAX_CANDIDATES]
    adjusted: dict[int, float] = {}

    def best_of(candidates: list[tuple[LexborNode, float]]) -> tuple[LexborNode | None, float]:
        best, best_score = None, -1.0
        for node, score in candidates:
            if score * _BEST_HINT <= best_score:
                break  # the adjustments only shrink a score or raise it by _BEST_HINT at most
            key = node.mem_id
            if key not in adjusted:
                # a block this rich in prose is an article, whatever furniture it holds
                own = (
                    max(score - credits.furniture(node, score), 0.0)
                    if score < _JUDGE_BELOW
                    else score
                )
                adjusted[key] = own * (1.0 - _link_density(node)) * _hint(node)
            if adjusted[key] > best_score:
                best, best_score = node, adjusted[key]
        return best, best_score

    best, best_score = best_of(ranked)
    assert best is not None  # ranked is not empty
    best = _as_block(best)
    runner_up = None
    if best_score < _RUNNER_UP_BELOW:
        around = _lineage(best)
        apart = [(n, s) for n, s in ranked if n.mem_id not in around and not _is_under(n, best)]
        runner_up, runner_score = best_of(apart)
        if runner_up is not None and runner_score > 0:
            runner_up = _as_block(runner_up)
            if runner_up.mem_id in around or _is_under(runner_up, best):
                runner_up = None
        else:
            runner_up = None
    return best, best_score, runner_up


def _as_block(node: LexborNode) -> LexborNode:
    """A container must be a block: unwrapping inline tags later would dissolve it."""
    while node.tag_id in _INLINE_IDS and node.parent is not None:
        node = node.parent
    return node


def _lineage(node: LexborNode) -> set[int]:
    """``node`` and its ancestors."""
    out = set()
    cur: LexborNode | None = node
    while cur is not None:
        out.add(cur.mem_id)
        cur = cur.parent
    return out


def _is_under(node: LexborNode, ancestor: LexborNode) -> bool:
    key = ancestor.mem_id
    cur = node.parent
    while cur is not None:
        if cur.mem_id == key:
            return True
        cur = cur.parent
    return False


def _is_leaf(node: LexborNode) -> bool:
    """No block among the children, and no script: its deep text is its own prose."""
    child = node.child
    while child is not None:
        if child.tag_id in _NOT_LEAF_IDS:
            return False
        child = child.next
    return True


def _prune(container: LexborNode) -> None:
    """Remove junk elements, hidden elements and mostly-link blocks (related lists, ads)
    in the container."""
    stop = container.mem_id
    # Link text per ancestor, from one pass over the links: half the cost of asking every
    # block for its own links.
    linked: dict[int, int] = {}
    for a in container.css("a"):
        n = _text_len(a)
        cur = a.parent if n else None
        while cur is not None and cur.mem_id != stop:
            linked[cur.mem_id] = linked.get(cur.mem_id, 0) + n
            cur = cur.parent
    doomed: list[LexborNode] = [
        node
        for node in container.css(_HIDDEN_SELECTOR)
        if node.mem_id != stop
        and (
            "hidden" in node.attributes or _HIDDEN_STYLE.search(node.attributes.get("style") or "")
        )
    ]
    for block in container.css(_PRUNE_SELECTOR):
        key = block.mem_id
        if key == stop:  # css() matches the node itself too
            continue
        n = linked.get(key, 0)
        if block.tag in _JUNK_TAGS or (n and n >= _PRUNE_LINK_DENSITY * _text_len(block)):
            doomed.append(block)
    if not doomed:
        return
    # Decompose only the outermost doomed blocks: decomposing frees a block's descendants,
    # so every ancestor walk happens before the first decompose.
    doomed_ids = {d.mem_id for d in doomed}
    outermost = []
    for block in doomed:
        cur = block.parent
        while cur is not None and cur.mem_id != stop and cur.mem_id not in doomed_ids:
            cur = cur.parent
        if cur is None or cur.mem_id == stop:
            outermost.append(block)
    for block in outermost:
        block.decompose()


def _density(html: str, data: bytes) -> _Lines:
    tree = LexborHTMLParser(data)
    body = tree.body
    if body is None:
        return _lexbor_title(tree, []), [], [], []
    scan = _scan(body)
    title = _lexbor_title(tree, scan.h1s)
    prose: list[str] = []
    container, score, runner_up = _best_container(scan, False, prose, title)
    if score < _WEAK_SCORE:
        second, second_score, second_runner_up = _best_container(scan, True, title=title)
        if second_score > _THOROUGH_MARGIN * score:
            container, runner_up = second, second_runner_up
    if container is None:
        return title, [], prose, []
    container = _with_sibling_paragraphs(container)
    return title, _block_lines(container), prose, _block_lines(runner_up) if runner_up else []


def _with_sibling_paragraphs(block: LexborNode) -> LexborNode:
    """The parent of a leaf <div> whose siblings are all leaf <div>s and <p>s, with few
    links: the article of a page that puts each paragraph in its own <div>, where one long
    paragraph outscores its short siblings (a list of names, a line without a period)."""
    parent = block.parent
    if block.tag_id != _DIV_ID or parent is None or not _is_leaf(block):
        return block
    siblings = 0
    for node in parent.iter():
        if node.tag_id not in _DIV_OR_P or not _is_leaf(node):
            return block
        siblings += 1
    if siblings < 2 or _link_density(parent) > _SIBLINGS_MAX_LINKS:
        return block
    return parent


def _block_lines(container: LexborNode) -> list[str]:
    """The lines of a chosen block, less its junk, hidden and link-list blocks."""
    _prune(container)
    _unwrap_inline(container)
    container.merge_text_nodes()
    return _clean_lines(container.text(separator="\n"))


# -------------------------------------------------------------- resiliparse extractor


def _resiliparse(html: str, data: bytes) -> _Lines:
    # Imported here: resiliparse is optional (not a dependency of the default extractor).
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse_from_bytes(data, "utf-8")
    head = tree.head
    og = head.query_selector('meta[property="og:title"]') if head is not None else None
    body = tree.body
    h1s = [h.text or "" for h in body.get_elements_by_tag_name("h1")][:5] if body else []
    title = _pick_title(tree.title or "", (og.getattr("content") or "") if og else "", h1s)
    text = extract_plain_text(
        tree,
        preserve_formatting=True,
        main_content=True,
        list_bullets=False,
        alt_texts=False,
        comments=False,
    )
    return title, _clean_lines(text), [], []


# ------------------------------------------------------------- trafilatura extractor


def _trafilatura(html: str, data: bytes) -> _Lines:
    # Imported here: trafilatura takes ~0.5 s to import and most workers never use it.
    import trafilatura

    tree = LexborHTMLParser(data)
    title = _lexbor_title(tree)
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
    return title, _clean_lines(text or ""), [], []


_IMPLEMENTATIONS: Final[dict[str, _Extractor]] = {
    "density": _density,
    "fast": _density,
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
    key = _squeeze(title)
    if not key:
        return lines
    head = [line for line in lines[:5] if _squeeze(line) != key]
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
