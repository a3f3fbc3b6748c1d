"""Bad and hostile input (issue 4, "Bad input"): every case gets one rejection with a typed
reason, or a sensible decision, and the page after it is still decided.

Inputs are generated in memory (``tests/fuzz/inputs.py``); none comes from the dev data.
The engine runs as ``neardup dedup`` runs it: default settings, analysis in the sandbox.
"""

from __future__ import annotations

import dataclasses
import http.server
import itertools
import json
import mmap
import os
import random
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from neardup import cli
from neardup.config import EngineConfig
from neardup.contract import parse_message, parse_raw, validate
from neardup.decode import decode
from neardup.engine import Analysed, Engine, Outcome, analyse, page_order
from neardup.extract import EXTRACTORS, extract
from neardup.records import Decoded, Extracted, RawMessage, RawPage, Reason, Rejected
from neardup.sandbox import Sandbox
from neardup.sandbox.wire import ANALYSE, page_frame
from neardup.store import MemoryKV
from tests.fuzz import inputs
from tests.fuzz.inputs import b64_message, good_line, line, message, page_html

CFG = EngineConfig()
#: For pages that take seconds to analyse by design, where the test is about how they are
#: refused, not how long they may take: on a loaded machine such a page can take longer
#: than the default 5 s, and would be rejected as a timeout.
SLOW_OK = dataclasses.replace(CFG, extract_timeout_s=60.0)
# Analysis in this process: for the cases that test a stage, not the sandbox.
IN_PROCESS = CFG.with_overrides(extract_timeout_s=0.0)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(request.node.name)


def run(lines: Sequence[bytes], cfg: EngineConfig = CFG) -> list[Outcome | Rejected]:
    engine = Engine(MemoryKV(), cfg)
    try:
        return [engine.process(parse_raw(raw, cfg.max_bytes)) for raw in lines]
    finally:
        engine.close()


def check_rejected(
    out: Outcome | Analysed | Rejected, reason: Reason, detail: str = ""
) -> Rejected:
    assert isinstance(out, Rejected), out
    assert out.reason is reason, (out.reason, out.detail)
    assert detail in out.detail, out.detail
    assert validate("rejected", out.to_json()) == []
    return out


def check_decided(out: Outcome | Rejected) -> Outcome:
    assert isinstance(out, Outcome), out
    assert validate("decision", out.decision) == []
    return out


def rejects_then_goes_on(
    rng: random.Random, bad: bytes, reason: Reason, detail: str = "", cfg: EngineConfig = CFG
) -> Rejected:
    """``bad`` is rejected for ``reason``, and a good page after it is decided."""
    bad_out, good_out = run([bad, good_line(rng, "https://ok.example.cn/next")], cfg)
    check_decided(good_out)
    return check_rejected(bad_out, reason, detail)


def decided_then_goes_on(rng: random.Random, page: bytes, cfg: EngineConfig = CFG) -> Outcome:
    out, good_out = run([page, good_line(rng, "https://ok.example.cn/next")], cfg)
    check_decided(good_out)
    return check_decided(out)


# ---------------------------------------------------------------- not JSON, wrong fields


@pytest.mark.parametrize(
    ("bad", "detail"),
    [
        (b"{not json", ""),
        (b"hello world", ""),
        (b'{"url": "https://a.example.cn/t", "html": "<p>cut', "unexpected end"),
        (b"\xff\xfe{\x00", "not valid UTF-8"),
        (b'{"url": NaN}', ""),
        (b"[" * 5000 + b"]" * 5000, ""),
    ],
    ids=["garbage", "words", "truncated", "not-utf8", "nan", "deep-json"],
)
def test_not_json(rng: random.Random, bad: bytes, detail: str) -> None:
    rejects_then_goes_on(rng, bad, Reason.BAD_JSON, detail)


def test_truncated_json_keeps_its_url_for_the_dead_letter(rng: random.Random) -> None:
    whole = good_line(rng, "https://a.example.cn/cut")
    out = rejects_then_goes_on(rng, whole[: len(whole) // 2], Reason.BAD_JSON)
    assert out.url == "https://a.example.cn/cut" and out.page_id is not None


_OK = {"url": "https://a.example.cn/f", "fetched_at": "2026-03-01T00:00:00Z",
       "content_type": "text/html"}  # fmt: skip


@pytest.mark.parametrize(
    ("msg", "detail"),
    [
        ([1, 2], "expected object"),
        ({**_OK, "html": "<p>x</p>", "url": None}, "url"),
        ({k: v for k, v in _OK.items() if k != "url"} | {"html": "x"}, "'url'"),
        ({k: v for k, v in _OK.items() if k != "fetched_at"} | {"html": "x"}, "'fetched_at'"),
        ({**_OK, "html": "x", "fetched_at": "yesterday"}, "date-time"),
        ({**_OK, "html": "x", "fetched_at": "2026-02-30T00:00:00Z"}, "date-time"),
        ({**_OK, "html": "x", "content_type": 5}, "content_type"),
        ({**_OK, "html": ["<p>x</p>"]}, "html"),
        ({**_OK, "html": "x", "page_id": ""}, "page_id"),
        ({**_OK, "html": "x", "page_id": 7}, "page_id"),
        ({**_OK, "html": "x", "site": {"a": 1}}, "site"),
        ({**_OK, "html": "<p>x</p>", "body_b64": "eA=="}, "exactly one of"),
        (dict(_OK), "exactly one of"),
    ],
    ids=[
        "array", "null-url", "no-url", "no-fetched_at", "bad-time", "no-such-day",
        "int-content_type", "html-list", "empty-page_id", "int-page_id", "object-site",
        "both-bodies", "no-body",
    ],
)  # fmt: skip
def test_missing_and_mistyped_fields(rng: random.Random, msg: object, detail: str) -> None:
    out = rejects_then_goes_on(rng, line(msg), Reason.SCHEMA, detail)  # type: ignore[arg-type]
    if isinstance(msg, dict) and isinstance(msg.get("url"), str):
        assert out.url == msg["url"]


@pytest.mark.parametrize(
    "encoded", ["!!!not base64", "eA=", "eA==\n", "e A==", "eA==eA=="], ids=str.strip
)
def test_invalid_base64(rng: random.Random, encoded: str) -> None:
    bad = line(message("https://a.example.cn/b", None, body_b64=encoded))
    rejects_then_goes_on(rng, bad, Reason.BAD_BASE64)


# ---------------------------------------------------------------------------- charsets


TRADITIONAL = "今天天氣很好，我們去公園散步。公園裡的花開了，孩子們在草地上奔跑，老人們在樹下下棋。"


def _body_text(out: Outcome | Rejected, engine_text: str) -> None:
    assert isinstance(out, Outcome)
    assert out.decision["title"].startswith(engine_text)


@pytest.mark.parametrize(
    ("codec", "label", "chosen"),
    [
        ("gbk", "text/html; charset=utf-8", "gb18030"),
        ("big5", "text/html; charset=gb2312", "big5hkscs"),
        ("gbk", "text/html", "gb18030"),
        ("big5", "text/html; charset=x-no-such-charset", "big5hkscs"),
        ("utf-8", "text/html; charset=gbk", "utf-8"),
    ],
    ids=["gbk-as-utf8", "big5-as-gb2312", "gbk-unlabelled", "big5-unknown-label", "utf8-as-gbk"],
)
def test_wrong_or_absent_charset_decodes(
    rng: random.Random, codec: str, label: str, chosen: str
) -> None:
    title, paras = "地铁新线开通", inputs.article(rng)
    if codec == "big5":  # Big5 holds traditional characters
        title, paras = "地鐵新線開通", [TRADITIONAL] * 5
    html = page_html(paras, title, charset="utf-8")
    raw = RawPage("p", "https://a.example.cn/c", "2026-03-01T00:00:00Z", label,
                  html.encode(codec))  # fmt: skip
    decoded = decode(raw)
    assert isinstance(decoded, Decoded) and decoded.charset == chosen, decoded
    assert decoded.html == html
    msg = b64_message("https://a.example.cn/c", raw.body, label)  # type: ignore[arg-type]
    _body_text(decided_then_goes_on(rng, line(msg)), title)


@pytest.mark.parametrize("other", ["gbk", "big5"])
def test_mixed_encodings_in_one_page_decode_run_by_run(rng: random.Random, other: str) -> None:
    """A UTF-8 template around paragraphs pasted in from a GBK (or Big5) page."""
    paras = inputs.article(rng, 6) if other == "gbk" else [TRADITIONAL] * 6
    head = ("<html><head><title>混合编码</title></head><body><div class='content'>"
            + "".join(f"<p>{p}</p>" for p in paras[:2])).encode()  # fmt: skip
    tail = ("".join(f"<p>{p}</p>" for p in paras[2:]) + "</div></body></html>").encode(other)
    raw = RawPage("p", "https://a.example.cn/m", "2026-03-01T00:00:00Z", "text/html", head + tail)
    decoded = decode(raw)
    assert isinstance(decoded, Decoded) and decoded.layer == "mixed", decoded
    assert all(p in decoded.html for p in paras)
    out = decided_then_goes_on(rng, line(b64_message("https://a.example.cn/m", head + tail)))
    assert out.decision["text_chars"] >= sum(map(len, paras)) * 0.9


def test_bytes_in_no_charset_are_rejected(rng: random.Random) -> None:
    """Random high bytes: no Chinese codec reads them, and what a single-byte codec makes
    of them is no text."""
    noise = bytes(random.Random(1).randrange(0x80, 0x100) for _ in range(20_000))
    bad = line(b64_message("https://a.example.cn/n", b"<html><body><p>" + noise))
    out, good = run([bad, good_line(rng, "https://ok.example.cn/next")])
    check_decided(good)
    assert isinstance(out, Rejected) and out.reason in (Reason.DECODE, Reason.NO_TEXT), out


# ---------------------------------------------------------------------------- not HTML


@pytest.mark.parametrize(
    ("body", "content_type", "detail"),
    [
        (inputs.PDF, "application/pdf", "PDF"),
        (inputs.PDF, "text/html", "PDF"),
        (inputs.PNG, "text/html", "PNG"),
        (inputs.gzip_body("<html><body><p>压缩</p></body></html>"), "text/html", "gzip"),
        (b"<html><body><p>not an image</p></body></html>", "image/jpeg", "image/jpeg"),
    ],
    ids=["pdf", "pdf-labelled-html", "png", "gzip", "html-labelled-jpeg"],
)
def test_non_html_bodies(rng: random.Random, body: bytes, content_type: str, detail: str) -> None:
    bad = line(b64_message("https://a.example.cn/x", body, content_type))
    rejects_then_goes_on(rng, bad, Reason.NOT_HTML, detail)


# ------------------------------------------------------------------- empty, no main text


@pytest.mark.parametrize(
    "msg",
    [
        message("https://a.example.cn/e", ""),
        message("https://a.example.cn/e", "   \n\t  "),
        b64_message("https://a.example.cn/e", b""),
        message("https://a.example.cn/e", "<html><head><title>空</title></head><body></body></html>"),
        message("https://a.example.cn/e", '<html><body><ul><li><a href="/1">首页</a></li>'
                '<li><a href="/2">新闻</a></li><li><a href="/3">关于我们</a></li></ul></body></html>'),
        message("https://a.example.cn/e", "<html><body><script>var a='很长的脚本，不是正文。'"
                ".repeat(100);</script><style>p{}</style></body></html>"),
    ],
    ids=["empty", "whitespace", "empty-bytes", "empty-body", "only-links", "only-script"],
)  # fmt: skip
def test_empty_pages_and_pages_without_main_text(
    rng: random.Random, msg: dict[str, object]
) -> None:
    rejects_then_goes_on(rng, line(msg), Reason.NO_TEXT)


def test_copyright_footer_alone_is_no_text(rng: random.Random) -> None:
    footer = (
        "<html><body><div class='foot'><p>Copyright © 2026 城市新闻网 版权所有 未经授权禁止转载</p>"
        "<p>本网站所刊登的信息，未经协议授权，禁止下载使用。</p><p>责任编辑：王小明</p></div></body></html>"
    )
    rejects_then_goes_on(rng, line(message("https://a.example.cn/f", footer)), Reason.NO_TEXT)


# ------------------------------------------------------------------------- oversized


def test_oversized_bodies_are_refused_before_parsing(rng: random.Random) -> None:
    cfg = CFG.with_overrides(max_bytes=64 * 1024)
    big = page_html(inputs.article(rng, 400))
    assert len(big.encode()) > cfg.max_bytes
    out = rejects_then_goes_on(
        rng, line(message("https://a.example.cn/big", big)), Reason.TOO_LARGE, "over", cfg
    )
    assert out.url == "https://a.example.cn/big"
    as_bytes = line(b64_message("https://a.example.cn/big", big.encode()))
    rejects_then_goes_on(rng, as_bytes, Reason.TOO_LARGE, "over", cfg)


def test_the_default_body_cap_holds_and_costs_no_parse(rng: random.Random) -> None:
    assert CFG.max_bytes == 5 * 1024 * 1024
    huge = "<html><body>" + "<p>很长的正文，</p>" * (CFG.max_bytes // 20)
    # the contract's size check refuses it, before the HTML reaches a parser
    detail = f"html is over {CFG.max_bytes} bytes"
    rejects_then_goes_on(
        rng, line(message("https://a.example.cn/5m", huge)), Reason.TOO_LARGE, detail
    )


def test_a_page_built_by_hand_is_capped_too() -> None:
    """The cap holds for a RawPage from any source, not only from parse_raw."""
    cfg = CFG.with_overrides(max_bytes=2048, extract_timeout_s=0.0)
    raw = RawPage("p", "https://a.example.cn/h", "2026-03-01T00:00:00Z", "text/html", "中" * 1000)
    out = Engine(MemoryKV(), cfg).process(raw)
    check_rejected(out, Reason.TOO_LARGE, "over 2048 bytes")


def test_main_text_over_the_text_cap_is_too_large(rng: random.Random) -> None:
    cfg = CFG.with_overrides(max_text_chars=2_000)
    long_page = page_html(inputs.article(rng, 60))
    rejects_then_goes_on(
        rng, line(message("https://a.example.cn/t", long_page)), Reason.TOO_LARGE, "characters", cfg
    )


# ------------------------------------------------------------------- pathological HTML


@pytest.mark.parametrize("tag", ["div", "span", "b", "table", "a"])
def test_100000_levels_of_nesting(rng: random.Random, tag: str) -> None:
    html = inputs.deep_nesting(tag, 100_000)
    # refused by the depth estimate, before parsing
    rejects_then_goes_on(rng, line(message("https://a.example.cn/d", html)), Reason.TOO_LARGE,
                         "elements nested about", SLOW_OK)  # fmt: skip


def test_one_megabyte_without_a_tag_is_read_as_text(rng: random.Random) -> None:
    page = line(message("https://a.example.cn/t", inputs.no_tags()))
    out = decided_then_goes_on(rng, page, SLOW_OK)
    assert out.decision["text_chars"] > 100_000


# (count, element, reason); the pages are built in the test, not at collection
@pytest.mark.parametrize(
    ("count", "element", "reason"),
    [
        (600_000, "<i>x</i>", Reason.NO_TEXT),  # 4.8 MB: just under the cap
        (1_200_000, "<br>", Reason.NO_TEXT),
        (1_500_000, "<i>", Reason.TOO_LARGE),  # each one left open: the depth estimate
    ],
    ids=["closed", "void", "unclosed"],
)
def test_millions_of_tiny_elements(
    rng: random.Random, count: int, element: str, reason: Reason
) -> None:
    html = inputs.tiny_elements(count, element)
    rejects_then_goes_on(rng, line(message("https://a.example.cn/t", html)), reason, cfg=SLOW_OK)


def test_entity_flood(rng: random.Random) -> None:
    out, good = run([line(message("https://a.example.cn/e", inputs.entity_flood())),
                     good_line(rng, "https://ok.example.cn/next")], SLOW_OK)  # fmt: skip
    check_decided(good)
    # "中" and "あ" repeated: text, but one word; or the page is too long to be a page
    assert isinstance(out, Rejected) and out.reason in (Reason.NO_TEXT, Reason.TOO_LARGE), out


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "unclosed"])
def test_cdata_flood(rng: random.Random, closed: bool) -> None:
    """HTML has no CDATA outside SVG and MathML: each is a bogus comment, and "]]>" is
    text, a million characters of it here: too long, or no words."""
    html = inputs.cdata_flood(300_000) if closed else "<p>" + "<![CDATA[" * 500_000
    out, good = run([line(message("https://a.example.cn/c", html)),
                     good_line(rng, "https://ok.example.cn/next")], SLOW_OK)  # fmt: skip
    check_decided(good)
    assert isinstance(out, Rejected) and out.reason in (Reason.NO_TEXT, Reason.TOO_LARGE), out


def test_attribute_flood_is_stopped_by_the_time_limit(rng: random.Random) -> None:
    """One element with 300,000 attributes: lexbor takes minutes (quadratic), the sandbox
    kills the worker at the limit, the page is counted as a timeout, and the next page
    gets a new worker."""
    cfg = CFG.with_overrides(extract_timeout_s=1.0)
    engine = Engine(MemoryKV(), cfg)
    flood = line(message("https://a.example.cn/a", inputs.attribute_flood(300_000)))
    # lexbor would take minutes: a timeout rejection is the limit at work
    out = engine.process(parse_raw(flood, cfg.max_bytes))
    assert check_rejected(out, Reason.TIMEOUT, "more than 1.0 s").url == "https://a.example.cn/a"
    check_decided(
        engine.process(parse_raw(good_line(rng, "https://ok.example.cn/n"), cfg.max_bytes))
    )
    engine.close()
    assert engine.stats.rejects == {"timeout": 1}
    assert engine.sandbox is not None and engine.sandbox.starts == 2


@pytest.fixture(scope="module")
def entity_server() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that counts requests: an external entity must never reach it."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'<!ENTITY fromdtd "EXTERNAL-DTD-WAS-LOADED">')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


@pytest.mark.parametrize("extractor", sorted(set(EXTRACTORS) - {"fast"}))
@pytest.mark.parametrize("content_type", ["text/html", "application/xhtml+xml"])
def test_doctype_entities_are_never_expanded_nor_fetched(
    entity_server: tuple[str, list[str]], extractor: str, content_type: str
) -> None:
    """Billion laughs and external entities, through every extractor: lexbor and lxml's
    HTML parser (trafilatura) read a DOCTYPE's internal subset as nothing."""
    base, hits = entity_server
    for html in (inputs.billion_laughs(), inputs.external_entities(base)):
        raw = RawPage("p", "https://a.example.cn/x", "2026-03-01T00:00:00Z", content_type,
                      html.encode())  # fmt: skip
        decoded = decode(raw)
        assert isinstance(decoded, Decoded)
        out = extract(decoded, extractor)
        text = out.text if isinstance(out, Extracted) else ""
        assert len(text) < 1000 and "lollol" not in text
        assert "root:" not in text and "EXTERNAL-DTD" not in text
    assert hits == []


def test_xml_pages_through_the_engine(
    rng: random.Random, entity_server: tuple[str, list[str]]
) -> None:
    base, hits = entity_server
    for html in (inputs.billion_laughs(), inputs.external_entities(base)):
        msg = message("https://a.example.cn/x", html, content_type="application/xhtml+xml")
        out, good = run([line(msg), good_line(rng, "https://ok.example.cn/next")])
        check_decided(good)
        if isinstance(out, Outcome):
            assert out.decision["text_chars"] < 1000
    assert hits == []


# --------------------------------------------------------------------------- boilerplate

# A site's standing text: long enough that the noise filter keeps it, as text a crawler
# finds alone on "about", error and login pages and at the foot of every article.
BOILERPLATE = [
    "本网站由城市新闻中心主办，致力于为广大读者提供及时、准确、权威的本地新闻资讯服务。",
    "联系地址：城市新闻大厦十八层。联系电话：一二三四五六七八。欢迎广大读者来信来稿，我们将认真对待每一份意见。",
    "城市新闻网是经国家有关部门批准设立的综合性新闻网站，坚持正确舆论导向，传播主流声音。",
    "网站开设了时政、社会、经济、文化、体育、健康等多个频道，每日更新新闻数百条，服务本地读者。",
    "我们欢迎社会各界人士提供新闻线索，一经采用将给予适当奖励。我们承诺对线索提供者的个人信息严格保密。",
    "本站部分图片和文字来源于网络，如有侵权请及时联系我们，我们将在核实后第一时间予以处理。",
    "读者服务热线每天上午九点至下午五点开通，节假日照常值班，为广大读者答疑解惑，提供帮助。",
]  # fmt: skip


def _clusters(rng: random.Random, pages: Sequence[tuple[str, str, list[str]]]) -> dict[str, str]:
    """Run (name, host, paragraphs) pages in order; each name's final cluster."""
    engine = Engine(MemoryKV(), IN_PROCESS)
    ids = {}
    for name, host, paras in pages:
        out = engine.process(parse_raw(line(message(f"https://{host}/{name}",
                                                    page_html(paras, name))), CFG.max_bytes))  # fmt: skip
        ids[name] = check_decided(out).decision["page_id"]
    return {name: engine.cluster_of(pid) for name, pid in ids.items()}


@pytest.mark.parametrize("order", list(itertools.permutations("xyp")), ids="".join)
@pytest.mark.parametrize("hosts", ["same", "different"])
def test_boilerplate_only_page_does_not_bridge_unrelated_articles(
    rng: random.Random, order: tuple[str, ...], hosts: str
) -> None:
    """x and y: unrelated articles that both end in the site's boilerplate; p: the
    boilerplate alone. In any order, x and y must stay apart (before the fix, p joined
    both: "contained" in each, or each "contains" p)."""
    x, y = inputs.article(rng) + BOILERPLATE, inputs.article(rng) + BOILERPLATE
    host = {"x": "a.example.cn", "y": "a.example.cn" if hosts == "same" else "b.example.cn",
            "p": "a.example.cn" if hosts == "same" else "c.example.cn"}  # fmt: skip
    paras = {"x": x, "y": y, "p": BOILERPLATE}
    clusters = _clusters(rng, [(n, host[n], paras[n]) for n in order])
    assert clusters["x"] != clusters["y"], clusters


def test_boilerplate_only_page_after_the_template_is_learnt(rng: random.Random) -> None:
    """Once a host's template is learnt, a page with nothing but template is decided
    unique and kept out of the index: it joins nothing, and nothing joins through it."""
    engine = Engine(MemoryKV(), IN_PROCESS)
    names = []
    for i in range(CFG.template_min_df + 4):
        msg = message(f"https://a.example.cn/{i}", page_html(inputs.article(rng) + BOILERPLATE))
        names.append(check_decided(engine.process(parse_raw(line(msg), CFG.max_bytes))))
    only = message("https://a.example.cn/about", page_html(BOILERPLATE, "关于我们"))
    out = check_decided(engine.process(parse_raw(line(only), CFG.max_bytes)))
    assert out.decision["decision"] == "unique" and engine.stats.template_only == 1
    assert out.merges == ()
    later = message("https://a.example.cn/late", page_html(inputs.article(rng) + BOILERPLATE))
    late = check_decided(engine.process(parse_raw(line(later), CFG.max_bytes)))
    assert late.decision["decision"] == "unique"
    clusters = {engine.cluster_of(o.decision["page_id"]) for o in [*names, out, late]}
    assert len(clusters) == len(names) + 2  # every page its own cluster


def test_identical_boilerplate_only_pages_are_duplicates_of_each_other(
    rng: random.Random,
) -> None:
    """Two pages with the same boilerplate and nothing else carry the same text: they are
    duplicates (of each other only: see the bridging test)."""
    clusters = _clusters(rng, [("p1", "a.example.cn", BOILERPLATE),
                               ("p2", "c.example.cn", BOILERPLATE)])  # fmt: skip
    assert clusters["p1"] == clusters["p2"]


# ---------------------------------------------------------------- duplicate page ids


def test_same_page_id_same_content_is_a_plain_repeat(rng: random.Random) -> None:
    msg = line(message("https://a.example.cn/1", page_html(inputs.article(rng)), page_id="id-1"))
    first, again = run([msg, msg])
    assert isinstance(first, Outcome) and isinstance(again, Outcome)
    assert again.repeated and not again.conflict and again.decision == first.decision


def test_same_page_id_other_content_keeps_the_first_decision_and_counts_a_conflict(
    rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(MemoryKV(), CFG)
    one = line(message("https://a.example.cn/1", page_html(inputs.article(rng)), page_id="id-1"))
    two = line(message("https://a.example.cn/2", page_html(inputs.article(rng)), page_id="id-1"))
    first = check_decided(engine.process(parse_raw(one, CFG.max_bytes)))
    second = check_decided(engine.process(parse_raw(two, CFG.max_bytes)))
    again = check_decided(engine.process(parse_raw(one, CFG.max_bytes)))
    engine.close()
    assert second.repeated and second.conflict and second.decision == first.decision
    assert again.repeated and not again.conflict
    assert engine.stats.conflicts == 1 and engine.stats.repeated == 2
    assert sum(engine.stats.decisions.values()) == 1
    assert "id-1 came again with other content" in caplog.text


def test_a_page_id_whose_first_message_was_rejected_is_decided_later(
    rng: random.Random,
) -> None:
    bad = line(message("https://a.example.cn/1", "", page_id="id-1"))
    good = line(message("https://a.example.cn/1", page_html(inputs.article(rng)), page_id="id-1"))
    first, second = run([bad, good])
    check_rejected(first, Reason.NO_TEXT)
    assert not check_decided(second).repeated


# ----------------------------------------------------------------------------- sandbox


def _page(html: str, page_id: str = "p") -> RawPage:
    return RawPage(page_id, f"https://a.example.cn/{page_id}", "2026-03-01T00:00:00Z",
                   "text/html", html)  # fmt: skip


def test_sandbox_decides_like_the_engine_in_process(rng: random.Random) -> None:
    pages = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(5)]
    pages.append(_page(inputs.deep_nesting("div", 20_000), "deep"))
    pages.append(_page("", "empty"))
    with Sandbox(CFG) as sandbox:
        for page in pages:
            boxed = sandbox.analyse(page)
            expect = analyse(page, IN_PROCESS)
            if isinstance(expect, Rejected):
                assert isinstance(boxed, Rejected) and boxed.reason is expect.reason
                assert boxed.detail == expect.detail
            else:
                assert boxed == expect and boxed.page is page


def test_sandbox_carries_any_string(rng: random.Random) -> None:
    """A body with a lone surrogate (a hand-built RawPage may hold one) crosses the pipe
    unchanged and is analysed as in this process."""
    page = RawPage("id-1", "https://a.example.cn/s", "2026-03-01T00:00:00Z", "text/html",
                   page_html(inputs.article(rng)) + "\ud800")  # fmt: skip
    with Sandbox(CFG) as sandbox:
        boxed = sandbox.analyse(page)
    assert isinstance(boxed, Analysed) and boxed == analyse(page, IN_PROCESS)


def test_sandbox_frame_headers_carry_any_string_and_64_bit_numbers() -> None:
    """Frame headers go as orjson's JSON, or as json's ASCII escapes when a string holds
    a lone surrogate (orjson refuses those both ways): either reads back the same."""
    from neardup.sandbox.wire import _frame, split_frame

    for header in (
        {"url": "https://a.example.cn/新闻", "fp": 2**64 - 1, "s": [0.25, 1e-9], "n": None},
        {"url": "https://a.example.cn/\ud800", "fp": 2**63, "t": "标题\udfff"},
    ):
        assert split_frame(_frame(header, b"\x00body")) == (header, b"\x00body")


def test_sandbox_frame_hands_decode_the_body_utf8_only_when_it_is_utf8(
    rng: random.Random,
) -> None:
    """The worker passes a text body's payload on as its UTF-8 (decode then does not
    encode it again) only when the payload is exactly ``body.encode("utf-8")``."""
    from neardup.sandbox.wire import page_frame, page_from, split_frame

    clean = _page(page_html(inputs.article(rng)), "clean")
    broken = _page(clean.body + "\ud800", "broken")
    raw = RawPage("raw", "https://a.example.cn/raw", "2026-03-01T00:00:00Z", "text/html",
                  "<p>字节</p>".encode("gb18030"))  # fmt: skip
    for page, utf8 in ((clean, str(clean.body).encode()), (broken, None), (raw, None)):
        got, got_utf8 = page_from(*split_frame(page_frame(page)))
        assert got == page and got_utf8 == utf8
    assert decode(clean, str(clean.body).encode()) == decode(clean)


@pytest.mark.parametrize("field", ["page_id", "url", "site", "fetched_at"])
@pytest.mark.parametrize("cfg", [CFG, IN_PROCESS], ids=["sandbox", "in-process"])
def test_a_lone_surrogate_in_a_field_is_refused(
    rng: random.Random, field: str, cfg: EngineConfig
) -> None:
    """mmh3 crashes the process on a lone surrogate (it hashes the page id and the
    host); the engine refuses such a page first, and its dead letter is writable."""
    page = dataclasses.replace(_page(page_html(inputs.article(rng)), "id-1"), **{field: "x\ud800"})
    engine = Engine(MemoryKV(), cfg)
    out = check_rejected(engine.process(page), Reason.SCHEMA, "lone surrogate")
    json.dumps(out.to_json(), ensure_ascii=False).encode("utf-8")
    good = parse_raw(good_line(rng, "https://ok.example.cn/n"), cfg.max_bytes)
    check_decided(engine.process(good))
    engine.close()


@pytest.mark.parametrize(
    "url", ["http://[::1:bad/x", "http://news.example.cn\uff1a8080/a.html", "http://a.cn\uff0fb"]
)
def test_a_url_without_a_readable_host_is_a_schema_rejection(rng: random.Random, url: str) -> None:
    """urlsplit raises on these (an open IPv6 bracket, a full-width colon or slash in the
    host): the page is refused with the reason, not as an internal error."""
    page = dataclasses.replace(_page(page_html(inputs.article(rng)), "id-1"), url=url)
    check_rejected(analyse(page, IN_PROCESS), Reason.SCHEMA, "url: ")
    # with a site, the host is not read from the URL
    assert isinstance(analyse(dataclasses.replace(page, site="a.cn"), IN_PROCESS), Analysed)


@pytest.mark.parametrize(
    ("fetched_at", "same_as"),
    [
        ("2026-06-30T23:59:60Z", "2026-07-01T00:00:00Z"),  # a leap second
        ("2026-06-30T23:59:60.5+08:00", "2026-06-30T16:00:00.5Z"),
        ("2026-03-01t08:00:00z", "2026-03-01T08:00:00Z"),
    ],
)
def test_every_rfc3339_time_the_contract_takes_orders_a_page(
    rng: random.Random, fetched_at: str, same_as: str
) -> None:
    assert validate("raw", {"url": "https://a.cn/", "fetched_at": fetched_at,
                                 "content_type": "text/html", "html": "x"}) == []  # fmt: skip
    page = dataclasses.replace(_page(page_html(inputs.article(rng))), fetched_at=fetched_at)
    out = analyse(page, IN_PROCESS)
    assert isinstance(out, Analysed) and out.order == page_order(same_as)


def _worker_io(pid: int, counter: str) -> int:
    """A counter of ``/proc/<pid>/io``: ``rchar``, the bytes the process has read (pipes
    and files alike), or ``syscw``, the writes it has made. A sandbox worker starts both
    at 0 (fork resets them) and writes one result frame per answer."""
    for row in Path(f"/proc/{pid}/io").read_text().splitlines():
        name, _, value = row.partition(":")
        if name == counter:
            return int(value)
    raise KeyError(counter)


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait for ``condition``, polling: the deadline is only there so that a broken
    behaviour fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.002)


def test_sandbox_memory_limit(rng: random.Random) -> None:
    """A page that needs more than ``extract_max_mb`` is too_large; the worker retires."""
    # a time limit far above the page's few seconds on an idle host: the test is about
    # memory, and a loaded host must not turn the page into a timeout
    cfg = SLOW_OK.with_overrides(extract_max_mb=64)
    with Sandbox(cfg) as sandbox:
        out = sandbox.analyse(_page(inputs.tiny_elements(1_200_000, "<p>x"), "big"))
        check_rejected(out, Reason.TOO_LARGE, "more than 64 MiB")
        assert not isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Rejected)
        assert sandbox.starts == 2


def test_sandbox_worker_killed_mid_page_costs_that_page_only(rng: random.Random) -> None:
    """A worker that dies once it has the whole page (a crash in a C parser) costs that
    page an internal rejection; the next page gets a new worker."""
    slow = _page(inputs.attribute_flood(300_000), "slow")  # minutes of lexbor
    with Sandbox(SLOW_OK) as sandbox:  # the kill, not the time limit, must end the page
        sandbox.analyse(_page(page_html(inputs.article(rng))))
        worker = sandbox._worker
        assert worker is not None
        # It answered and waits for the next frame: it reads nothing else until it has it.
        has_page = _worker_io(worker.pid, "rchar") + len(page_frame(slow, ANALYSE))
        killed: list[bool] = []

        def kill_once_it_has_the_page() -> None:
            _wait_until(lambda: _worker_io(worker.pid, "rchar") >= has_page, "page read")
            os.kill(worker.pid, signal.SIGSEGV)
            killed.append(True)

        killer = threading.Thread(target=kill_once_it_has_the_page)
        killer.start()
        out = sandbox.analyse(slow)
        killer.join()
        assert killed
        check_rejected(out, Reason.INTERNAL, "killed by SIGSEGV")
        assert not isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Rejected)
        assert sandbox.starts == 2


def test_sandbox_worker_gone_while_idle_is_replaced(rng: random.Random) -> None:
    with Sandbox(CFG) as sandbox:
        sandbox.analyse(_page(page_html(inputs.article(rng))))
        assert sandbox._worker is not None
        os.kill(sandbox._worker.pid, signal.SIGKILL)
        # Gone once nothing reads its pipe any more: the next write finds the pipe broken.
        gone = select.poll()
        gone.register(sandbox._worker.wfd, select.POLLOUT)
        _wait_until(lambda: any(ev & select.POLLERR for _, ev in gone.poll(0)), "worker gone")
        assert not isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Rejected)
        assert sandbox.starts == 2


def test_sandbox_worker_holds_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reads hostile pages: it must not hold the broker password. (The zygote
    is started with its environment filtered, so a fresh one is needed here.)"""
    from neardup.sandbox.handles import Shared

    monkeypatch.setenv("NEARDUP_SASL_PASSWORD", "hunter2-secret")
    Shared.shutdown()
    with Sandbox(CFG) as sandbox:
        sandbox.analyse(_page("<p>x</p>"))
        assert sandbox._worker is not None
        environ = Path(f"/proc/{sandbox._worker.pid}/environ").read_bytes()
    Shared.shutdown()
    names = {entry.partition(b"=")[0] for entry in environ.split(b"\0") if entry}
    assert b"hunter2-secret" not in environ
    assert {n for n in names if n.startswith(b"NEARDUP_")} <= {
        b"NEARDUP_CACHE_DIR",
        b"NEARDUP_NATIVE",
    }


def test_sandbox_worker_follows_neardup_native(
    monkeypatch: pytest.MonkeyPatch, rng: random.Random
) -> None:
    """NEARDUP_NATIVE=0 turns the native fingerprints off in the sandbox's worker too,
    which analyses every page: its zygote keeps the variable."""
    from neardup.sandbox.handles import Shared

    monkeypatch.setenv("NEARDUP_NATIVE", "0")
    Shared.shutdown()
    try:
        with Sandbox(CFG) as sandbox:
            assert not isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Rejected)
            assert sandbox._worker is not None
            environ = Path(f"/proc/{sandbox._worker.pid}/environ").read_bytes()
    finally:
        Shared.shutdown()
    assert b"NEARDUP_NATIVE=0" in environ.split(b"\0")


def test_sandbox_in_a_forked_process_starts_its_own(rng: random.Random) -> None:
    """A process forked after a sandbox started gets its own zygote and leaves the
    parent's worker alone."""
    with Sandbox(CFG) as sandbox:
        assert isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Analysed)
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                with Sandbox(CFG) as its_own:
                    out = its_own.analyse(_page(page_html(inputs.article(rng))))
                    code = 0 if isinstance(out, Analysed) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert isinstance(sandbox.analyse(_page(page_html(inputs.article(rng)))), Analysed)
        assert sandbox.starts == 1


def _same_as_in_process(item: RawPage | Rejected, boxed: Analysed | Rejected) -> None:
    if isinstance(item, Rejected):
        assert boxed is item
        return
    expect = analyse(item, IN_PROCESS)
    if isinstance(expect, Rejected):
        assert isinstance(boxed, Rejected) and boxed.reason is expect.reason, boxed
        assert boxed.detail == expect.detail
    else:
        assert boxed == expect and boxed.page is item


def _check_stream(
    out: Sequence[tuple[RawPage | Rejected, Analysed | Rejected]],
    items: Sequence[RawPage],
    failed: dict[str, tuple[Reason, str]],
) -> None:
    """Every item came back in order: the ``failed`` ones rejected so, the others as
    ``analyse`` in this process makes them."""
    assert [item for item, _ in out] == items
    for item, boxed in out:
        if isinstance(item, RawPage) and item.page_id in failed:
            check_rejected(boxed, *failed[item.page_id])
        else:
            _same_as_in_process(item, boxed)


def test_sandbox_stream_hands_back_every_item_in_order(rng: random.Random) -> None:
    """Pages written ahead come back in order, each as ``analyse`` makes it, with items
    that need no worker (a dead letter already, a lone surrogate) in their places."""
    items: list[RawPage | Rejected] = [_page(page_html(inputs.article(rng)), f"p{i}")
                                       for i in range(12)]  # fmt: skip
    items.insert(3, Rejected(Reason.BAD_JSON, "not JSON"))
    items.insert(5, dataclasses.replace(_page("<p>x</p>", "s"), url="https://a.example.cn/\ud800"))
    items.insert(8, _page("", "empty"))
    with Sandbox(CFG) as sandbox:
        out = list(sandbox.stream(items))
        assert sandbox.starts == 1
    assert [item for item, _ in out] == items
    for item, boxed in out:
        if item is items[5]:
            check_rejected(boxed, Reason.SCHEMA, "lone surrogate")
        else:
            _same_as_in_process(item, boxed)


def test_sandbox_stream_a_timeout_costs_that_page_only(rng: random.Random) -> None:
    """A page past the time limit in the middle of a stream is rejected alone; the pages
    written after it to the killed worker are analysed by the next one."""
    cfg = CFG.with_overrides(extract_timeout_s=1.0)
    items = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(8)]
    # 60,000 attributes: 530 KB, small enough for pages to be written after it; seconds
    items.insert(2, _page(inputs.attribute_flood(60_000), "flood"))
    with Sandbox(cfg) as sandbox:
        out = list(sandbox.stream(items))
        assert sandbox.starts == 2 and sandbox.rewrites > 0
    _check_stream(out, items, {"flood": (Reason.TIMEOUT, "more than 1.0 s")})


def test_sandbox_stream_a_crash_or_a_retirement_costs_no_other_page(rng: random.Random) -> None:
    """A worker that dies mid-page costs that page only, and one that retires after a page
    that grew its memory leaves the pages written after it to the next worker."""
    # a time limit far above "big"'s analysis on a loaded host: no page here may time out
    cfg = SLOW_OK.with_overrides(extract_max_mb=128)
    items = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(10)]
    # 920 KB: fits in the pipe with pages after it, and grows the worker past its retiring
    # size (half the limit), not past the limit: it needs 80 to 96 MiB (measured)
    items.insert(2, _page(inputs.tiny_elements(230_000, "<p>x"), "big"))
    items.insert(6, _page(inputs.attribute_flood(60_000), "slow"))
    with Sandbox(cfg) as sandbox:
        out = []
        for item, boxed in sandbox.stream(items):
            out.append((item, boxed))
            if item.page_id == "p3":  # "slow" and pages after it are written by now
                # The second worker (the first retired after "big") got p2, p3, p4, slow, ...:
                # once it has answered p4 it is on "slow". Kill it there.
                worker = sandbox._worker
                assert worker is not None
                pid = worker.pid
                _wait_until(lambda pid=pid: _worker_io(pid, "syscw") >= 3, "p4 answered")
                os.kill(pid, signal.SIGSEGV)
        assert sandbox.starts == 3 and sandbox.rewrites > 0
    _check_stream(out, items, {"slow": (Reason.INTERNAL, "killed by SIGSEGV")})


def test_sandbox_stream_a_page_without_a_frame_fails_alone(
    rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page whose frame cannot be built (no memory for it) is rejected as internal; the
    stream goes on with the others."""
    from neardup import sandbox as sandbox_module

    build = sandbox_module.page_frame

    def frame(page: RawPage, job: str) -> bytes:
        if page.page_id == "huge":
            raise MemoryError("no memory for the frame")
        return build(page, job)

    monkeypatch.setattr(sandbox_module, "page_frame", frame)
    items = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(4)]
    items.insert(1, _page(page_html(inputs.article(rng)), "huge"))
    with Sandbox(CFG) as sandbox:
        out = list(sandbox.stream(items))
    _check_stream(out, items, {"huge": (Reason.INTERNAL, "MemoryError: no memory")})


def test_sandbox_stream_left_early_leaves_no_stale_answer(rng: random.Random) -> None:
    """A caller that stops reading a stream with pages still written ahead must not get
    their answers for its next page."""
    items = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(8)]
    with Sandbox(CFG) as sandbox:
        stream = sandbox.stream(items)
        for _ in range(2):
            next(stream)
        stream.close()
        later = _page(page_html(inputs.article(rng)), "later")
        _same_as_in_process(later, sandbox.analyse(later))


def test_sandbox_stream_read_late_still_takes_the_answers_waiting(rng: random.Random) -> None:
    """A caller away longer than the time limit between two pages (the worker's event
    loop running other agents) finds the pages written ahead answered, not timed out."""
    cfg = CFG.with_overrides(extract_timeout_s=0.5)
    items = [_page(page_html(inputs.article(rng)), f"p{i}") for i in range(4)]
    sandbox = Sandbox(cfg)

    def away() -> None:
        """Until the time limit of the page read next has passed."""
        deadline = sandbox._answered + cfg.extract_timeout_s
        _wait_until(lambda: time.monotonic() > deadline, "time limit passed")

    def source() -> Iterator[RawPage]:
        yield from items  # the stream writes each ahead as it takes the next
        worker = sandbox._worker
        assert worker is not None
        _wait_until(lambda: _worker_io(worker.pid, "syscw") == len(items), "all answered")
        written = time.monotonic()  # after each page's write: past its own time limit too
        _wait_until(lambda: time.monotonic() > written + cfg.extract_timeout_s, "limit")

    with sandbox:
        out = []
        for item, boxed in sandbox.stream(source()):
            out.append((item, boxed))
            away()
        assert sandbox.starts == 1
    _check_stream(out, items, {})


def test_the_workers_batch_left_early_leaves_no_stale_answer(rng: random.Random) -> None:
    """The worker's batch (``analyse_messages``) closed halfway, as when the worker stops
    mid-batch: the sandbox's next page gets its own answer, not one written ahead."""
    from neardup.engine import Stats
    from neardup.flow.analyse import analyse_messages

    raws = [good_line(rng, f"https://a.example.cn/p{i}") for i in range(8)]
    with Sandbox(CFG) as sandbox:
        results = analyse_messages(raws, CFG, Stats(), sandbox)
        done = [next(results) for _ in range(2)]
        results.close()
        later = _page(page_html(inputs.article(rng)), "later")
        _same_as_in_process(later, sandbox.analyse(later))
    assert [a.page.url for a in done if isinstance(a, Analysed)] == [
        "https://a.example.cn/p0",
        "https://a.example.cn/p1",
    ]


def test_engine_process_many_decides_as_process_does(rng: random.Random) -> None:
    texts = [inputs.article(rng) for _ in range(6)]
    lines = [good_line(rng, f"https://ok.example.cn/{i}") for i in range(6)]
    lines += [line(message(f"https://copy.example.cn/{i}", page_html(t)))
              for i, t in enumerate(texts)]  # fmt: skip
    lines.insert(4, b"{not json")
    one, many = Engine(MemoryKV(), CFG), Engine(MemoryKV(), CFG)
    singly = [one.process(parse_raw(raw, CFG.max_bytes)) for raw in lines]
    streamed = list(many.process_many(parse_raw(raw, CFG.max_bytes) for raw in lines))
    one.close()
    many.close()

    def comparable(out: Outcome | Rejected) -> object:
        if isinstance(out, Rejected):
            return (out.reason, out.detail)
        return {k: v for k, v in out.decision.items() if k != "decided_at"}

    assert [comparable(o) for o in streamed] == [comparable(o) for o in singly]
    assert many.stats.decisions == one.stats.decisions and many.stats.rejects == {"bad_json": 1}


def test_sandbox_close_leaves_no_worker(rng: random.Random) -> None:
    sandbox = Sandbox(CFG)
    sandbox.analyse(_page(page_html(inputs.article(rng))))
    assert sandbox._worker is not None
    pid = sandbox._worker.pid
    sandbox.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ------------------------------------------------------------------ neardup dedup, whole


def test_neardup_dedup_keeps_going_over_every_bad_input(
    tmp_path: Path, rng: random.Random, entity_server: tuple[str, list[str]]
) -> None:
    """One file with a bad line before every good one: every line gets exactly one
    decision or one rejection, in order, and the command finishes."""
    bad = [
        b"{not json",
        good_line(rng, "https://a.example.cn/cut")[:100],
        line(dict(_OK)),
        line(message("https://a.example.cn/b", None, body_b64="!!!")),
        line(b64_message("https://a.example.cn/pdf", inputs.PDF, "application/pdf")),
        line(b64_message("https://a.example.cn/gz", inputs.gzip_body("<p>x</p>"))),
        line(message("https://a.example.cn/empty", "")),
        line(message("https://a.example.cn/deep", inputs.deep_nesting("div", 100_000))),
        line(message("https://a.example.cn/xxe", inputs.external_entities(entity_server[0]))),
    ]
    lines = [x for b in bad for x in (b, good_line(rng, f"https://ok.example.cn/{len(b)}"))]
    src = tmp_path / "pages.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out, rejects = tmp_path / "out.jsonl", tmp_path / "rejects.jsonl"
    code = cli.main(["dedup", str(src), "--out", str(out), "--rejects", str(rejects), "-q"])
    assert code == cli.EXIT_REJECTED
    decided = out.read_text().splitlines()
    rejected = rejects.read_text().splitlines()
    assert len(decided) + len(rejected) == len(lines)
    assert len(decided) >= len(bad)  # every good page, and the XHTML one may be decided
    reasons = [json.loads(r)["reason"] for r in rejected]
    assert reasons[:8] == ["bad_json", "bad_json", "schema", "bad_base64", "not_html",
                           "not_html", "no_text", "too_large"]  # fmt: skip
    assert entity_server[1] == []


def test_extract_command_bounds_each_page_as_dedup_does(rng: random.Random, tmp_path: Path) -> None:
    """``neardup extract`` runs in the sandbox too: a page that would parse for minutes is
    rejected as ``timeout``, and the pages after it are extracted as in this process."""
    lines = [good_line(rng, "https://a.example.cn/1"),
             line(message("https://a.example.cn/flood", inputs.attribute_flood(300_000))),
             good_line(rng, "https://a.example.cn/2")]  # fmt: skip
    src = tmp_path / "pages.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    runs = {}
    for timeout in ("0.5", "0"):
        out, rejects = tmp_path / f"out{timeout}", tmp_path / f"rejects{timeout}"
        argv = ["extract", str(src), "--out", str(out), "--rejects", str(rejects)]
        if timeout == "0":  # in this process, unbounded: only the good pages
            src.write_bytes(b"\n".join([lines[0], lines[2]]) + b"\n")
        assert cli.main([*argv, "--set", f"extract_timeout_s={timeout}"]) in (0, 3)
        runs[timeout] = out.read_text(encoding="utf-8")
        if timeout == "0.5":
            [rejected] = [json.loads(r) for r in rejects.read_text().splitlines()]
            assert rejected["reason"] == "timeout" and rejected["url"].endswith("/flood")
    assert runs["0.5"] == runs["0"] and len(runs["0"].splitlines()) == 2


def test_sandbox_a_page_that_came_near_the_limit_retires_its_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """VmPeak covers the worker's whole life: a page that took most of the limit for a
    moment and gave it back must retire the worker, or a later failure would be blamed on
    that page's peak (reported as too_large) and retire it anyway."""
    from neardup.sandbox import child as sb
    from neardup.sandbox import wire

    def fake(page: RawPage, cfg: EngineConfig, stats: object, utf8: object, job: str) -> object:
        if page.page_id == "big":  # 48 MiB for a moment: past the retiring share of 64
            # mapped afresh: a bytearray may reuse heap that this process, forked from
            # pytest's, had freed already, and then the address space does not grow
            buf = mmap.mmap(-1, 48 << 20)
            buf[:: 1 << 20] = b"x" * len(buf[:: 1 << 20])
            buf.close()
        if page.page_id == "bug":
            return Rejected(Reason.INTERNAL, "KeyError: 'x'", page.page_id, page.url)
        return Extracted(page, "t", ("ok",))

    monkeypatch.setattr(sb, "_analyse_one", fake)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker's loop, as the zygote runs it
        code = 0
        try:
            os.close(w1)
            os.close(r2)
            sb._serve(CFG.with_overrides(extract_max_mb=64), r1, w2)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(r1)
    os.close(w2)
    answers = {}
    try:
        for name in ("small", "big"):
            sb._write_all_blocking(w1, wire.page_frame(_page("<p>x</p>", name), wire.EXTRACT))
            head_len, payload_len = wire.FRAME.unpack(sb._read_exact_blocking(r2, wire.FRAME.size))
            answers[name] = json.loads(sb._read_exact_blocking(r2, head_len))
            sb._read_exact_blocking(r2, payload_len)
    finally:
        os.close(w1)
        os.close(r2)
        os.waitpid(pid, 0)
    assert answers["small"]["retire"] is False and "extracted" in answers["small"]
    assert answers["big"]["retire"] is True and "extracted" in answers["big"]


def _raw_messages(rng: random.Random) -> list[RawMessage]:
    """Lines as a JSONL file holds them: pages (text and base64 GBK), lines that are not a
    page, and one whose analysis runs past a 1 s limit."""
    lines = [good_line(rng, f"https://a.example.cn/{i}") for i in range(6)]
    gbk = page_html(inputs.article(rng), charset="gbk").encode("gbk")
    lines.insert(1, line(b64_message("https://gbk.example.cn/1", gbk)))
    lines.insert(3, b'{"url": "https://broken.example.cn/x", "html": "<p>')
    lines.insert(4, line({**_OK, "fetched_at": "yesterday"}))
    lines.insert(6, line(message("https://slow.example.cn/a", inputs.attribute_flood(60_000))))
    return [RawMessage(raw, f"pages.jsonl:{n}") for n, raw in enumerate(lines, 1)]


def test_sandbox_parses_raw_messages_as_the_parent_would(rng: random.Random) -> None:
    """A message not parsed yet is parsed by the worker: the same rejection (its detail
    led by where it came from) or the same analysis, whose page has no body; a message
    that times out is named by the parent, which parses it only then."""
    cfg = CFG.with_overrides(extract_timeout_s=1.0)
    items = _raw_messages(rng)
    with Sandbox(cfg) as sandbox:
        out = list(sandbox.stream(items))
    assert [item for item, _ in out] == items
    for msg, boxed in out:
        parsed = parse_message(msg, cfg.max_bytes)
        if isinstance(parsed, Rejected):
            assert isinstance(boxed, Rejected) and parsed.detail.startswith(msg.where)
            assert (boxed.reason, boxed.detail) == (parsed.reason, parsed.detail)
            assert (boxed.page_id, boxed.url) == (parsed.page_id, parsed.url)
        elif parsed.url.startswith("https://slow."):
            rejected = check_rejected(boxed, Reason.TIMEOUT, "more than 1.0 s")
            assert (rejected.page_id, rejected.url) == (parsed.page_id, parsed.url)
        else:
            expect = analyse(parsed, IN_PROCESS)
            assert isinstance(expect, Analysed) and isinstance(boxed, Analysed)
            assert boxed == dataclasses.replace(expect, page=dataclasses.replace(parsed, body=""))
    assert sum(isinstance(b, Analysed) for _, b in out) == 7


def test_the_analyse_stage_gives_the_same_with_and_without_sandbox(rng: random.Random) -> None:
    """The worker's analyse stage on raw-topic values: parsed and analysed in the
    sandbox's child, or parsed and analysed in this process, the same analyses and the
    same rejections."""
    from neardup.engine import Stats
    from neardup.flow.analyse import analyse_messages

    raws: list[bytes | None] = [m.line for m in _raw_messages(rng)]
    raws.insert(2, None)  # a tombstone
    cfg = CFG.with_overrides(extract_timeout_s=1.0)
    with Sandbox(cfg) as sandbox:
        boxed = list(analyse_messages(raws, cfg, Stats(), sandbox))
    here = list(analyse_messages(raws, IN_PROCESS, Stats()))
    assert len(boxed) == len(here) == len(raws)
    for raw, b, h in zip(raws, boxed, here, strict=True):
        if raw is not None and b"slow.example.cn" in raw:
            check_rejected(b, Reason.TIMEOUT)
            assert isinstance(h, Analysed)  # no time limit in this process
        elif isinstance(h, Rejected):
            assert isinstance(b, Rejected), b
            assert (b.reason, b.detail, b.page_id, b.url) == (h.reason, h.detail, h.page_id, h.url)
        else:
            assert b == dataclasses.replace(h, page=dataclasses.replace(h.page, body=""))
    assert sum(isinstance(b, Analysed) for b in boxed) == 7


def test_sandbox_a_message_too_big_to_parse_within_its_memory_limit(rng: random.Random) -> None:
    """orjson reserves some 12 times a line to parse it: a page the worker could not parse
    under ``extract_max_mb`` (it said bad_json, "Not enough memory", and lost the page id)
    is parsed by the parent and analysed as it is in the process."""
    html = page_html(inputs.article(rng)).replace(
        "</body>", "<script>var s='" + "中文" * 450_000 + "';</script></body>"
    )
    # ASCII JSON, as many producers write it: a 5.2 MB line for 2.6 MB of HTML
    raw = json.dumps({**_OK, "page_id": "big-1", "html": html}).encode()
    cfg = CFG.with_overrides(extract_max_mb=64, extract_timeout_s=30.0)
    with Sandbox(cfg) as sandbox:
        ((_, boxed),) = sandbox.stream([RawMessage(raw)])
    parsed = parse_raw(raw, cfg.max_bytes)
    assert isinstance(parsed, RawPage)
    expect = analyse(parsed, IN_PROCESS)
    assert isinstance(expect, Analysed), expect
    assert boxed == dataclasses.replace(expect, page=dataclasses.replace(parsed, body=""))


def _padded_line(rng: random.Random, page_id: str, mib: int) -> bytes:
    """A page whose body, padded with a script, is ``mib`` MiB and more."""
    padding = "<script>var s='" + "x" * (mib << 20) + "';</script></body>"
    html = page_html(inputs.article(rng)).replace("</body>", padding)
    return line(
        {**_OK, "page_id": page_id, "url": f"https://big.example.cn/{page_id}", "html": html}
    )


# max_bytes may be set near, or past, extract_max_mb: 40 MiB fits in the child's 64 but
# not twice (reading it), 72 MiB does not fit at all. Both died in the child, as internal.
_UNREADABLE = [40, 72]


@pytest.mark.parametrize("mib", _UNREADABLE)
def test_sandbox_a_body_the_worker_cannot_hold_is_too_large(rng: random.Random, mib: int) -> None:
    """A body too big for the worker to read under ``extract_max_mb`` is rejected as
    too_large, named, once, and the messages after it are analysed."""
    cfg = CFG.with_overrides(extract_max_mb=64, max_bytes=80 << 20, extract_timeout_s=30.0)
    items = [RawMessage(good_line(rng, "https://ok.example.cn/1")),
             RawMessage(_padded_line(rng, "big", mib)),
             RawMessage(good_line(rng, "https://ok.example.cn/2"))]  # fmt: skip
    with Sandbox(cfg) as sandbox:
        out = [result for _, result in sandbox.stream(items)]
        assert sandbox.starts == 2  # the worker that read it retired; no other died
    assert isinstance(out[0], Analysed) and isinstance(out[2], Analysed), out
    rejected = check_rejected(out[1], Reason.TOO_LARGE, "more than 64 MiB")
    assert "could not hold" in rejected.detail, rejected.detail
    assert (rejected.page_id, rejected.url) == ("big", "https://big.example.cn/big")


def test_sandbox_a_message_the_worker_cannot_read_keeps_its_ids(
    rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message the worker cannot even read comes back too_large with no ids (it never
    parsed it): the parent names it, as after a timeout, or the dead letter is lost. The
    parent's parse threshold (``PARSE_BYTES_PER_BYTE``) keeps such a message from the
    worker today; it is turned off here to hand the worker one."""
    from neardup import sandbox as sb

    monkeypatch.setattr(sb, "PARSE_BYTES_PER_BYTE", 0)
    cfg = CFG.with_overrides(extract_max_mb=64, max_bytes=80 << 20, extract_timeout_s=30.0)
    items = [RawMessage(_padded_line(rng, "big", _UNREADABLE[0])),
             RawMessage(good_line(rng, "https://ok.example.cn/2"))]  # fmt: skip
    with Sandbox(cfg) as sandbox:
        out = [result for _, result in sandbox.stream(items)]
    assert isinstance(out[1], Analysed), out
    rejected = check_rejected(out[0], Reason.TOO_LARGE, "could not hold")
    assert (rejected.page_id, rejected.url) == ("big", "https://big.example.cn/big")


def test_neardup_dedup_a_body_the_worker_cannot_hold_is_too_large(
    rng: random.Random, tmp_path: Path
) -> None:
    lines = [good_line(rng, "https://ok.example.cn/1"), _padded_line(rng, "big", _UNREADABLE[0]),
             good_line(rng, "https://ok.example.cn/2")]  # fmt: skip
    src = tmp_path / "pages.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out, rejects = tmp_path / "out.jsonl", tmp_path / "rejects.jsonl"
    argv = ["dedup", str(src), "--out", str(out), "--rejects", str(rejects), "-q"]
    sets = ["--set", "extract_max_mb=64", "--set", f"max_bytes={80 << 20}"]
    assert cli.main([*argv, *sets]) == cli.EXIT_REJECTED
    assert len(out.read_text().splitlines()) == 2
    [rejected] = [json.loads(r) for r in rejects.read_text().splitlines()]
    assert (rejected["reason"], rejected["page_id"]) == ("too_large", "big"), rejected
    assert "could not hold" in rejected["detail"], rejected
