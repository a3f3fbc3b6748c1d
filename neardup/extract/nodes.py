"""The lexbor vocabulary the density extractor works in: tag names and their ids, and
what a node measures (text length, link density, whether it is a leaf).

Tag ids, not names: ``node.tag`` decodes the name into a new string at every call, and
the container search asks it of most elements of a page. Apart from ``density.py`` and
``blocks.py`` because both judge nodes by these measures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from selectolax.lexbor import LexborHTMLParser, LexborNode

# Elements whose text is never article text; dropped from the chosen container.
JUNK_TAGS: Final = frozenset({
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
# Children that make a <section> a wrapper rather than a paragraph.
_BLOCK_CHILDREN: Final = frozenset({
    "p", "div", "section", "article", "table", "ul", "ol", "dl", "blockquote", "h1", "h2",
    "h3", "h4", "h5", "h6", "header", "footer", "aside", "nav", "figure",
})  # fmt: skip
# A child that stops a block from being a leaf whose deep text is prose: a block, or an
# element whose text is code ("var a = 1, b = 2" is full of commas).
_NOT_LEAF_CHILDREN: Final = _BLOCK_CHILDREN | JUNK_TAGS


def tag_ids(tags: Iterable[str]) -> dict[str, int]:
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


INLINE_IDS: Final = frozenset(tag_ids(_INLINE_TAGS).values())
_NOT_LEAF_IDS: Final = frozenset(tag_ids(_NOT_LEAF_CHILDREN).values())


def text_len(node: LexborNode) -> int:
    # strip=True trims each text node: close enough to a whitespace-free count, and
    # five times cheaper than a regex over the joined text.
    return len(node.text(strip=True))


def link_density(node: LexborNode) -> float:
    total = text_len(node)
    if total == 0:
        return 1.0
    return min(sum(text_len(a) for a in node.css("a")) / total, 1.0)


def is_leaf(node: LexborNode) -> bool:
    """No block among the children, and no script: its deep text is its own prose."""
    child = node.child
    while child is not None:
        if child.tag_id in _NOT_LEAF_IDS:
            return False
        child = child.next
    return True
