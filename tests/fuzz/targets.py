"""Fuzz targets and the invariants they check: one function per stage, bytes in.

Shared by the atheris harness (``atheris_harness.py``), the hypothesis properties
(``test_properties.py``) and the regression replay (``tests/regressions``). A target
returns normally or raises: any exception, an ``AssertionError`` from a broken invariant
included, is a finding. Nothing here imports atheris, so replaying needs only pytest.

The invariants, for every input:

* ``parse_raw``: a ``RawPage`` within the byte limit from a schema-valid message, or a
  ``Rejected`` whose dead-letter
  record is valid against ``rejected-page.schema.json`` and writable as UTF-8 (so is
  every record below);
* ``decode``: a ``Decoded`` whose text is valid Unicode (no lone surrogates) and mostly
  free of U+FFFD, or a ``Rejected`` as not_html or decode;
* ``extract``: an ``Extracted`` with clean, non-empty paragraphs, or a ``Rejected`` as
  no_text or too_large; an ``internal`` rejection means a parser raised: a finding;
* ``engine``: ``Engine.process`` returns, never raises, and everything it returns is a
  valid decision (its merges valid merge events) or a valid rejection other than internal.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator

from neardup.config import EngineConfig
from neardup.contract import parse_raw, validate
from neardup.decode import LAYERS, MAX_BAD_SHARE, bad_share, decode
from neardup.engine import Engine, Outcome
from neardup.extract import extract
from neardup.records import Decoded, Extracted, RawPage, Reason, Rejected
from neardup.store import MemoryKV

#: A small byte limit, so that the too_large paths are reached by small inputs.
MAX_BYTES = 4096
#: Analysis in this process: a page that hangs is a finding (libFuzzer's -timeout), not
#: a timeout rejection that the sandbox would hide.
CFG = EngineConfig(extract_timeout_s=0.0, max_bytes=64 * 1024)
CONTENT_TYPES = (
    "text/html",
    "text/html; charset=utf-8",
    "text/html; charset=gbk",
    "text/html; charset=gb2312",
    "text/html; charset=big5",
    "text/html; charset=utf-16",
    "text/html; charset=iso-8859-1",
    "text/html; charset=x-unknown",
    "text/html; charset=unicode_escape",
    "application/xhtml+xml",
    "application/octet-stream",
    "application/pdf",
    "image/png",
    "",
)
EXTRACTORS = ("density", "density", "density", "resiliparse", "trafilatura")
_T0 = "2026-03-01T00:00:00Z"


def _page(body: str | bytes, content_type: str = "text/html", page_id: str = "p") -> RawPage:
    return RawPage(page_id, f"https://fuzz.example.cn/{page_id}", _T0, content_type, body)


# ------------------------------------------------------------------------- invariants


def writable(record: dict[str, object]) -> None:
    """The record can be written as a UTF-8 JSON line (a lone surrogate cannot)."""
    json.dumps(record, ensure_ascii=False).encode("utf-8")


def check_rejected(out: Rejected, allowed: frozenset[Reason] | None = None) -> None:
    errors = validate("rejected", out.to_json())
    assert not errors, (out, errors)
    writable(out.to_json())
    assert out.reason is not Reason.INTERNAL, f"a stage raised: {out.detail}"
    assert allowed is None or out.reason in allowed, out


def check_parsed(out: RawPage | Rejected, max_bytes: int, line: bytes | str = b"") -> None:
    """... and a line that became a RawPage is one the raw-page schema accepts (parse_raw
    checks well-formed messages by hand, without jsonschema: this holds it to the schema)."""
    if isinstance(out, Rejected):
        check_rejected(out)
        return
    assert isinstance(out, RawPage), out
    if line:
        assert validate("raw", json.loads(line)) == [], line
    assert out.page_id and out.url and isinstance(out.fetched_at, str)
    size = (
        len(out.body)
        if isinstance(out.body, bytes)
        else len(out.body.encode("utf-8", "surrogatepass"))
    )
    assert size <= max_bytes, (size, max_bytes)


_DECODE_REJECTS = frozenset({Reason.NOT_HTML, Reason.DECODE})


def check_decoded(out: Decoded | Rejected) -> None:
    if isinstance(out, Rejected):
        check_rejected(out, _DECODE_REJECTS)
        return
    assert isinstance(out, Decoded), out
    out.html.encode("utf-8")  # raises on a lone surrogate
    assert out.layer in LAYERS, out.layer
    assert bad_share(out.html) <= MAX_BAD_SHARE
    assert out.charset


_EXTRACT_REJECTS = frozenset({Reason.NO_TEXT, Reason.TOO_LARGE})


def check_extracted(out: Extracted | Rejected) -> None:
    if isinstance(out, Rejected):
        check_rejected(out, _EXTRACT_REJECTS)
        return
    assert isinstance(out, Extracted), out
    assert out.paragraphs and isinstance(out.title, str)
    for para in out.paragraphs:
        assert para and para == para.strip() and "\n" not in para, repr(para)


def check_outcome(out: Outcome | Rejected) -> None:
    if isinstance(out, Rejected):
        check_rejected(out)
        return
    assert isinstance(out, Outcome), out
    errors = validate("decision", out.decision)
    assert not errors, (out.decision, errors)
    writable(out.decision)
    for merge in out.merges:
        assert not validate("merge", merge.to_json()), merge
        writable(merge.to_json())


# ---------------------------------------------------------------- byte-level targets


def parse_raw_target(data: bytes) -> None:
    check_parsed(parse_raw(data, MAX_BYTES), MAX_BYTES, data)
    text = data.decode("utf-8", "surrogateescape")  # lone surrogates, as JSON allows
    check_parsed(parse_raw(text, MAX_BYTES), MAX_BYTES, text)


def decode_target(data: bytes) -> None:
    """First byte: content type, and whether the body is text (``html``) or bytes."""
    if not data:
        return
    content_type = CONTENT_TYPES[data[0] % len(CONTENT_TYPES)]
    body: str | bytes = data[1:]
    if data[0] & 0x80:
        body = data[1:].decode("utf-8", "surrogateescape")
    check_decoded(decode(_page(body, content_type)))


def extract_target(data: bytes) -> None:
    """First byte: the extractor; the rest, as UTF-8, the decoded page."""
    if not data:
        return
    extractor = EXTRACTORS[data[0] % len(EXTRACTORS)]
    html = data[1:].decode("utf-8", "replace")
    check_extracted(extract(Decoded(_page(html), html, "utf-8", "text"), extractor))


def messages(data: bytes) -> Iterator[bytes | RawPage]:
    """Raw-page lines from fuzz bytes: chunks split at NUL, each made a message by its
    first byte (as is, as ``html``, as ``body_b64``, with a repeated page id), or a
    RawPage built by hand, its fields any text (other sources than parse_raw make them)."""
    for i, chunk in enumerate(data.split(b"\0")[:6]):
        if not chunk:
            continue
        mode, rest = chunk[0] % 5, chunk[1:]
        content_type = CONTENT_TYPES[chunk[0] % len(CONTENT_TYPES)]
        if mode == 4:
            site, _, body = rest.partition(b"|")
            text = site.decode("utf-8", "surrogateescape")
            yield RawPage(text or "id", f"https://{text}/{i}", _T0, content_type, body, text)
            continue
        msg: dict[str, str] = {"url": f"https://fuzz.example.cn/{i}", "fetched_at": _T0,
                               "content_type": content_type}  # fmt: skip
        if mode == 0:
            yield rest
            continue
        if mode == 2:
            msg["body_b64"] = base64.b64encode(rest).decode()
        else:
            msg["html"] = rest.decode("utf-8", "replace")
        if mode == 3:
            msg["page_id"] = "same-id"
        yield json.dumps(msg, ensure_ascii=False).encode()


def engine_target(data: bytes) -> None:
    engine = Engine(MemoryKV(), CFG)
    for item in messages(data):
        page = item if isinstance(item, RawPage) else parse_raw(item, CFG.max_bytes)
        check_outcome(engine.process(page))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "parse_raw": parse_raw_target,
    "decode": decode_target,
    "extract": extract_target,
    "engine": engine_target,
}
