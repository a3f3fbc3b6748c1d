"""Hostile and well-formed inputs, generated in memory (no dev data): shared by the hostile
unit tests, the hypothesis properties and the atheris seed corpus.

Each builder returns what the engine reads: a raw-page line (``bytes``), a message dict,
or an HTML string to put in one.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
from typing import Any

# Common characters, as real text is made of (no rare characters: the decoder's
# plausibility check would be right to doubt them).
_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也"
    "能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现"
    "实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表"
    "间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系"
    "军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资"
    "边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据"
)
_FULL = "，。"


def sentence(rng: random.Random, words: int = 12) -> str:
    """A sentence of common characters that no other call is likely to repeat."""
    body = "".join(rng.choice(_CHARS) for _ in range(words * 2))
    cut = len(body) // 2
    return body[:cut] + "，" + body[cut:] + "。"


def article(rng: random.Random, paragraphs: int = 5) -> list[str]:
    return ["".join(sentence(rng) for _ in range(3)) for _ in range(paragraphs)]


def page_html(paragraphs: list[str], title: str = "新闻标题", charset: str = "utf-8") -> str:
    """A page in a plain template whose only non-ASCII text is the title and paragraphs
    (so that it can be encoded in any Chinese charset they fit)."""
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        f'<html><head><meta charset="{charset}"><title>{title} - Daily</title></head><body>'
        '<div class="nav"><a href="/">Home</a> <a href="/n">News</a></div>'
        f'<div class="content"><h1>{title}</h1>{body}</div>'
        '<div class="foot">Copyright 2026 Daily News</div></body></html>'
    )


def message(url: str, html: str | None = None, **fields: Any) -> dict[str, Any]:
    """A raw-page message; ``html`` None leaves the body to ``fields``."""
    msg: dict[str, Any] = {
        "url": url,
        "fetched_at": "2026-03-01T00:00:00Z",
        "content_type": "text/html; charset=utf-8",
    }
    if html is not None:
        msg["html"] = html
    msg.update(fields)
    return msg


def b64_message(
    url: str, body: bytes, content_type: str = "text/html", **fields: Any
) -> dict[str, Any]:
    return message(
        url, None, body_b64=base64.b64encode(body).decode(), content_type=content_type, **fields
    )


def line(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, ensure_ascii=False).encode()


def good_line(rng: random.Random, url: str) -> bytes:
    """A page that must be decided (a fresh article in a plain template)."""
    return line(message(url, page_html(article(rng))))


# ------------------------------------------------------------------- pathological HTML


def deep_nesting(tag: str = "div", depth: int = 100_000) -> str:
    return f"<html><body>{f'<{tag}>' * depth}<p>{'深层嵌套的正文，' * 4}</p>{f'</{tag}>' * depth}"


def no_tags(size: int = 1 << 20) -> str:
    """``size`` bytes (UTF-8) of Chinese prose without a single tag."""
    rng = random.Random(7)
    chunk = "".join(sentence(rng) for _ in range(64))
    text = chunk * (size // len(chunk.encode()) + 1)
    return text[: size // 3]


def tiny_elements(count: int = 1_000_000, element: str = "<i>x</i>") -> str:
    return "<html><body>" + element * count


def entity_flood(count: int = 500_000) -> str:
    return "<html><body><p>" + "&amp;&#x4e2d;&lt;&nbsp;&#12354;" * count + "</p>"


def cdata_flood(count: int = 500_000) -> str:
    return "<html><body><p>" + "<![CDATA[<p>]]>" * count + "</p>"


def attribute_flood(count: int = 300_000) -> str:
    """One element with ``count`` distinct attributes: lexbor parses it in quadratic time
    (300,000 attributes: minutes)."""
    attrs = " ".join(f"a{i}=1" for i in range(count))
    return f"<html><body><p {attrs}>{'属性洪水之后的正文，' * 4}</p>"


def billion_laughs() -> str:
    entities = '<!ENTITY lol0 "lol">' + "".join(
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    )
    return (
        f'<?xml version="1.0"?><!DOCTYPE html [{entities}]>'
        '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>笑</title></head><body>'
        f"<article><p>{'今天天气很好，我们去公园散步。' * 3}&lol9;</p></article></body></html>"
    )


def external_entities(base_url: str) -> str:
    """XHTML whose DTD pulls a local file and two URLs under ``base_url``."""
    return (
        '<?xml version="1.0"?><!DOCTYPE html SYSTEM "'
        + base_url
        + '/doctype" [<!ENTITY xxe SYSTEM "file:///etc/passwd">'
        f'<!ENTITY net SYSTEM "{base_url}/entity"><!ENTITY % dtd SYSTEM "{base_url}/dtd"> %dtd;]>'
        '<html xmlns="http://www.w3.org/1999/xhtml"><body><article>'
        f"<p>{'今天天气很好，我们去公园散步。' * 3}&xxe;&net;&fromdtd;</p></article></body></html>"
    )


def gzip_body(html: str) -> bytes:
    return gzip.compress(html.encode())


PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\n" + bytes(range(256))
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
