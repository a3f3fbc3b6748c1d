"""From the block the density extractor chose to its lines: junk, hidden and link-list
blocks pruned, inline tags unwrapped so that a line ends only at a block boundary or a
``<br>``, and paragraph ``<div>``s read with their siblings.

Apart from ``density.py``, which decides which block is the article; this module edits
the tree, and runs only on the block chosen (and on the runner-up).
"""

from __future__ import annotations

import re
from typing import Final

from selectolax.lexbor import LexborNode

from neardup.extract.nodes import INLINE_IDS, JUNK_TAGS, is_leaf, link_density, tag_ids, text_len
from neardup.extract.text import clean_lines

# Blocks inside the chosen container that are dropped when mostly link text, plus junk.
_PRUNE_SELECTOR: Final = ",".join(
    sorted(JUNK_TAGS | {"div", "p", "li", "ul", "ol", "dl", "dd", "dt", "td", "tr", "table",
                        "section", "h1", "h2", "h3", "h4", "h5", "h6"})
)  # fmt: skip
_PRUNE_LINK_DENSITY: Final = 0.6
# Elements a browser does not show: templates keep dialogs, tabs and old copy hidden
# with an inline style or the ``hidden`` attribute. The selector finds candidates cheaply
# (an attribute substring); the pattern decides.
_HIDDEN_SELECTOR: Final = '[hidden],[style*="none"],[style*="hidden"]'
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
# Paragraph <div>s are read as one article only in a parent with at most this link density.
_SIBLINGS_MAX_LINKS: Final = 0.2
_DIV_ID: Final = tag_ids(["div"])["div"]
_DIV_OR_P: Final = frozenset(tag_ids(["div", "p"]).values())


def _unwrap_inline(container: LexborNode) -> None:
    """``container.unwrap_tags(_INLINE_TAGS)`` in one walk instead of one selector query
    per tag (a twentieth of the time). Unwrapping moves children up and leaves empty
    elements alone, so the order does not change the result."""
    for node in [n for n in container.traverse() if n.tag_id in INLINE_IDS]:
        node.unwrap()


def _prune(container: LexborNode) -> None:
    """Remove junk elements, hidden elements and mostly-link blocks (related lists, ads)
    in the container."""
    stop = container.mem_id
    # Link text per ancestor, from one pass over the links: half the cost of asking every
    # block for its own links.
    linked: dict[int, int] = {}
    for a in container.css("a"):
        n = text_len(a)
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
        if block.tag in JUNK_TAGS or (n and n >= _PRUNE_LINK_DENSITY * text_len(block)):
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


def with_sibling_paragraphs(block: LexborNode) -> LexborNode:
    """The parent of a leaf <div> whose siblings are all leaf <div>s and <p>s, with few
    links: the article of a page that puts each paragraph in its own <div>, where one long
    paragraph outscores its short siblings (a list of names, a line without a period)."""
    parent = block.parent
    if block.tag_id != _DIV_ID or parent is None or not is_leaf(block):
        return block
    siblings = 0
    for node in parent.iter():
        if node.tag_id not in _DIV_OR_P or not is_leaf(node):
            return block
        siblings += 1
    if siblings < 2 or link_density(parent) > _SIBLINGS_MAX_LINKS:
        return block
    return parent


def block_lines(container: LexborNode) -> list[str]:
    """The lines of a chosen block, less its junk, hidden and link-list blocks."""
    _prune(container)
    _unwrap_inline(container)
    container.merge_text_nodes()
    return clean_lines(container.text(separator="\n"))
