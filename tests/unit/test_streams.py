"""The held-out stream generator (bench/streams) on texts composed for this test: the same
seed gives the same bytes, labels have the dev stream's shape, every page decodes to its
article under the charset it is labelled with, and the site templates keep their promises
(stale blocks on every page of a site, small sites under 8 pages)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from bench.streams.heldout import SITES, SMALL_SITE_PAGES, Stream, build
from bench.streams.texts import Text
from neardup.charset import header_charset, meta_charset
from neardup.contract import parse_raw
from neardup.decode import decode
from neardup.records import Decoded, RawPage

_PLACES = ("东湖", "西山", "南港", "北岭", "中洲", "青川", "白沙", "红石")
_THINGS = ("图书馆", "体育场", "菜市场", "公交站", "老街区", "湿地公园", "文化馆", "码头")


def _texts() -> list[Text]:
    """Sixty short reports of our own wording, each with its own place and numbers."""
    out = []
    for i in range(60):
        place, thing = _PLACES[i % 8], _THINGS[(i * 3) % 8]
        paragraphs = tuple(
            f"第{i}号报道：{place}{thing}第{j}期改造工程本月开工，计划投资{i * 37 + j}万元。"
            f"施工单位表示，工程将分{j + 2}个阶段推进，预计{i % 12 + 1}月底前完成主体部分。"
            f"附近居民{i * 11 + j}人参加了说明会，多数人对改造方案表示支持。"
            for j in range(1 + i % 5)
        )
        kind = ("first", "copy", "short", "hard_negative")[i % 4] if i < 8 else "first"
        out.append(Text(f"t{i}", kind, "simp", paragraphs))
    return out


@pytest.fixture(scope="module")
def stream() -> Stream:
    return build(Path("/nonexistent"), seed=7, texts=_texts())


def test_same_seed_same_bytes(stream: Stream) -> None:
    again = build(Path("/nonexistent"), seed=7, texts=_texts())
    assert again.lines == stream.lines and again.labels == stream.labels
    other = build(Path("/nonexistent"), seed=8, texts=_texts())
    assert other.lines != stream.lines


def test_labels_have_the_dev_shape(stream: Stream) -> None:
    assert len(stream.lines) == len(stream.labels)
    firsts: Counter[str] = Counter()
    for line, label in zip(stream.lines, stream.labels, strict=True):
        assert json.loads(line)["url"] == label["url"]
        assert label["kind"] in {"first", "copy", "excerpt", "short", "hard_negative"}
        assert label["first"] == (label["kind"] in {"first", "short", "hard_negative"})
        firsts[label["story"]] += label["first"]
        assert isinstance(label["transforms"], list) and label["text_chars"] > 0
    assert set(firsts.values()) == {1}  # one first page per story
    assert len({label["url"] for label in stream.labels}) == len(stream.labels)
    kinds = Counter(label["kind"] for label in stream.labels)
    assert kinds["hard_negative"] >= 160 and kinds["short"] > 0 and kinds["copy"] > 0


def test_every_page_decodes_under_the_charset_it_is_labelled_with(stream: Stream) -> None:
    legacy = 0
    for line, label in zip(stream.lines, stream.labels, strict=True):
        page = parse_raw(line, 8 << 20)
        assert isinstance(page, RawPage)
        if isinstance(page.body, bytes):
            legacy += 1
            declared = header_charset(page.content_type)
            assert declared is not None and meta_charset(page.body) == declared
        result = decode(page)
        assert isinstance(result, Decoded), (label["url"], result)
        assert result.charset == (header_charset(page.content_type) or "utf-8")
        assert result.html.count("\ufffd") == 0
    assert legacy > 0


def test_stale_blocks_repeat_on_every_page_of_a_site(stream: Stream) -> None:
    by_site: dict[str, list[str]] = defaultdict(list)
    for line, label in zip(stream.lines, stream.labels, strict=True):
        page = json.loads(line)
        if "html" in page:
            by_site[label["template"]].append(page["html"])
    assert len(SITES) >= 8
    for name in ("songtao", "qingshi", "jinqiao", "qinghe"):
        pages = by_site[name]
        assert len(pages) >= 2, name
        blank = [p.split("<body", 1)[1] for p in pages]
        # text shared by all the site's pages: stale blocks of 150 characters or more
        shared = set(_sentences(blank[0]))
        for other in blank[1:]:
            shared &= set(_sentences(other))
        assert sum(len(s) for s in shared if len(s) >= 10) >= 150, name


def test_small_sites_stay_small(stream: Stream) -> None:
    sizes = Counter(label["template"] for label in stream.labels)
    for site in SITES:
        if site.small:
            assert 0 < sizes[site.name] <= SMALL_SITE_PAGES < 8


def _sentences(html: str) -> list[str]:
    import re

    return [s for s in re.split(r"<[^>]+>", html) if s.strip()]
