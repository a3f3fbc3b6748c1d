"""Raw pages from WARC records (plain or gzip, per record or whole), in order.

``response`` records with a 2xx status for http(s) URIs and ``resource`` records holding
HTML are pages; every other record is read past. A record that cannot be read, or whose
Content-Length proves wrong (``framing.py``), becomes a ``Rejected``; where the next
record starts cannot then be told, so the rest of the file is given up.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from typing import Any

from neardup.contract import derive_page_id
from neardup.records import RawPage, Reason, Rejected
from neardup.sources.bodies import http_headers, payload
from neardup.sources.framing import Block, HeaderLines, Watched, starts_record
from neardup.sources.streams import STREAM_ERRORS, bad_input, say

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_PAGE_RECORDS = frozenset({"response", "resource"})  # WARC-Types that may hold a page
_HTTP_SCHEMES = ("http:", "https:")
_MISFRAMED = "not followed by a blank line: its Content-Length is wrong"
_UNCONFIRMED = "not followed by a WARC record, so its Content-Length cannot be trusted"
_SWALLOWED = "its block ends with a whole WARC record: its Content-Length is wrong"


def warc_pages(
    stream: io.BufferedReader, name: str, max_bytes: int
) -> Iterator[RawPage | Rejected]:
    """The pages of a WARC's records, in order; ``stream`` is gunzipped already."""
    from warcio.archiveiterator import ArchiveIterator  # only for WARC input

    # A .warc.gz reaches warcio inflated (by _Inflater), gzipped per record or whole: warcio
    # misses a gzip member cut inside its headers, takes the EOFError of a file cut
    # elsewhere for its end, and refuses a WARC gzipped whole (so a whole-file .warc.gz cut
    # to 2/3 would give 0 pages and 0 rejects).
    source = Watched(stream)
    # no_record_parse: warcio's own parsing of a record's HTTP headers fails on a request
    # record without WARC-Target-URI, and that loses the rest of the file. Pages are found,
    # and their headers parsed, by _page_from_record.
    archive = ArchiveIterator(source, no_record_parse=True)
    lines = HeaderLines(archive.reader)
    records = iter(archive)
    held: RawPage | None = None  # given once the next record shows where this one ended
    number = 0
    while True:
        number += 1
        warnings = archive.err_count
        record, failure = _next_record(records, lines)
        if archive.err_count > warnings:
            # warcio skips a line where the blank lines after the record should be: its
            # Content-Length was wrong, so its block is not its own (or not all of it).
            yield bad_input(f"{name}: WARC record {number - 1}: {_MISFRAMED}", _url_of(held))
        elif held is not None and (
            failure is None
            or source.error is not None
            or lines.blank  # only blank lines after it, too many of them: its end is sure
            or starts_record(lines.first)
        ):
            yield held
        elif held is not None:
            # Blank lines, then no WARC record: a Content-Length too long by some lines put
            # the next record's headers in this block. A file cut short is not that, and is
            # said next.
            yield bad_input(f"{name}: WARC record {number - 1}: {_UNCONFIRMED}", held.url)
        held = None
        if source.error is not None:
            yield _broken(name, number, source.error)
            return
        if failure is not None:
            yield bad_input(f"{name}: WARC record {number}: {say(failure)}; rest of file skipped")
            return
        if record is None:
            return
        url = _target_uri(record)
        length = _content_length(record)
        if length is None:
            # warcio then reads the rest of the file as this record's block: a page made of
            # the records after it. Where the next record starts cannot be told without
            # guessing.
            why = _unframed(record, archive.reader)
            if source.error is not None:
                yield _broken(name, number, source.error)
            else:
                yield bad_input(f"{name}: WARC record {number}: {why}; rest of file skipped", url)
            return
        result = _record_result(record, url, length, max_bytes)
        if source.error is not None:
            yield _broken(name, number, source.error)
            return
        if isinstance(result, Rejected):
            detail = f"{name}: WARC record {number}: {result.detail}"
            yield dataclasses.replace(result, detail=detail)
        elif result is not None:
            held = result


def _record_result(
    record: Any, url: str | None, length: int, max_bytes: int
) -> RawPage | Rejected | None:
    """The page a record holds, why it is rejected, or None if it holds no page; its block
    is read to its end, unless the stream breaks (for the caller to say)."""
    # Every read of the block, warcio's included, goes through the watch.
    block = record.raw_stream = Block(record.raw_stream, length)
    try:
        page = _page_from_record(record, url, max_bytes)
    # A record whose payload cannot be read (bad chunking, bad Content-Encoding) is
    # dead-lettered; the iterator skips to the next record by the WARC's own length.
    except Exception as exc:
        page = bad_input(say(exc), url)
    try:
        # Of every record, not only of pages: a file cut inside a request record loses
        # nothing but that record (its end is past the end of the file), yet it is a
        # truncated file.
        missing = _bytes_missing(record)
    except STREAM_ERRORS:
        missing = 0  # the stream broke: the caller says so
    where = url if record.rec_type in _PAGE_RECORDS else None
    if missing:
        detail = f"{record.rec_type} record truncated: {missing} of {record.length} bytes"
        return bad_input(f"{detail} missing (file cut short)", where)
    if block.holds_record():
        return bad_input(_SWALLOWED, where)
    return page


def _next_record(records: Iterator[Any], lines: HeaderLines) -> tuple[Any, Exception | None]:
    """The next record, None at the end; or None and what reading it raised."""
    lines.restart()
    try:
        return next(records, None), None
    # warcio raises its own ArchiveLoadFailed, but also ValueError and the like from deep
    # inside on a damaged file; after any of them the reader's position is unknown, so the
    # rest of the file is given up.
    except Exception as exc:
        return None, exc


def _broken(name: str, number: int, error: Exception) -> Rejected:
    what = "file truncated" if isinstance(error, EOFError) else "stream damaged"
    detail = f"WARC record {number}: {what}, rest of file skipped: {say(error)}"
    return bad_input(f"{name}: {detail}")


def _url_of(page: RawPage | None) -> str | None:
    return page.url if page is not None else None


def _content_length(record: Any) -> int | None:
    """The record's Content-Length, None if it has none that is a number of bytes."""
    value = record.rec_headers.get_header("Content-Length")
    text = value.strip() if isinstance(value, str) else ""
    # 19 digits at most: int() refuses over 4,300, and no file is longer
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def _unframed(record: Any, reader: Any) -> str:
    """Why a record has no Content-Length that is a number of bytes; ``reader`` is the
    stream warcio reads records from."""
    value = record.rec_headers.get_header("Content-Length")
    headers = record.rec_headers.headers
    try:
        at_end = not reader.read(1)
    except STREAM_ERRORS:
        at_end = True  # and the caller reports the broken stream
    if at_end and (record.rec_type is not None or not headers):
        return "the file ends inside its headers (file cut short)"
    if value is not None:
        return f"Content-Length {value!r} is not a number of bytes"
    if record.rec_type is None:
        return "neither WARC-Type nor Content-Length: not a WARC record"
    return "no Content-Length, so where the record ends cannot be told"


def _target_uri(record: Any) -> str | None:
    uri = record.rec_headers.get_header("WARC-Target-URI")
    if not isinstance(uri, str):
        return None
    uri = uri.strip()
    # WARC 1.0's grammar showed the URI in angle brackets and some writers followed it.
    if uri.startswith("<") and uri.endswith(">"):
        uri = uri[1:-1].strip()
    return uri or None


def _page_head(record: Any, url: str | None) -> tuple[str, Any] | None:
    """(Content-Type, HTTP headers or None) of the page a record holds; None for records
    that hold no page: requests, metadata, non-HTTP or non-2xx responses, resources that
    are not HTML."""
    if record.rec_type == "response":
        # dns:, whois: and the like hold no HTTP response; without a URI, the block tells
        if (url and not url.lower().startswith(_HTTP_SCHEMES)) or record.length == 0:
            return None
        http = http_headers(record.raw_stream)
        if not str(http.get_statuscode()).startswith("2"):
            return None  # redirects and errors hold no page of the URL
        return str(http.get_header("Content-Type") or "text/html"), http
    if record.rec_type == "resource":
        content_type = str(record.rec_headers.get_header("Content-Type") or "")
        if content_type.split(";", 1)[0].strip().lower() in _HTML_TYPES:
            return content_type, None
    return None


def _page_from_record(record: Any, url: str | None, max_bytes: int) -> RawPage | Rejected | None:
    """The page a record holds, a Rejected if it is unusable, None if it holds no page."""
    head = _page_head(record, url)
    if head is None:
        return None
    content_type, http = head
    if url is None:
        return bad_input(f"{record.rec_type} record without WARC-Target-URI")
    fetched_at = record.rec_headers.get_header("WARC-Date")
    if not fetched_at:
        return bad_input(f"{record.rec_type} record without WARC-Date", url)
    # One byte past the limit is read: it bounds what a compression bomb can cost.
    body = payload(record.raw_stream, http, max_bytes + 1)
    if len(body) > max_bytes:
        return Rejected(
            Reason.TOO_LARGE, f"body is over {max_bytes} bytes", derive_page_id(url), url
        )
    return RawPage(
        page_id=derive_page_id(url),
        url=url,
        fetched_at=str(fetched_at),
        content_type=content_type,
        body=body,
    )


def _bytes_missing(record: Any) -> int:
    """How many bytes of the record's declared Content-Length the file does not have."""
    raw = record.raw_stream
    while raw.read(64 * 1024):  # what follows the payload (chunk trailers, padding)
        pass
    return int(getattr(raw, "limit", 0))
