"""Property tests (hypothesis) of the stages a hostile page goes through: the raw-page
parser, the decoder, the extractor and the whole engine. For every generated input each
returns a record, never raises, and what it returns holds the invariants of
``tests/fuzz/targets.py`` (valid schema records, clean text, typed reasons).

Sized for CI: about a minute in all (``FUZZ_EXAMPLES`` scales every test's examples).
"""

from __future__ import annotations

import base64
import json
import os
import random
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.decode import decode
from neardup.engine import Engine, analyse
from neardup.extract import extract
from neardup.records import Decoded, RawPage, Rejected
from neardup.sandbox import Sandbox
from neardup.store import MemoryKV
from tests.fuzz import inputs
from tests.fuzz.targets import (
    CFG,
    CONTENT_TYPES,
    MAX_BYTES,
    check_decoded,
    check_extracted,
    check_outcome,
    check_parsed,
    decode_target,
    engine_target,
    extract_target,
    parse_raw_target,
)

_SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(examples * _SCALE)),
        deadline=None,  # a slow page is data, not a failure; the sandbox bounds time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ----------------------------------------------------------------------- strategies

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = ("url", "fetched_at", "content_type", "html", "body_b64", "page_id", "site")
_GOOD = {
    "url": st.just("https://p.example.cn/x"),
    "fetched_at": st.sampled_from(["2026-03-01T00:00:00Z", "2026-03-01T08:00:00+08:00"]),
    "content_type": st.sampled_from(CONTENT_TYPES),
    "html": st.text(max_size=200),
    "body_b64": st.binary(max_size=150).map(lambda b: base64.b64encode(b).decode()),
    "page_id": st.text(min_size=1, max_size=20),
    "site": st.text(max_size=10),
}


@st.composite
def raw_messages(draw: st.DrawFn) -> bytes:
    """A JSON object with each field present or not, well-typed or not, then maybe cut."""
    msg: dict[str, Any] = {}
    for name in _FIELDS:
        kind = draw(st.sampled_from(["good", "good", "absent", "junk"]))
        if kind == "good":
            msg[name] = draw(_GOOD[name])
        elif kind == "junk":
            msg[name] = draw(json_values)
    if draw(st.booleans()):
        msg[draw(st.text(max_size=6))] = draw(json_values)
    line = json.dumps(msg, ensure_ascii=draw(st.booleans())).encode()
    if draw(st.integers(0, 4)) == 0:
        line = line[: draw(st.integers(0, len(line)))]
    return line


# Characters that HTML parsers and the extractor treat specially, and Chinese prose.
_SPECIAL = ["&amp;", "&#x4e2d;", "&#12354;", "&nbsp;", "&lol;", "<!--", "-->", "<![CDATA[",
            "]]>", "\x00", "\ufffd", "\u200b", "责任编辑：", "版权所有", "分享到"]  # fmt: skip
_HTML_TEXT = st.lists(
    st.sampled_from(
        [*"今天天气很好，我们去公园散步。的一是在不了有和人<>&;\"'= \n\t/abc!?", *_SPECIAL]
    ),
    max_size=40,
).map("".join)
_TAGS = (
    "html", "head", "body", "title", "meta", "p", "div", "span", "b", "i", "a", "br", "h1",
    "section", "article", "table", "tr", "td", "ul", "li", "script", "style", "svg", "math",
    "template", "textarea", "noscript", "iframe", "font", "center", "select", "option",
    "frameset", "plaintext", "xmp", "img",
)  # fmt: skip
_ATTRS = st.lists(
    st.tuples(
        st.sampled_from(["class", "id", "style", "href", "content", "property", "charset", "x"]),
        st.sampled_from(["article", "content", "side", "nav", "og:title", "utf-8", '"', "<>"])
        | st.text(max_size=10),
    ),
    max_size=3,
)


def _element(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    def build(tag: str, attrs: list[tuple[str, str]], kids: list[str], close: bool) -> str:
        attr_text = "".join(f' {k}="{v}"' for k, v in attrs)
        return f"<{tag}{attr_text}>{''.join(kids)}" + (f"</{tag}>" if close else "")

    return st.builds(build, st.sampled_from(_TAGS), _ATTRS, st.lists(children, max_size=5),
                     st.booleans())  # fmt: skip


_PROLOGUES = ["", "<!DOCTYPE html>", '<?xml version="1.0"?>', '<!DOCTYPE html [<!ENTITY l "l">]>']
tag_soup = st.tuples(
    st.sampled_from(_PROLOGUES), st.recursive(_HTML_TEXT, _element, max_leaves=30)
).map("".join)

_CODECS = ("utf-8", "gbk", "big5", "utf-16-le", "shift_jis", "latin-1")


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    """(body, content type): tag soup in some charset with some label, or plain bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=400)), draw(st.sampled_from(CONTENT_TYPES))
    html = draw(tag_soup)
    codec = draw(st.sampled_from(_CODECS))
    label = draw(st.sampled_from([*CONTENT_TYPES, f"text/html; charset={codec}"]))
    return html.encode(codec, "ignore"), label


# ------------------------------------------------------------------------ raw pages


@fuzz_settings(1000)
@given(st.binary(max_size=600))
def test_parse_raw_takes_any_bytes(data: bytes) -> None:
    parse_raw_target(data)


@fuzz_settings(800)
@given(raw_messages())
def test_parse_raw_takes_any_message(line: bytes) -> None:
    check_parsed(parse_raw(line, MAX_BYTES), MAX_BYTES, line)


@fuzz_settings(150)
@given(st.text(st.characters(codec=None, min_codepoint=0), max_size=300))
def test_parse_raw_takes_any_text_even_lone_surrogates(text: str) -> None:
    check_parsed(parse_raw(text, MAX_BYTES), MAX_BYTES)


# --------------------------------------------------------------------------- decode


@fuzz_settings(500)
@given(bodies())
def test_decode_takes_any_body(body_and_type: tuple[bytes, str]) -> None:
    body, content_type = body_and_type
    check_decoded(decode(RawPage("p", "https://p.example.cn/", "2026-03-01T00:00:00Z",
                                 content_type, body)))  # fmt: skip


@fuzz_settings(100)
@given(st.binary(max_size=300))
def test_decode_takes_any_text_body(data: bytes) -> None:
    decode_target(bytes([0x80]) + data)  # the body as a str with lone surrogates


@fuzz_settings(40)
@given(st.randoms(use_true_random=False), st.sampled_from(["utf-8", "gbk", "gb18030", "big5"]),
       st.booleans())  # fmt: skip
def test_decode_reads_real_text_back_whatever_the_label(
    rng: random.Random, codec: str, labelled: bool
) -> None:
    """Chinese text in a Chinese charset decodes to itself, labelled or not."""
    paras, title = inputs.article(rng), "新闻标题"
    if codec == "big5":  # Big5 holds traditional characters
        paras, title = ["今天天氣很好，我們去公園散步。" * 4] * 3, "新聞標題"
    html = inputs.page_html(paras, title)
    label = f"text/html; charset={codec}" if labelled else "text/html"
    out = decode(RawPage("p", "https://p.example.cn/", "2026-03-01T00:00:00Z", label,
                         html.encode(codec)))  # fmt: skip
    assert isinstance(out, Decoded) and out.html == html, out


# -------------------------------------------------------------------------- extract


@fuzz_settings(500)
@given(tag_soup, st.sampled_from(["density", "density", "resiliparse"]))
def test_extract_takes_any_tag_soup(html: str, extractor: str) -> None:
    page = RawPage("p", "https://p.example.cn/", "2026-03-01T00:00:00Z", "text/html", html)
    check_extracted(extract(Decoded(page, html, "utf-8", "text"), extractor))


@fuzz_settings(25)
@given(tag_soup)
def test_trafilatura_takes_any_tag_soup(html: str) -> None:
    extract_target(bytes([4]) + html.encode("utf-8", "surrogatepass"))


# --------------------------------------------------------------------------- engine


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """A few raw lines: real pages (some repeated, some sharing an id), tag soup, junk."""
    rng = draw(st.randoms(use_true_random=False))
    lines: list[bytes] = []
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["page", "page", "soup", "junk", "again", "same-id"]))
        url = f"https://s{draw(st.integers(0, 2))}.example.cn/{i}"
        if kind == "page" or (kind in ("again", "same-id") and not lines):
            lines.append(inputs.good_line(rng, url))
        elif kind == "soup":
            lines.append(inputs.line(inputs.message(url, draw(tag_soup))))
        elif kind == "junk":
            lines.append(draw(raw_messages()))
        elif kind == "again":
            lines.append(draw(st.sampled_from(lines)))
        else:
            msg = inputs.message(url, inputs.page_html(inputs.article(rng)), page_id="one-id")
            lines.append(inputs.line(msg))
    return lines


@fuzz_settings(100)
@given(streams())
def test_engine_answers_every_page_once_and_never_raises(lines: list[bytes]) -> None:
    engine = Engine(MemoryKV(), CFG)
    outs = [engine.process(parse_raw(line, CFG.max_bytes)) for line in lines]
    assert len(outs) == len(lines) == engine.stats.pages
    for out in outs:
        check_outcome(out)
    decided = sum(engine.stats.decisions.values())
    assert decided + engine.stats.repeated + sum(engine.stats.rejects.values()) == len(lines)


@fuzz_settings(15)
@given(streams())
def test_engine_in_its_sandbox_decides_as_in_process(lines: list[bytes]) -> None:
    """The default engine (analysis in the sandbox) gives the same decisions."""
    boxed = Engine(MemoryKV(), EngineConfig(max_bytes=CFG.max_bytes))
    here = Engine(MemoryKV(), CFG)
    try:
        for line in lines:
            a = boxed.process(parse_raw(line, CFG.max_bytes))
            b = here.process(parse_raw(line, CFG.max_bytes))
            check_outcome(a)
            if isinstance(a, Rejected) or isinstance(b, Rejected):
                assert isinstance(a, Rejected) and isinstance(b, Rejected), (a, b)
                assert (a.reason, a.detail) == (b.reason, b.detail)
            else:
                keep = ("page_id", "decision", "duplicate_of", "cluster_id", "fingerprint")
                assert {k: a.decision[k] for k in keep} == {k: b.decision[k] for k in keep}
    finally:
        boxed.close()


@fuzz_settings(300)
@given(st.binary(max_size=800))
def test_engine_takes_any_bytes(data: bytes) -> None:
    engine_target(data)


@fuzz_settings(30)
@given(tag_soup)
def test_sandboxed_analysis_equals_analysis(html: str) -> None:
    assume(html)
    page = RawPage("p", "https://p.example.cn/", "2026-03-01T00:00:00Z", "text/html", html)
    with Sandbox(CFG.with_overrides(extract_timeout_s=5.0)) as sandbox:
        boxed = sandbox.analyse(page)
    expect = analyse(page, CFG)
    if isinstance(expect, Rejected):
        assert isinstance(boxed, Rejected) and boxed.detail == expect.detail
    else:
        assert boxed == expect
