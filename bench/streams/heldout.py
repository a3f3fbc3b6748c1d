"""Assemble the held-out stream: stories from the dev texts, reprinted on this package's
own site templates with the dev stream's transformations, plus short items and hard
negatives; pages and labels in the dev stream's formats.

Deterministic for a seed: the same data and seed give the same bytes.
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.streams import transforms as tf
from bench.streams.community import COMMUNITY
from bench.streams.formulaic import FAMILIES, announcement
from bench.streams.portals import PORTALS
from bench.streams.sites import PageSpec, Site
from bench.streams.texts import Text, load_texts

SITES: tuple[Site, ...] = (*PORTALS, *COMMUNITY)
SMALL_SITE_PAGES = 6  # a small site's pages: under the 8 a per-host filter wants to see
FORMULAIC_ITEMS = 160  # hard negatives composed by `formulaic`, beside the dev ones
START = datetime(2026, 6, 1, tzinfo=UTC)

# (transformation, weight) for a copy; "verbatim" is only ever alone.
_COPY_TRANSFORMS = (
    ("light_edit", 5),
    ("title_rewrite", 3),
    ("reorder", 3),
    ("abridge", 3),
    ("excerpt", 3),
    ("script", 3),
    ("boilerplate", 3),
)
# Share of the regular texts kept apart as the sources of short items (one item each), so
# that no short item is part of another story.
_SHORT_SOURCE_SHARE = 0.185
_EXTRA_COPIES = ((1, 40), (2, 25), (3, 15), (4, 10), (5, 6), (6, 4))


@dataclass(frozen=True, slots=True)
class Stream:
    """Pages as raw JSON lines (as ``pages.jsonl`` holds them) and their labels."""

    lines: list[bytes]
    labels: list[dict[str, Any]]


@dataclass(slots=True)
class _Page:
    story: str
    kind: str
    transforms: list[str]
    title: str
    paragraphs: tuple[str, ...]
    script: str
    base: str
    at: float  # hours after START
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Builder:
    rng: random.Random
    pages: list[_Page] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    story_count: int = 0

    def story_id(self) -> str:
        self.story_count += 1
        return f"h{self.story_count:05d}"

    def copies(self, text: Text, paragraphs: tuple[str, ...], story: str, at: float) -> None:
        rng = self.rng
        title = tf.title_of(paragraphs)
        base = _Page(story, "copy", [], title, paragraphs, text.script, text.key, at)
        extra = _weighted(rng, _EXTRA_COPIES) if rng.random() < 0.55 else 0
        out = [base]
        for _ in range(extra):
            at += rng.expovariate(1 / 20)
            out.append(self.transformed(base, at))
        # Now and then a copy arrives before the base page: an excerpt published first.
        if len(out) > 1 and rng.random() < 0.25:
            later = [p for p in out[1:] if "excerpt" in p.transforms] or out[1:2]
            later[0].at, base.at = base.at, later[0].at
        out.sort(key=lambda p: p.at)
        out[0].kind = "first"
        for page in out[1:]:
            page.kind = "excerpt" if "excerpt" in page.transforms else "copy"
        self.pages.extend(out)
        self.titles.append(title)

    def transformed(self, base: _Page, at: float) -> _Page:
        rng = self.rng
        if rng.random() < 0.12:
            return replace(base, transforms=["verbatim"], at=at, notes={})
        short = sum(map(len, base.paragraphs)) <= 600
        pool = [(n, w * (3 if n == "light_edit" and short else 1)) for n, w in _COPY_TRANSFORMS]
        chosen: list[str] = []
        for _ in range(_weighted(rng, ((1, 5), (2, 4), (3, 2)))):
            chosen.append(_weighted(rng, [(n, w) for n, w in pool if n not in chosen]))
        if "excerpt" in chosen and "abridge" in chosen:
            chosen.remove("abridge")
        page = replace(base, transforms=sorted(chosen), at=at, notes={})
        for name in _APPLY_ORDER:
            if name in chosen:
                _APPLY[name](page, rng)
        return page


def _weighted(rng: random.Random, items: Any) -> Any:
    names, weights = zip(*items, strict=True)
    return rng.choices(names, weights)[0]


def _light_edit(page: _Page, rng: random.Random) -> None:
    page.paragraphs, rate = tf.light_edit(page.paragraphs, rng)
    page.notes["edit_rate"] = round(rate, 4)


def _script(page: _Page, rng: random.Random) -> None:
    page.paragraphs = tf.convert_script(page.paragraphs, page.script)
    page.title = tf.convert_script((page.title,), page.script)[0]
    page.script = "simp" if page.script == "trad" else "trad"


def _title(page: _Page, rng: random.Random) -> None:
    page.title, page.paragraphs = tf.rewrite_title(page.title, page.paragraphs, rng)


def _set(fn: Callable[[tuple[str, ...], random.Random], tuple[str, ...]]) -> Any:
    def apply(page: _Page, rng: random.Random) -> None:
        page.paragraphs = fn(page.paragraphs, rng)

    return apply


# Cuts first, then edits, then what a reprinting site adds.
_APPLY_ORDER = (
    "excerpt",
    "abridge",
    "reorder",
    "light_edit",
    "script",
    "boilerplate",
    "title_rewrite",
)
_APPLY: dict[str, Callable[[_Page, random.Random], None]] = {
    "light_edit": _light_edit,
    "script": _script,
    "title_rewrite": _title,
    "excerpt": _set(tf.excerpt),
    "abridge": _set(tf.abridge),
    "reorder": _set(tf.reorder),
    "boilerplate": _set(tf.boilerplate),
}


def _short_item(text: Text, rng: random.Random) -> tuple[str, ...]:
    """A 40-300-character item from one text: a paragraph of that length if it has one,
    else the text cut at a sentence end; now and then a single line under 80 characters."""
    fits = [p for p in text.paragraphs if 40 <= len(p) <= 300]
    if fits and rng.random() < 0.7:
        return (rng.choice(fits),)
    whole = "".join(text.paragraphs)
    limit = rng.choice((80, 150, 300))
    cut = max((whole.rfind(end, 0, limit) for end in "。！？"), default=-1)
    return (whole[: cut + 1] if cut >= 40 else whole[:limit],)


def _plan(texts: list[Text], rng: random.Random) -> _Builder:
    b = _Builder(rng)
    regular = [t for t in texts if t.kind in ("first", "copy")]
    rng.shuffle(regular)
    reserve = int(_SHORT_SOURCE_SHARE * len(regular))
    for_short, regular = regular[:reserve], regular[reserve:]
    span = 24.0 * 30  # a month of arrivals
    for text in regular:
        paragraphs = text.paragraphs
        if rng.random() < 0.4 and text.chars > 200:
            paragraphs = tf.truncate(paragraphs, 150, 600, rng)
        b.copies(text, paragraphs, b.story_id(), rng.uniform(0, span))
    singles: list[tuple[str, tuple[str, ...], str, str]] = []
    for text in for_short:
        singles.append(("short", _short_item(text, rng), text.script, text.key))
    for text in texts:
        if text.kind in ("short", "hard_negative"):
            singles.append((text.kind, text.paragraphs, text.script, text.key))
    for i in range(FORMULAIC_ITEMS):
        family = i % FAMILIES
        singles.append(("hard_negative", announcement(family, rng), "simp", f"formulaic:{family}"))
    for kind, paragraphs, script, key in singles:
        title = tf.title_of(paragraphs)
        page = _Page(b.story_id(), kind, [], title, paragraphs, script, key, rng.uniform(0, span))
        b.pages.append(page)
        b.titles.append(title)
    b.pages.sort(key=lambda p: p.at)
    return b


def _render(b: _Builder, rng: random.Random) -> Stream:
    lines: list[bytes] = []
    labels: list[dict[str, Any]] = []
    used: Counter[str] = Counter()
    story_sites: dict[str, set[str]] = {}
    for n, page in enumerate(b.pages):
        taken = story_sites.setdefault(page.story, set())
        choices = [
            s
            for s in SITES
            if s.name not in taken and not (s.small and used[s.name] >= SMALL_SITE_PAGES)
        ]
        # Short items and hard negatives go mostly to the sites with the heaviest stale
        # blocks: that is where a leftover block beats a short article.
        weights = [
            3 if page.kind in ("short", "hard_negative") and s.kind in ("forum", "blog") else 1
            for s in choices
        ]
        site = rng.choices(choices, weights)[0]
        taken.add(site.name)
        used[site.name] += 1
        label, codec, _ = _weighted(rng, [((lab, c, w), w) for lab, c, w in site.charsets])
        url = f"https://{site.host}/{rng.choice(site.paths)}/{n + 100000:06d}.html"
        when = START + timedelta(hours=page.at)
        spec = PageSpec(
            url=url,
            title=page.title,
            paragraphs=page.paragraphs,
            label=label,
            published=when.strftime("%Y-%m-%d %H:%M"),
            views=rng.randint(12, 48000),
            comments=rng.randint(0, 300),
            related=tuple(rng.sample(b.titles, 8)),
            rare_nav=codec != "utf-8" and rng.random() < 0.6,
            author=rng.choice(("本站编辑", "记者 李安", "通讯员 周宁", "见习记者 陈晨", "楼主")),
        )
        doc = site.render(spec)
        record: dict[str, Any] = {
            "url": url,
            "fetched_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "content_type": f"text/html; charset={label}",
        }
        if codec == "utf-8":
            record["html"] = doc
        else:
            body = doc.encode(codec, "xmlcharrefreplace")
            record["body_b64"] = base64.b64encode(body).decode("ascii")
        lines.append(json.dumps(record, ensure_ascii=False).encode("utf-8"))
        labels.append(
            {
                "url": url,
                "story": page.story,
                "transforms": page.transforms,
                "kind": page.kind,
                "first": page.kind in ("first", "short", "hard_negative"),
                "source": "heldout",
                "base": page.base,
                "template": site.name,
                "charset": label,
                "script": page.script,
                "text_chars": sum(map(len, page.paragraphs)),
                **({"notes": page.notes} if page.notes else {}),
            }
        )
    return Stream(lines, labels)


def build(data: Path, seed: int = 39, texts: list[Text] | None = None) -> Stream:
    """The held-out stream for ``seed`` from the dev texts under ``data``."""
    rng = random.Random(seed)
    builder = _plan(texts if texts is not None else load_texts(data), rng)
    return _render(builder, rng)
