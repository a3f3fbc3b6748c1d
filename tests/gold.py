"""The dedup gold set: a labelled stream built from ``tests/corpus.py`` (licence-clean).

Every article is published once and then reprinted 2–4 times with the transformations
reprinting sites apply; the two formulaic briefings are hard negatives. The stream is
deterministic: the same seed gives the same pages in the same order.
"""

from __future__ import annotations

import random
from typing import Any

import opencc

from tests.corpus import ARTICLES, HARD_A, HARD_B, TEMPLATES, raw_page

TRANSFORMS = (
    "verbatim",
    "light_edit",
    "title_rewrite",
    "reorder",
    "abridge",
    "excerpt",
    "script",
    "boilerplate",
)
_EDIT_CHARS = "的了在和新大中一"


def _apply(  # noqa: PLR0911 - one branch per transformation reads best
    kind: str, paras: list[str], title: str, rng: random.Random
) -> tuple[list[str], str]:
    if kind == "light_edit":
        out = []
        for p in paras:
            chars = list(p)
            for _ in range(max(1, len(chars) // 60)):
                chars[rng.randrange(len(chars))] = rng.choice(_EDIT_CHARS)
            out.append("".join(chars).replace("，", ",", 1))
        return out, title
    if kind == "title_rewrite":
        return ["本文来源：城市新闻网", *paras], "【转载】" + title
    if kind == "reorder":
        i = rng.randrange(len(paras) - 1)
        paras = list(paras)
        paras[i], paras[i + 1] = paras[i + 1], paras[i]
        return paras, title
    if kind == "abridge":
        drop = rng.randrange(1, len(paras))
        return [p for i, p in enumerate(paras) if i != drop], title
    if kind == "excerpt":
        return paras[: max(2, round(len(paras) * 0.5))], title
    if kind == "script":
        s2t = opencc.OpenCC("s2t")
        return [s2t.convert(p) for p in paras], s2t.convert(title)
    if kind == "boilerplate":
        return [*paras[:2], "点击进入专题：城市观察", *paras[2:], "责任编辑：李华"], title
    return list(paras), title


def gold_stream(seed: int = 2026) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Raw-page messages in arrival order and their labels (url, story, kind, transforms)."""
    rng = random.Random(seed)
    items: list[tuple[dict[str, str], dict[str, Any]]] = []
    later: list[tuple[dict[str, str], dict[str, Any]]] = []
    charsets = ["utf-8", "utf-8", "gbk", "big5"]
    for story, paras in sorted(ARTICLES.items()):
        title = paras[0][:14]
        url = f"https://news.example.cn/{story}/0.html"
        items.append(
            (
                raw_page(url, paras, title),
                {"url": url, "story": story, "kind": "first", "first": True, "transforms": []},
            )
        )
        for n in range(1, rng.randint(3, 5)):
            kinds = rng.sample(TRANSFORMS, rng.randint(1, 2))
            p, t = list(paras), title
            for kind in kinds:
                p, t = _apply(kind, p, t, rng)
            url = f"https://site{n}.example.com/{story}.html"
            msg = raw_page(
                url,
                p,
                t,
                template=rng.choice(sorted(TEMPLATES)),
                charset="big5" if "script" in kinds else rng.choice(charsets),
            )
            later.append(
                (
                    msg,
                    {
                        "url": url,
                        "story": story,
                        "first": False,
                        "kind": "excerpt" if "excerpt" in kinds else "copy",
                        "transforms": kinds,
                    },
                )
            )
    for name, paras in (("hard_a", HARD_A), ("hard_b", HARD_B)):
        url = f"https://gov.example.cn/{name}.html"
        later.append(
            (
                raw_page(url, paras, paras[0][:12]),
                {
                    "url": url,
                    "story": name,
                    "kind": "hard_negative",
                    "first": True,
                    "transforms": [],
                },
            )
        )
    rng.shuffle(later)
    stream = items + later
    for i, (msg, _) in enumerate(stream):
        msg["fetched_at"] = f"2026-03-01T{i // 60:02d}:{i % 60:02d}:00Z"
    return [m for m, _ in stream], [lab for _, lab in stream]
