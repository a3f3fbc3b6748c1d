"""What a site template is given, and the pieces several templates share.

A site renders one page from a ``PageSpec``. Its stale blocks (an old post, a
self-introduction, a disclaimer, a footer) are constants of the site: every page of the
site carries them, beside a different article. All wording here was written for this
benchmark; the hosts are invented.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Navigation labels of rare characters, kana and Cyrillic: on a legacy-charset page they
# come before the article, so the first few hundred non-ASCII bytes are not common Chinese.
RARE_NAV = (
    "ニュース",
    "スポーツ",
    "Новости",
    "Погода",
    "㐀㐁部落",
    "鑫淼焱垚",
    "犇骉麤猋",
    "ゲーム館",
    "Культура",
    "嘅啲咗冇",
    "睇佢哋講",
    "おしらせ",
    "エンタメ",
    "Экономика",
    "グルメ情報",
    "淼鑫商城",
    "Спорт",
    "ランキング",
    "囍聚堂",
    "Фото",
    "ヘルプ",
    "喆喆乐园",
    "お問い合わせ",
    "Видео",
    "骉骉车友会",
    "コミュニティ",
)


@dataclass(frozen=True, slots=True)
class PageSpec:
    """One page to render: the article and what varies from page to page of a site."""

    url: str
    title: str
    paragraphs: tuple[str, ...]
    label: str  # the charset label written into <meta>
    published: str  # "2024-05-12 09:31"
    views: int
    comments: int
    related: tuple[str, ...]  # other stories' titles, for link lists
    rare_nav: bool = False
    author: str = "本站编辑"


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    host: str
    kind: str  # portal, forum, blog, small
    render: Callable[[PageSpec], str]
    # (charset label, codec, weight): the label goes into the header and <meta>
    charsets: tuple[tuple[str, str, int], ...] = (("utf-8", "utf-8", 1),)
    small: bool = False  # a site of fewer than 8 pages
    paths: tuple[str, ...] = field(default=("news",))


def esc(text: str) -> str:
    return html.escape(text, quote=False)


def head(spec: PageSpec, site_title: str, extra: str = "") -> str:
    return (
        "<!DOCTYPE html>\n<html><head>"
        f'<meta http-equiv="Content-Type" content="text/html; charset={spec.label}">'
        f"<title>{esc(spec.title)} - {esc(site_title)}</title>{extra}</head>"
    )


def nav(items: Sequence[str], spec: PageSpec, sep: str = "") -> str:
    labels = [*RARE_NAV, *items] if spec.rare_nav else list(items)
    return sep.join(f'<a href="/{i}/">{esc(t)}</a>' for i, t in enumerate(labels))


def paras(spec: PageSpec, tag: str = "p", attrs: str = "") -> str:
    return "".join(f"<{tag}{attrs}>{esc(p)}</{tag}>" for p in spec.paragraphs)


def links(titles: Sequence[str], wrap: str = "li") -> str:
    return "".join(
        f'<{wrap}><a href="/r/{i}.html">{esc(t)}</a></{wrap}>' for i, t in enumerate(titles)
    )


def block(lines: Sequence[str], tag: str = "p") -> str:
    return "".join(f"<{tag}>{esc(x)}</{tag}>" for x in lines)
