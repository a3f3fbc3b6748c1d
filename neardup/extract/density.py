"""The density extractor: which block of a page is the article.

One lexbor parse, then paragraph scoring in the spirit of readability/GNE: every ``<p>``
(and every block with its own text) gives its container a score from its length and its
Chinese punctuation; the best container, discounted by furniture text, link density and
class/id hints, is the article. A quick pass reads paragraphs and text blocks; a
thorough one, which also reads text in inline wrappers, runs when the quick pass finds
little. The chosen block's lines come from ``blocks.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain
from typing import Final

from selectolax.lexbor import LexborHTMLParser, LexborNode

from neardup.boilerplate import is_boilerplate
from neardup.extract.blocks import block_lines, with_sibling_paragraphs
from neardup.extract.nodes import INLINE_IDS, is_leaf, link_density, tag_ids
from neardup.extract.text import Lines, squeeze
from neardup.extract.title import lexbor_title
from neardup.noise import is_noise as _is_noise

# Sentence punctuation (and the half-width comma, and 「」 quotes of Traditional text):
# the signal that a block is prose.
_PUNCT = re.compile(r"[，。！？；：、“”「」,]")
# A sentence end in ASCII punctuation ("恢复供水. 请储水!"): a short line written with a
# half-width keyboard is prose too, though it has none of the marks above.
_ASCII_STOP = re.compile(r"\w[.!?;](?:\s|$)")
# Paragraphs: <p>, and WeChat's <section><span>text</span></section> (only a leaf
# <section> is a paragraph; others wrap whole articles).
_PARAGRAPH_TAGS: Final = frozenset({"p", "section"})
# Blocks that may hold paragraph text of their own: "text<br>text" without <p>.
_TEXT_BLOCKS: Final = frozenset({
    "div", "article", "td", "li", "dd", "blockquote", "pre", "center", "main", "body",
})  # fmt: skip
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


_H1: Final = 3
# _scan's list for each tag id it looks for (an index into its lists, or _H1)
_SCAN_KINDS: Final = {
    tag_id: kind
    for tags, kind in ((_PARAGRAPH_TAGS, 0), (_TEXT_BLOCKS, 1), (["br"], 2), (["h1"], _H1))
    for tag_id in tag_ids(tags).values()
}
# Tag ids for the tests of the container search: ``node.tag`` decodes the name into a new
# string at every call, and the search asks it of most elements of a page.
_SECTION_ID: Final = tag_ids(["section"])["section"]
_A_ID: Final = tag_ids(["a"])["a"]
_LIST_ITEM_IDS: Final = frozenset(tag_ids(_LIST_ITEMS).values())
_PAGE_ROOT_IDS: Final = frozenset(tag_ids(["body", "html"]).values())


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
    title_key = squeeze(title)
    scores: dict[LexborNode, float] = {}
    credits = _Credits()

    def credit(owner: LexborNode | None, score: float, text: str, to_prose: bool = True) -> None:
        if owner is None:
            return
        if len(text) <= len(title_key) + 8 and title_key and squeeze(text) == title_key:
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
        if p.tag_id == _SECTION_ID and not is_leaf(p):
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
        elif thorough and block.tag_id not in _LIST_ITEM_IDS and is_leaf(block):
            text = block.text().strip()
            score = _unit_score(text, _THOROUGH_MIN_PUNCT)
            if score:
                credit(block.parent, score * _THOROUGH_WEIGHT, text, False)
                held.add(block.mem_id)
    if thorough:
        for br in scan.breaks:
            holder = br.parent
            while holder is not None and holder.tag_id in INLINE_IDS:
                holder = holder.parent
            if holder is None or holder.mem_id in held:
                continue
            held.add(holder.mem_id)
            if not is_leaf(holder):  # its deep text would be every block inside it
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
                adjusted[key] = own * (1.0 - link_density(node)) * _hint(node)
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
    while node.tag_id in INLINE_IDS and node.parent is not None:
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


def density_lines(html: str, data: bytes) -> Lines:
    """The title, raw lines, prose and runner-up lines of a page (``Lines``), by the
    density extractor."""
    tree = LexborHTMLParser(data)
    body = tree.body
    if body is None:
        return lexbor_title(tree, []), [], [], []
    scan = _scan(body)
    title = lexbor_title(tree, scan.h1s)
    prose: list[str] = []
    container, score, runner_up = _best_container(scan, False, prose, title)
    if score < _WEAK_SCORE:
        second, second_score, second_runner_up = _best_container(scan, True, title=title)
        if second_score > _THOROUGH_MARGIN * score:
            container, runner_up = second, second_runner_up
    if container is None:
        return title, [], prose, []
    container = with_sibling_paragraphs(container)
    return title, block_lines(container), prose, block_lines(runner_up) if runner_up else []
