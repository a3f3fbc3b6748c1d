"""Reading pages from JSONL and WARC files: order, formats by content, damage survived."""

from __future__ import annotations

import base64
import contextlib
import functools
import gzip
import io
import json
import os
import random
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import brotli  # type: ignore[import-untyped]
import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from neardup.contract import derive_page_id, max_line_bytes
from neardup.records import RawPage, Reason, Rejected
from neardup.sources import iter_pages

LIMIT = 20_000
HTML = (
    "<html><head><title>城市交通</title></head><body><p>新建的地铁线路明年通车。</p></body></html>"
)
GBK = HTML.encode("gbk")


def jsonl_line(n: int, **fields: Any) -> bytes:
    message: dict[str, Any] = {
        "url": f"https://example.cn/{n}",
        "fetched_at": "2024-01-01T08:00:00Z",
        "content_type": "text/html; charset=utf-8",
        "html": HTML,
    }
    message.update(fields)
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"


def urls(items: Iterable[RawPage | Rejected]) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, RawPage):
            out.append(item.url)
        else:
            out.append(f"{item.reason}:{item.url}")
    return out


def read(*paths: Path | str, max_bytes: int = LIMIT) -> list[RawPage | Rejected]:
    return list(iter_pages([str(p) for p in paths], max_bytes))


# --- JSONL --------------------------------------------------------------------------


def test_jsonl_in_order_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    path.write_bytes(jsonl_line(1) + b"\n   \n" + jsonl_line(2) + jsonl_line(3).rstrip(b"\n"))
    assert urls(read(path)) == [f"https://example.cn/{n}" for n in (1, 2, 3)]


def test_jsonl_a_byte_order_mark_at_the_start_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bom = "\ufeff".encode()
    data = bom + jsonl_line(1) + bom + jsonl_line(2)  # only the first is a BOM; then an error
    expected = ["https://example.cn/1", "bad_json:https://example.cn/2"]
    plain, gz = tmp_path / "bom.jsonl", tmp_path / "bom.jsonl.gz"
    plain.write_bytes(data)
    gz.write_bytes(gzip.compress(data))
    assert urls(read(plain)) == expected
    assert urls(read(gz)) == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert urls(iter_pages(["-"], LIMIT)) == expected


def test_jsonl_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "pages.txt"
    path.write_bytes(gzip.compress(jsonl_line(1) + jsonl_line(2)))
    assert urls(read(path)) == ["https://example.cn/1", "https://example.cn/2"]
    plain = tmp_path / "plain.jsonl.gz"  # a misleading name on a plain file
    plain.write_bytes(jsonl_line(3))
    assert urls(read(plain)) == ["https://example.cn/3"]


def test_jsonl_body_b64(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    b64 = base64.b64encode(GBK).decode()
    path.write_bytes(jsonl_line(1, html=None, body_b64=b64).replace(b'"html": null, ', b""))
    [page] = read(path)
    assert isinstance(page, RawPage) and page.body == GBK


def test_jsonl_bad_lines_in_the_middle_keep_going(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    path.write_bytes(
        jsonl_line(1)
        + b'{"url": "https://example.cn/broken", "html": \n'
        + jsonl_line(2).replace("城市".encode(), "城市".encode("gbk"))  # not UTF-8
        + jsonl_line(3, fetched_at="yesterday")
        + jsonl_line(4, html="x" * (LIMIT + 1))
        + jsonl_line(5)
    )
    items = read(path)
    assert urls(items) == [
        "https://example.cn/1",
        "bad_json:https://example.cn/broken",
        "bad_json:https://example.cn/2",
        "schema:https://example.cn/3",
        "too_large:https://example.cn/4",
        "https://example.cn/5",
    ]
    rejected = [i for i in items if isinstance(i, Rejected)]
    assert [r.detail.split(": ")[0] for r in rejected] == [f"{path}:{n}" for n in (2, 3, 4, 5)]


def test_jsonl_overlong_line_rejected_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    huge = jsonl_line(2, html="x" * (max_line_bytes(100) * 3))
    path.write_bytes(jsonl_line(1) + huge + jsonl_line(3))
    items = read(path, max_bytes=100 * 1000)
    assert urls(items)[0] == "https://example.cn/1"
    items = read(path, max_bytes=100)
    assert [getattr(i, "reason", None) for i in items] == [
        Reason.TOO_LARGE,  # line 1 is over 100 bytes of body too
        Reason.TOO_LARGE,
        Reason.TOO_LARGE,
    ]
    assert urls(items)[1] == "too_large:https://example.cn/2"


def test_jsonl_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(jsonl_line(n) for n in range(50)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) - 20])
    items = read(path)
    assert all(isinstance(i, RawPage) for i in items[:-2])
    last = items[-1]
    assert isinstance(last, Rejected) and last.reason is Reason.BAD_INPUT
    assert "rest of file skipped" in last.detail


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(jsonl_line(1) + jsonl_line(2)))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert urls(iter_pages(["-"], LIMIT)) == ["https://example.cn/1", "https://example.cn/2"]


def test_closed_stdin_is_a_reject(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when descriptor 0 is closed
    [reject] = iter_pages(["-"], LIMIT)
    assert isinstance(reject, Rejected) and reject.reason is Reason.BAD_INPUT
    assert reject.detail == "<stdin>: cannot read: standard input is closed"


def test_a_file_name_that_is_not_utf8_is_shown_escaped(tmp_path: Path) -> None:
    # os.fsdecode gives the str that argv would hold: the 0xff byte as a lone surrogate
    path = Path(os.fsdecode(bytes(tmp_path) + b"/\xe5\x9f\x8e\xff.jsonl"))  # "城" then 0xff
    path.write_bytes(b'{"broken\n' + jsonl_line(1))
    items = read(path)
    assert urls(items) == ["bad_json:None", "https://example.cn/1"]
    assert isinstance(items[0], Rejected)
    assert items[0].detail.startswith(f"{tmp_path}/城\\xff.jsonl:1: ")
    items[0].detail.encode("utf-8")  # a reject the CLI can write


def read_through_fifo(tmp_path: Path, data: bytes) -> list[RawPage | Rejected]:
    """What iter_pages gives for ``data`` written into a FIFO; fails if reading hangs."""
    fifo = tmp_path / "pages.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as fh:
            for start in range(0, len(data), 1000):  # in pieces, as a pipe delivers
                fh.write(data[start : start + 1000])
                fh.flush()

    got: list[RawPage | Rejected] = []
    threads = [
        threading.Thread(target=write, daemon=True),
        threading.Thread(target=lambda: got.extend(read(fifo)), daemon=True),
    ]
    for thread in threads:
        thread.start()
    threads[1].join(timeout=20)
    assert not threads[1].is_alive(), "reading the FIFO hung"
    return got


def pipe_inputs(tmp_path: Path) -> dict[str, bytes]:
    warc = tmp_path / "pages.warc"
    write_warc(warc, standard_records(), gz=False)
    warc_gz = tmp_path / "pages.warc.gz"
    write_warc(warc_gz, standard_records(), gz=True)
    jsonl = jsonl_line(1) + b"{broken\n" + jsonl_line(2)
    return {
        "jsonl": jsonl,
        "jsonl.gz": gzip.compress(jsonl),
        "warc": warc.read_bytes(),
        "warc.gz": warc_gz.read_bytes(),
        "tiny": b"{",  # shorter than what tells the format
    }


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "warc", "warc.gz", "tiny"])
def test_a_pipe_or_fifo_is_read_once_like_a_file(tmp_path: Path, kind: str) -> None:
    # a pipe or a FIFO gives its bytes once: opened a second time after its format was
    # sniffed, `neardup dedup <(cat pages.jsonl)` would give no page, and a FIFO would hang
    data = pipe_inputs(tmp_path)[kind]
    as_file = read(_write(tmp_path / "pages", data))
    assert len(as_file) >= 1
    through_fifo = read_through_fifo(tmp_path, data)
    assert urls(through_fifo) == urls(as_file)
    assert [getattr(i, "body", None) for i in through_fifo] == [
        getattr(i, "body", None) for i in as_file
    ]


def test_missing_file_is_an_operator_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        read(tmp_path / "nope.jsonl")


# --- WARC ---------------------------------------------------------------------------


def http(status: str = "200 OK", **headers: str) -> StatusAndHeaders:
    pairs = [(k.replace("_", "-"), v) for k, v in headers.items()]
    return StatusAndHeaders(status, pairs, protocol="HTTP/1.1")


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


Record = tuple[str, str, bytes, StatusAndHeaders | None, str | None]


def rec(
    kind: str,
    url: str,
    payload: bytes = b"",
    http: StatusAndHeaders | None = None,
    warc_type: str | None = None,
) -> Record:
    return kind, url, payload, http, warc_type


def write_warc(path: Path, records: list[Record], *, gz: bool) -> None:
    with path.open("wb") as fh:
        writer = WARCWriter(fh, gzip=gz)
        for kind, url, payload, headers, warc_type in records:
            writer.write_record(
                writer.create_warc_record(
                    url,
                    kind,
                    payload=io.BytesIO(payload),
                    http_headers=headers,
                    warc_content_type=warc_type,
                )
            )


def page_rec(url: str, body: bytes = GBK) -> Record:
    return rec("response", url, body, http(Content_Type="text/html"))


def standard_records() -> list[Record]:
    fields = "application/warc-fields"
    get = StatusAndHeaders("GET /1 HTTP/1.1", [("Host", "example.cn")], is_http_request=True)
    return [
        rec("warcinfo", "dns:example.cn", b"software: test\r\n", warc_type=fields),
        rec("request", "https://example.cn/1", http=get),
        rec("response", "https://example.cn/1", GBK, http(Content_Type="text/html; charset=gbk")),
        rec("metadata", "https://example.cn/1", b"via: x\r\n", warc_type=fields),
        rec("response", "https://example.cn/2", chunked(GBK), http(Transfer_Encoding="chunked")),
        rec(
            "response",
            "https://example.cn/3",
            gzip.compress(GBK),
            http(Content_Type="text/html", Content_Encoding="gzip"),
        ),
        rec("response", "https://example.cn/old", http=http("301 Moved", Location="/1")),
        rec("response", "dns:example.cn", b"example.cn. 60 IN A 1.2.3.4", warc_type="text/dns"),
        rec("resource", "https://example.cn/4", GBK, warc_type="text/html"),
        rec("resource", "https://example.cn/logo.png", b"\x89PNG", warc_type="image/png"),
    ]


@pytest.mark.parametrize("gz", [False, True])
def test_warc_takes_pages_and_skips_the_rest(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / ("crawl.warc.gz" if gz else "crawl.warc")
    write_warc(path, standard_records(), gz=gz)
    pages = read(path)
    assert urls(pages) == [f"https://example.cn/{n}" for n in (1, 2, 3, 4)]
    for page in pages:
        assert isinstance(page, RawPage)
        assert page.body == GBK  # chunking and gzip content encoding undone
        assert page.page_id == derive_page_id(page.url)
        assert page.fetched_at.endswith("Z")
    assert [p.content_type for p in pages if isinstance(p, RawPage)] == [
        "text/html; charset=gbk",
        "text/html",  # absent: the default
        "text/html",
        "text/html",
    ]


def raw_deflate(body: bytes) -> bytes:
    squeeze = zlib.compressobj(wbits=-15)
    return squeeze.compress(body) + squeeze.flush()


CODINGS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "x-gzip": ("x-gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", raw_deflate),
    "br": ("br", brotli.compress),
    "BR, with spaces": (" BR ", brotli.compress),
}


@pytest.mark.parametrize("coding", list(CODINGS))
def test_warc_content_codings_are_undone(tmp_path: Path, coding: str) -> None:
    # br through warcio's own decoder fails on every body: warcio 1.8.1 sets an attribute
    # on brotli's Decompressor that brotli 1.2 refuses
    header, encode = CODINGS[coding]
    body = ("<p>" + "新建的地铁线路明年通车，沿线居民出行更方便。" * 3000 + "</p>").encode("gbk")
    records = [
        rec("response", "https://example.cn/1", encode(GBK), http(Content_Encoding=header)),
        rec(
            "response",
            "https://example.cn/2",
            chunked(encode(body), size=999),
            http(Content_Encoding=header, Transfer_Encoding="chunked"),
        ),
        page_rec("https://example.cn/3"),
    ]
    path = tmp_path / "coded.warc"
    write_warc(path, records, gz=False)
    items = read(path, max_bytes=len(body))
    assert urls(items) == [f"https://example.cn/{n}" for n in (1, 2, 3)]
    assert [getattr(i, "body", None) for i in items] == [GBK, body, GBK]


@pytest.mark.parametrize("coding", list(CODINGS))
def test_warc_coded_body_inflating_past_the_limit_is_too_large(tmp_path: Path, coding: str) -> None:
    header, encode = CODINGS[coding]
    bomb = encode(b"\x20" * (200 * LIMIT))
    path = tmp_path / "bomb.warc"
    records = [rec("response", "https://example.cn/bomb", bomb, http(Content_Encoding=header))]
    write_warc(path, [*records, page_rec("https://example.cn/1")], gz=False)
    assert urls(read(path)) == ["too_large:https://example.cn/bomb", "https://example.cn/1"]


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_warc_coded_body_damaged_inside_is_rejected_alone(tmp_path: Path, coding: str) -> None:
    header, encode = CODINGS[coding]
    rng = random.Random(3)
    text = "".join(rng.choice("地铁线路明年通车城市交通") for _ in range(20_000))
    coded = bytearray(encode(f"<p>{text}</p>".encode()))
    middle = len(coded) // 2
    coded[middle : middle + 64] = bytes(b ^ 0xFF for b in coded[middle : middle + 64])
    records = [
        rec("response", "https://example.cn/bad", bytes(coded), http(Content_Encoding=header)),
        page_rec("https://example.cn/1"),
    ]
    path = tmp_path / "damaged.warc"
    write_warc(path, records, gz=False)
    items = read(path, max_bytes=10 * LIMIT)
    assert urls(items) == ["bad_input:https://example.cn/bad", "https://example.cn/1"]
    assert isinstance(items[0], Rejected) and f"{header} body damaged" in items[0].detail


def test_warc_coded_body_cut_short_gives_what_it_decoded_to(tmp_path: Path) -> None:
    # as a crawler's size limit cuts a body; but a cut that leaves nothing is no page
    rng = random.Random(5)
    body = ("<p>" + "".join(rng.choice("地铁线路明年通车城市交通") for _ in range(50_000))).encode()
    path = tmp_path / "cut.warc"
    coded = brotli.compress(body)
    records = [
        rec(
            "response",
            "https://example.cn/cut",
            coded[: len(coded) // 2],
            http(Content_Encoding="br"),
        ),
        rec("response", "https://example.cn/none", b"\x00\x01garbage", http(Content_Encoding="br")),
    ]
    write_warc(path, records, gz=False)
    cut, none = read(path, max_bytes=len(body))
    assert isinstance(cut, RawPage) and 0 < len(cut.body) < len(body)
    assert body.startswith(bytes(cut.body))
    assert isinstance(none, Rejected) and none.reason is Reason.BAD_INPUT
    assert "br body ends before any of it decodes" in none.detail


def test_warc_body_not_in_its_coding_is_taken_as_it_is(tmp_path: Path) -> None:
    # crawlers that store the decoded body often keep the original Content-Encoding
    path = tmp_path / "stored-decoded.warc"
    records = [
        rec("response", f"https://example.cn/{c}", GBK, http(Content_Encoding=c))
        for c in ("gzip", "deflate", "br", "identity", "compress")
    ]
    write_warc(path, records, gz=False)
    assert [getattr(i, "body", None) for i in read(path)] == [GBK] * 5


def longest_result(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> list[int]:
    """A list that comes to hold the length of the longest bytes ``cls.method`` returns
    (warcio's reads of a record's block, its reader's lines)."""
    longest = [0]
    original = getattr(cls, method)

    def spy(self: object, length: int | None = None) -> bytes:
        data: bytes = original(self, length)
        longest[0] = max(longest[0], len(data))
        return data

    monkeypatch.setattr(cls, method, spy)
    return longest


@pytest.mark.parametrize("coding", ["identity", "gzip"])
def test_warc_chunk_is_read_a_piece_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coding: str
) -> None:
    # warcio's ChunkedDataReader reads a whole chunk (up to 2 GiB) before a size limit can
    # apply: one 200 MB chunk in a .warc.gz costs it 472 MB
    body = random.Random(1).randbytes(4 << 20)  # so that gzip leaves it as big
    coded = gzip.compress(body, compresslevel=1) if coding == "gzip" else body
    records = [
        rec(
            "response",
            "https://example.cn/big",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(coded), coded),
            http(Transfer_Encoding="chunked", Content_Encoding=coding),
        ),
        page_rec("https://example.cn/1"),
    ]
    path = tmp_path / "one-chunk.warc"
    write_warc(path, records, gz=False)
    from warcio.limitreader import LimitReader

    largest = longest_result(monkeypatch, LimitReader, "read")
    assert urls(read(path)) == ["too_large:https://example.cn/big", "https://example.cn/1"]
    assert largest[0] <= 64 * 1024


@pytest.mark.parametrize(
    ("block", "body"),
    [
        pytest.param(b"5;name=value\r\nhello\r\n0\r\n\r\n", b"hello", id="extension"),
        pytest.param(b"5;" + b"x" * 200 + b"\r\nhello\r\n0\r\n\r\n", b"hello", id="long extension"),
        pytest.param(b"5\r\nhello\r\n0\r\nExpires: 0\r\nX-A: b\r\n\r\n", b"hello", id="trailers"),
        pytest.param(b"5\r\nhello\r\n0\r\n\r\nafter", b"hello", id="bytes after the end"),
        pytest.param(b"<html>\r\n", b"<html>\r\n", id="not chunked"),
        pytest.param(b"\r\nhello", b"\r\nhello", id="not chunked, blank first line"),
        pytest.param(b"5\r\nhello\r\nworld", b"helloworld", id="not chunked further on"),
        pytest.param(b"cafe\r\n" + b"x" * 60_000, b"cafe\r\n" + b"x" * 60_000, id="hex word first"),
        pytest.param(b"cafe\r\n<html>x", b"cafe\r\n<html>x", id="hex word first, short body"),
        pytest.param(b"5\r\nhelloXX rest", b"5\r\nhelloXX rest", id="no CRLF after a chunk"),
        pytest.param(b"0\r\n<html>", b"0\r\n<html>", id="0 then no trailer"),
        pytest.param(b"5\r\nhello\r\n9\r\nwor", b"hellowor", id="cut inside a chunk"),
        pytest.param(b"5\r\nhello\r\n", b"hello", id="cut before the last chunk"),
        pytest.param(
            b"%x\r\n%s" % (100_000, b"x" * 70_000), b"x" * 70_000, id="cut inside a big chunk"
        ),
    ],
)
def test_warc_chunked_body_read_as_warcio_reads_it_or_better(
    tmp_path: Path, block: bytes, body: bytes
) -> None:
    # As warcio: a body that turns out not to be chunked is read on as it is, and one cut
    # inside a chunk gives what it has. Better than warcio: trailers are not body, a size
    # line over 64 bytes is one, and no bytes are dropped where a CRLF was looked for.
    path = tmp_path / "chunked.warc"
    records = [rec("response", "https://example.cn/1", block, http(Transfer_Encoding="chunked"))]
    write_warc(path, [*records, page_rec("https://example.cn/2")], gz=False)
    items = read(path, max_bytes=1 << 20)
    assert urls(items) == ["https://example.cn/1", "https://example.cn/2"]
    assert isinstance(items[0], RawPage) and items[0].body == body


def test_warc_body_over_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.warc.gz"
    records = [page_rec("https://example.cn/big", b"x" * 5000), page_rec("https://example.cn/1")]
    write_warc(path, records, gz=True)
    assert urls(read(path, max_bytes=1000)) == [
        "too_large:https://example.cn/big",
        "https://example.cn/1",
    ]


def test_warc_gzipped_whole_is_read(tmp_path: Path) -> None:
    plain = tmp_path / "crawl.warc"
    write_warc(plain, standard_records(), gz=False)
    whole = tmp_path / "crawl.warc.gz"
    whole.write_bytes(gzip.compress(plain.read_bytes()))
    assert urls(read(whole)) == [f"https://example.cn/{n}" for n in (1, 2, 3, 4)]


@pytest.mark.parametrize("gz", [False, True])
def test_warc_truncated_keeps_earlier_records(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / "cut.warc"
    write_warc(path, [page_rec(f"https://example.cn/{n}", GBK * 20) for n in range(3)], gz=gz)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 200])
    items = read(path)
    assert urls(items)[:2] == ["https://example.cn/0", "https://example.cn/1"]
    assert isinstance(items[2], Rejected) and items[2].reason is Reason.BAD_INPUT
    assert "truncated" in items[2].detail


@pytest.mark.parametrize("gz", [False, True])
def test_warc_cut_inside_a_record_that_holds_no_page_is_reported(tmp_path: Path, gz: bool) -> None:
    # a file cut inside its last record, a request, loses no page, yet it is cut short and
    # must be reported so
    get = StatusAndHeaders("GET /2 HTTP/1.1", [("User-Agent", "爬虫" * 100)], is_http_request=True)
    path = tmp_path / "cut.warc"
    write_warc(
        path,
        [page_rec("https://example.cn/1"), rec("request", "https://example.cn/2", http=get)],
        gz=False,
    )
    data = path.read_bytes()
    data = data[: len(data) - 100]  # 4 bytes of record trailer and 96 of the request
    path.write_bytes(gzip.compress(data) if gz else data)
    items = read(path)
    assert urls(items) == ["https://example.cn/1", "bad_input:None"]
    assert isinstance(items[1], Rejected)
    assert "WARC record 2: request record truncated: 96 of " in items[1].detail


def raw_record(url: str, block: bytes, **changes: str | None) -> bytes:
    """A WARC response record written by hand, its WARC headers changed or (None) left out."""
    fields: dict[str, str | None] = {
        "WARC-Type": "response",
        "WARC-Record-ID": f"<urn:uuid:{derive_page_id(url)}>",
        "WARC-Date": "2024-01-01T08:00:00Z",
        "WARC-Target-URI": url,
        "Content-Type": "application/http; msgtype=response",
        "Content-Length": str(len(block)),
    }
    fields.update((k.replace("_", "-"), v) for k, v in changes.items())
    head = "".join(f"{k}: {v}\r\n" for k, v in fields.items() if v is not None)
    return b"WARC/1.0\r\n" + head.encode() + b"\r\n" + block + b"\r\n\r\n"


def http_block(body: bytes = GBK) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + body


@pytest.mark.parametrize(
    ("length", "says"),
    [
        (None, "no Content-Length, so where the record ends cannot be told"),
        ("12x", "Content-Length '12x' is not a number of bytes"),
        ("-5", "Content-Length '-5' is not a number of bytes"),
        # int() refuses over 4,300 digits: its ValueError must not escape iter_pages
        ("9" * 4301, f"Content-Length '{'9' * 4301}' is not a number of bytes"),
    ],
)
def test_warc_record_without_a_usable_length_stops_the_file(
    tmp_path: Path, length: str | None, says: str
) -> None:
    # without a usable Content-Length, warcio reads every record after it as its body
    records = [raw_record(f"https://example.cn/{n}", http_block()) for n in range(1, 5)]
    records[1] = raw_record("https://example.cn/2", http_block(), Content_Length=length)
    path = tmp_path / "unframed.warc"
    path.write_bytes(b"".join(records))
    items = read(path)
    assert urls(items) == ["https://example.cn/1", "bad_input:https://example.cn/2"]
    assert isinstance(items[1], Rejected)
    assert items[1].detail == f"{path}: WARC record 2: {says}; rest of file skipped"


def test_warc_record_whose_length_is_wrong_is_not_a_page(tmp_path: Path) -> None:
    # a body must never hold bytes of the records around it
    short, long = http_block(), http_block()
    records = [raw_record(f"https://example.cn/{n}", http_block()) for n in range(1, 7)]
    records[1] = raw_record("https://example.cn/2", short, Content_Length=str(len(short) - 9))
    records[3] = raw_record("https://example.cn/4", long, Content_Length=str(len(long) + 60))
    path = tmp_path / "misframed.warc"
    path.write_bytes(b"".join(records))
    items = read(path)
    assert urls(items) == [
        "https://example.cn/1",
        "bad_input:https://example.cn/2",
        "https://example.cn/3",
        "bad_input:https://example.cn/4",
        "bad_input:None",  # after a block too long, no record can be found
    ]
    assert [getattr(i, "detail", "").split(": ", 1)[1] for i in items[1::2]] == [
        "WARC record 2: not followed by a blank line: its Content-Length is wrong",
        "WARC record 4: not followed by a blank line: its Content-Length is wrong",
    ]
    assert isinstance(items[4], Rejected) and "rest of file skipped" in items[4].detail


def four_records() -> list[bytes]:
    return [
        raw_record(f"https://example.cn/{n}", http_block(b"<p>%d</p>" % n)) for n in range(1, 5)
    ]


def misframed(records: list[bytes], too_long: int) -> bytes:
    """``records`` with the first one's Content-Length ``too_long`` bytes too long."""
    block = http_block(b"<p>1</p>")
    first = raw_record("https://example.cn/1", block, Content_Length=str(len(block) + too_long))
    return first + b"".join(records[1:])


def test_warc_record_too_long_by_any_amount_is_never_a_page(tmp_path: Path) -> None:
    # too long by an amount that ends on a line boundary, record 1 would hold record 2's
    # WARC headers, or all of record 2, with no reject
    records = four_records()
    path = tmp_path / "misframed.warc"
    intact = [(i.url, i.body) for i in read(_write(path, b"".join(records)))[1:]]
    for too_long in range(4, len(records[1]) + len(records[2])):
        items = read(_write(path, misframed(records, too_long)))
        assert urls(items)[0] == "bad_input:https://example.cn/1", too_long
        pages = [(i.url, i.body) for i in items if isinstance(i, RawPage)]
        assert all(page in intact for page in pages), too_long
    # Too long by 1 to 3 bytes takes in part of the blank lines after the block: a block
    # may end with CR or LF, so that cannot be told, and it costs no other record.
    for too_long in (1, 2, 3):
        items = read(_write(path, misframed(records, too_long)))
        assert [getattr(i, "body", None) for i in items[:1]] == [
            b"<p>1</p>" + b"\r\n\r\n"[:too_long]
        ]


@pytest.mark.parametrize("gz", [False, True])
def test_warc_record_too_long_by_whole_records_is_rejected(tmp_path: Path, gz: bool) -> None:
    records = four_records()
    get = b"GET /0 HTTP/1.1\r\nHost: example.cn\r\n\r\n"
    request = raw_record(
        "https://example.cn/0",
        get,
        WARC_Type="request",
        Content_Length=str(len(get) + 4 + len(records[0]) - 4),
    )
    path = tmp_path / "swallowed.warc"
    data = misframed(records, 4 + len(records[1]) + len(records[2]) - 4)
    data += request + b"".join(records)  # a request record swallows page 1
    path.write_bytes(gzip.compress(data) if gz else data)
    items = read(path)
    assert urls(items) == [
        "bad_input:https://example.cn/1",  # holds records 2 and 3
        "https://example.cn/4",
        "bad_input:None",  # holds page 1
        "https://example.cn/2",
        "https://example.cn/3",
        "https://example.cn/4",
    ]
    assert [i.detail for i in items if isinstance(i, Rejected)] == [
        f"{path}: WARC record {n}: its block ends with a whole WARC record: "
        "its Content-Length is wrong"
        for n in (1, 3)
    ]


def test_warc_too_long_into_the_next_record_s_headers_is_rejected(tmp_path: Path) -> None:
    records = four_records()
    headers = records[1][: records[1].index(b"\r\n\r\n") + 2]  # without the blank line
    path = _write(tmp_path / "misframed.warc", misframed(records, 4 + len(headers)))
    items = read(path)
    assert urls(items) == ["bad_input:https://example.cn/1", "bad_input:None"]
    assert [i.detail for i in items if isinstance(i, Rejected)] == [
        f"{path}: WARC record 1: not followed by a WARC record, "
        "so its Content-Length cannot be trusted",
        f"{path}: WARC record 2: ArchiveLoadFailed: Invalid WARC record, first line: "
        "HTTP/1.1 200 OK\r\n; rest of file skipped",
    ]


def test_warc_pages_that_quote_warc_records_are_pages(tmp_path: Path) -> None:
    # Only a block that ends where a record in it ends is taken for a wrong length: a
    # page may quote a record, and a WARC file (ending in its blank lines) may be fetched.
    quoted = raw_record("https://example.org/x", http_block(b"<p>quoted</p>"))
    bodies = [
        b"<pre>\r\n\r\n" + quoted + b"</pre>",
        b"<pre>\r\n\r\n" + quoted,
        quoted + quoted,
    ]
    path = tmp_path / "quoting.warc"
    records = [raw_record(f"https://example.cn/{n}", http_block(b)) for n, b in enumerate(bodies)]
    path.write_bytes(b"".join(records) + raw_record("https://example.cn/3", http_block()))
    items = read(path)
    assert urls(items) == [f"https://example.cn/{n}" for n in range(4)]
    assert [getattr(i, "body", None) for i in items] == [*bodies, GBK]


def test_warc_last_record_whose_length_is_short_is_not_a_page(tmp_path: Path) -> None:
    block = http_block()
    path = tmp_path / "misframed.warc"
    path.write_bytes(
        raw_record("https://example.cn/1", http_block())
        + raw_record("https://example.cn/2", block, Content_Length=str(len(block) - 9))
    )
    assert urls(read(path)) == ["https://example.cn/1", "bad_input:https://example.cn/2"]


def test_warc_cut_inside_record_headers_is_reported(tmp_path: Path) -> None:
    data = raw_record("https://example.cn/1", http_block()) + raw_record(
        "https://example.cn/2", http_block()
    )
    path = tmp_path / "cut.warc"
    path.write_bytes(data[: data.index(b"Content-Length", data.index(b"example.cn/2"))])
    items = read(path)
    assert urls(items) == ["https://example.cn/1", "bad_input:https://example.cn/2"]
    assert isinstance(items[1], Rejected) and "file cut short" in items[1].detail


def test_warc_records_without_target_uri_cost_that_record_only(tmp_path: Path) -> None:
    # warcio's own parsing of a request without WARC-Target-URI raises, which would skip
    # the rest of the file
    request = b"GET /2 HTTP/1.1\r\nHost: example.cn\r\n\r\n"
    no_uri = {"WARC_Target_URI": None}
    path = tmp_path / "no-uri.warc"
    path.write_bytes(
        raw_record("https://example.cn/1", http_block())
        + raw_record("https://example.cn/2", request, WARC_Type="request", **no_uri)
        + raw_record("https://example.cn/3", http_block())
        + raw_record("https://example.cn/4", http_block(), **no_uri)
        + raw_record("https://example.cn/5", http_block())
    )
    items = read(path)
    assert urls(items) == [
        "https://example.cn/1",
        "https://example.cn/3",
        "bad_input:None",
        "https://example.cn/5",
    ]
    assert isinstance(items[2], Rejected)
    assert items[2].detail == f"{path}: WARC record 4: response record without WARC-Target-URI"


def test_warc_http_headers_are_read_to_a_bound(tmp_path: Path) -> None:
    endless = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * (2 << 20)
    path = tmp_path / "long-headers.warc"
    path.write_bytes(
        raw_record("https://example.cn/1", endless)
        + raw_record("https://example.cn/2", http_block())
    )
    items = read(path)
    assert urls(items) == ["bad_input:https://example.cn/1", "https://example.cn/2"]
    assert isinstance(items[0], Rejected) and "HTTP headers over 1048576 bytes" in items[0].detail


@pytest.mark.parametrize(
    ("second", "first"),
    [
        pytest.param(
            raw_record("https://example.cn/2", http_block(), X_Padding="x" * (3 << 20)),
            "https://example.cn/1",
            id="a long header line",
        ),
        pytest.param(
            raw_record(
                "https://example.cn/2", http_block(), **{f"X-{n}": "x" * 30_000 for n in range(40)}
            ),
            "https://example.cn/1",
            id="many header lines",
        ),
        pytest.param(
            b"x" * (3 << 20) + b"\r\n" + raw_record("https://example.cn/2", http_block()),
            "bad_input:https://example.cn/1",  # no WARC record follows it
            id="a long line between records",
        ),
        pytest.param(  # blank lines do end the record before
            b"\r\n" * (1 << 20) + raw_record("https://example.cn/2", http_block()),
            "https://example.cn/1",
            id="over a MiB of blank lines between records",
        ),
    ],
)
def test_warc_headers_are_read_to_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: bytes, first: str
) -> None:
    # warcio reads such lines whole, in quadratic time (a 32 MB line costs 11 s of CPU and
    # 121 MB)
    path = tmp_path / "long-lines.warc"
    path.write_bytes(
        raw_record("https://example.cn/1", http_block())
        + second
        + raw_record("https://example.cn/3", http_block())
    )
    from warcio.bufferedreaders import BufferedReader

    longest = longest_result(monkeypatch, BufferedReader, "readline")
    items = read(path)
    assert urls(items) == [first, "bad_input:None"]
    assert isinstance(items[1], Rejected)
    assert items[1].detail == (
        f"{path}: WARC record 2: ValueError: WARC headers over 1048576 bytes; rest of file skipped"
    )
    assert longest[0] <= (1 << 20) + 1


def test_warc_headers_of_normal_size_are_read(tmp_path: Path) -> None:
    path = tmp_path / "headers.warc"
    headers = {f"X-{n}": "x" * 20_000 for n in range(40)}  # 800 KB, under the bound
    path.write_bytes(
        raw_record("https://example.cn/1", http_block(), **headers)
        + raw_record("https://example.cn/2", http_block(), **headers)
    )
    assert urls(read(path)) == ["https://example.cn/1", "https://example.cn/2"]


def test_warc_gzip_cut_after_headers_without_length_is_reported(tmp_path: Path) -> None:
    record = raw_record("https://example.cn/1", http_block(), Content_Length=None)
    headers_end = record.index(b"\r\n\r\n") + 4
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(gzip.compress(record[:headers_end]) + gzip.compress(record)[:5])
    [reject] = read(path)
    assert isinstance(reject, Rejected) and reject.reason is Reason.BAD_INPUT
    assert "WARC record 1: file truncated, rest of file skipped: EOFError" in reject.detail


def test_jsonl_that_starts_like_a_warc_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "warcish.jsonl"
    path.write_bytes(b"WARC/1.0\r\n" + jsonl_line(1) + jsonl_line(2))
    [reject] = read(path)
    assert isinstance(reject, Rejected) and reject.reason is Reason.BAD_INPUT
    assert "not a WARC record" in reject.detail


def test_warc_gzipped_whole_and_cut_keeps_earlier_records(tmp_path: Path) -> None:
    # warcio alone gives such a file cut to 2/3 as 0 pages and 0 rejects
    plain = tmp_path / "crawl.warc"
    write_warc(plain, [page_rec(f"https://example.cn/{n}", GBK * 20) for n in range(30)], gz=False)
    data = gzip.compress(plain.read_bytes())
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    items = read(path)
    assert len(items) > 10
    assert urls(items[:-1]) == [f"https://example.cn/{n}" for n in range(len(items) - 1)]
    assert all(isinstance(i, RawPage) and i.body == GBK * 20 for i in items[:-1])
    last = items[-1]
    assert isinstance(last, Rejected) and last.reason is Reason.BAD_INPUT
    assert (
        f"WARC record {len(items)}: file truncated, rest of file skipped: EOFError" in last.detail
    )


@pytest.mark.parametrize("packing", ["plain", "gzip per record", "gzip whole"])
def test_warc_cut_anywhere_says_so_exactly_when_something_is_lost(
    tmp_path: Path, packing: str
) -> None:
    get = b"GET / HTTP/1.1\r\nHost: example.cn\r\n\r\n"
    records = [
        raw_record("https://example.cn/1", http_block()),
        raw_record("https://example.cn/1", get, WARC_Type="request"),
        raw_record("https://example.cn/2", http_block(GBK * 3)),
        raw_record("https://example.cn/3", http_block()),
    ]
    whole = read(_write(tmp_path / "whole.warc", b"".join(records)))
    if packing == "gzip per record":
        records = [gzip.compress(r) for r in records]
    data = b"".join(records)
    ends = [len(b"".join(records[: n + 1])) for n in range(len(records))]
    # bytes whose loss costs nothing: the blank lines that end a plain record
    harmless = {e - k for e in ends for k in range(5)} if packing == "plain" else set(ends)
    if packing == "gzip whole":
        data, harmless = gzip.compress(data), set()
    for cut in range(1, len(data)):
        items = read(_write(tmp_path / "cut.warc", data[:cut]))
        head = data[:cut] if packing == "plain" else zlib.decompressobj(31).decompress(data[:cut])
        if not head.startswith(b"WARC/"):  # too little is left to tell a WARC: read as JSONL
            assert [type(i) for i in items] == [Rejected], cut
            continue
        pages = [i for i in items if isinstance(i, RawPage)]
        assert pages == whole[: len(pages)], cut  # the same pages, bodies whole, in order
        rejects = [i for i in items if isinstance(i, Rejected)]
        if cut in harmless:
            assert not rejects, cut
        else:
            [reject] = rejects
            assert reject.reason is Reason.BAD_INPUT, cut
            says = ("truncated", "cut short")
            if packing == "plain" and any(0 < cut - e < 9 for e in [0, *ends]):
                says = (*says, "first line: ")  # warcio: "Invalid WARC record, first line: WARC/1"
            assert any(w in reject.detail for w in says), (cut, reject)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_warc_garbage_record_stops_file_with_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.warc"
    write_warc(path, [page_rec(f"https://example.cn/{n}") for n in range(3)], gz=False)
    data = path.read_bytes()
    second = data.index(b"WARC/1", 10)
    path.write_bytes(data[:second] + b"GARBAGE" + data[second + 7 :])
    items = read(path, tmp_path / "bad.warc")  # the same file twice: both are read
    # What follows record 1 is no record, so where record 1 ends is not known: a
    # Content-Length too long by some lines looks the same.
    assert urls(items) == ["bad_input:https://example.cn/0", "bad_input:None"] * 2
    assert isinstance(items[0], Rejected)
    assert items[0].detail == (
        f"{path}: WARC record 1: not followed by a WARC record, "
        "so its Content-Length cannot be trusted"
    )
    assert isinstance(items[1], Rejected) and items[1].reason is Reason.BAD_INPUT
    assert "rest of file skipped" in items[1].detail


@pytest.mark.parametrize("gz", [False, True])
def test_warc_random_damage_never_raises(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / "fuzz.warc"
    write_warc(path, standard_records(), gz=gz)
    data = path.read_bytes()
    rng = random.Random(7)
    for _ in range(60):
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        for item in read(path):
            assert isinstance(item, RawPage | Rejected)


def test_mixed_inputs_keep_file_order(tmp_path: Path) -> None:
    first = tmp_path / "a.jsonl"
    first.write_bytes(jsonl_line(1))
    warc = tmp_path / "b.warc.gz"
    write_warc(warc, standard_records()[2:3], gz=True)
    last = tmp_path / "c.jsonl.gz"
    last.write_bytes(gzip.compress(jsonl_line(9)))
    assert urls(read(first, warc, last)) == [
        "https://example.cn/1",
        "https://example.cn/1",
        "https://example.cn/9",
    ]


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert read(path) == []


def _gzip_lines(opener: Any, path: Path) -> list[Any]:
    from neardup.sources.streams import STREAM_ERRORS

    out: list[Any] = []
    try:
        with opener(path) as fh:
            while line := fh.readline(1 << 24):
                out.append(line)
    except STREAM_ERRORS as exc:
        out.append(type(exc).__name__)
    return out


def test_isal_inflater_gives_what_gzip_gives(tmp_path: Path) -> None:
    """JSONL gzip is inflated with ISA-L (neardup.sources.streams._Inflater): the same lines as
    gzip.GzipFile, and the same failure, for members, padding, garbage and truncation."""
    from neardup.sources.streams import open_input

    def _gunzipped(path: Path) -> io.BufferedReader:
        stream, head = open_input(str(path))
        assert not head or stream.peek(len(head)).startswith(head)
        return stream

    rng = random.Random(7)
    # long lines of varied text, so that the compressed stream spans many reads
    lines = [
        jsonl_line(
            n, html="".join(rng.choice("地铁线路明年通车城市交通abc<>/ ") for _ in range(9000))
        )
        for n in range(60)
    ]
    one = gzip.compress(b"".join(lines))
    cases = {
        "one member": one,
        "two members": gzip.compress(b"".join(lines[:25])) + gzip.compress(b"".join(lines[25:])),
        "empty member first": gzip.compress(b"") + one,
        "zero padding": one + bytes(700),
        "garbage after": one + b"garbage",
        "no newline at end": gzip.compress(b"".join(lines)[:-1]),
        **{f"cut at {cut}": one[:cut] for cut in rng.sample(range(10, len(one)), 8)},
    }
    path = tmp_path / "case.jsonl.gz"
    for name, data in cases.items():
        path.write_bytes(data)
        expected = _gzip_lines(functools.partial(gzip.open, mode="rb"), path)
        assert _gzip_lines(_gunzipped, path) == expected, name
