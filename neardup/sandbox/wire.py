"""The frames that cross the sandbox's pipes: a page (or a message not parsed yet) to a
worker, its result back, and the JSON of the zygote's control messages.

A frame is two big-endian lengths, then a JSON header and a byte payload of those
lengths. The parent reads nothing from a worker but JSON and raw byte strings, never a
pickle (see ``neardup.sandbox``). Apart from the processes on either end because both
ends must agree on it byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import orjson

from neardup.engine import Analysed
from neardup.fingerprint import Fingerprints
from neardup.records import Extracted, RawMessage, RawPage, Reason, Rejected

# What a worker does with a page: ``analyse`` it (the engine), or only ``extract`` its
# title and text (``neardup extract``).
ANALYSE, EXTRACT = "analyse", "extract"
Result = Analysed | Extracted | Rejected

# A frame: two big-endian lengths, then a JSON header and a byte payload of those lengths.
FRAME = struct.Struct(">II")
CHUNK = 1 << 20
CONTROL_BYTES = 1 << 16  # one control message (a config, a pid, an exit status)


def dumps(obj: object) -> bytes:
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        # a lone surrogate (a hand-built page's URL may hold one), which orjson refuses:
        # json's ASCII escapes carry it both ways (``loads``)
        return json.dumps(obj).encode()


def loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # a lone surrogate's escape, from ``dumps``
        return json.loads(data)


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = dumps(header)
    return FRAME.pack(len(head), len(payload)) + head + payload


def split_frame(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the payload of one whole frame."""
    head_len, payload_len = FRAME.unpack_from(frame)
    if len(frame) != FRAME.size + head_len + payload_len:
        raise ValueError("sandbox reply: the frame's length does not match its prefix")
    header: dict[str, Any] = loads(frame[FRAME.size : FRAME.size + head_len])
    return header, frame[FRAME.size + head_len :]


def page_frame(page: RawPage, job: str = ANALYSE) -> bytes:
    body: bytes
    text = isinstance(page.body, str)
    if isinstance(page.body, str):
        try:
            body = page.body.encode("utf-8")
        except UnicodeEncodeError:  # a JSON string's lone surrogate, for decode() to see
            body = page.body.encode("utf-8", "surrogatepass")  # slower: only when needed
    else:
        body = page.body
    header = {
        "page_id": page.page_id,
        "url": page.url,
        "fetched_at": page.fetched_at,
        "content_type": page.content_type,
        "site": page.site,
        "text": text,
        "job": job,
    }
    return _frame(header, body)


def message_frame(msg: RawMessage, job: str = ANALYSE) -> bytes:
    """A message not parsed yet: the worker parses it (``contract.parse_message``)."""
    return _frame({"raw": True, "where": msg.where, "job": job}, msg.line)


_PAGE_FIELDS = ("page_id", "url", "fetched_at", "content_type", "site")


def _page_meta(page: RawPage) -> dict[str, Any]:
    return {name: getattr(page, name) for name in _PAGE_FIELDS}


def page_from(header: dict[str, Any], payload: bytes) -> tuple[RawPage, bytes | None]:
    """The page of a frame, and a text body's UTF-8 (the payload itself) for ``decode``,
    which then need not encode it again; None for a byte body, or a text body that held
    a lone surrogate (sent as surrogatepass, which is not UTF-8)."""
    body: str | bytes = payload
    utf8: bytes | None = None
    if header["text"]:
        try:
            body, utf8 = payload.decode("utf-8"), payload
        except UnicodeDecodeError:
            body = payload.decode("utf-8", "surrogatepass")
    page = RawPage(
        header["page_id"],
        header["url"],
        header["fetched_at"],
        header["content_type"],
        body,
        header["site"],
    )
    return page, utf8


_FPS_FIELDS = tuple(f.name for f in dataclasses.fields(Fingerprints))
_ANALYSED_FIELDS = tuple(
    f.name for f in dataclasses.fields(Analysed) if f.name not in ("page", "fps")
)


def result_frame(
    result: Result, seconds: dict[str, float], retire: bool, parsed: bool = False
) -> bytes:
    """``parsed``: the worker parsed the page from a message, and the parent, which has
    no page of its own, needs its fields (never its body)."""
    header: dict[str, Any] = {"seconds": seconds, "retire": retire}
    if isinstance(result, Rejected):
        header["rejected"] = {"reason": str(result.reason), "detail": result.detail,
                              "page_id": result.page_id, "url": result.url}  # fmt: skip
        return _frame(header)
    if parsed:
        header["page"] = _page_meta(result.page)
    if isinstance(result, Extracted):
        header["extracted"] = {"title": result.title, "paragraphs": result.paragraphs}
        return _frame(header)
    blobs: list[bytes] = []
    fps: dict[str, Any] = {}
    for name in _FPS_FIELDS:
        value = getattr(result.fps, name)
        if isinstance(value, bytes):
            fps[name] = {"blob": len(value)}
            blobs.append(value)
        else:
            fps[name] = value
    header["analysed"] = {name: getattr(result, name) for name in _ANALYSED_FIELDS}
    header["fps"] = fps
    return _frame(header, b"".join(blobs))


def result_from(header: dict[str, Any], payload: bytes, item: RawPage | RawMessage) -> Result:
    """The child's answer for ``item``: a page is the parent's own copy; a message's page
    is made from the fields the child parsed, without its body (nothing after the
    analysis reads it)."""
    if "rejected" in header:
        rej = header["rejected"]
        ids = (item.page_id, item.url) if isinstance(item, RawPage) else (
            _opt_str(rej.get("page_id")), _opt_str(rej.get("url")))  # fmt: skip
        return Rejected(Reason(rej["reason"]), str(rej["detail"]), *ids)
    page = item if isinstance(item, RawPage) else _parsed_page(header["page"])
    if "extracted" in header:
        ext = header["extracted"]
        return Extracted(page, str(ext["title"]), tuple(str(p) for p in ext["paragraphs"]))
    fps: dict[str, Any] = {}
    at = 0
    for name, value in header["fps"].items():
        if isinstance(value, dict):
            size = int(value["blob"])
            fps[name] = payload[at : at + size]
            at += size
        else:
            fps[name] = tuple(value) if isinstance(value, list) else value
    if at != len(payload):
        raise ValueError("sandbox reply: payload does not match its header")
    analysed: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in header["analysed"].items()
    }
    return Analysed(page=page, fps=Fingerprints(**fps), **analysed)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _parsed_page(meta: dict[str, Any]) -> RawPage:
    fields = {name: _opt_str(meta[name]) for name in _PAGE_FIELDS}
    if any(fields[name] is None for name in _PAGE_FIELDS if name != "site"):
        raise ValueError("sandbox reply: a parsed page without its identity")
    return RawPage(body="", **fields)  # type: ignore[arg-type]
