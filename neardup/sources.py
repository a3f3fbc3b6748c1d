"""Raw pages from files: JSONL (plain or gzip) and WARC (plain or gzip), in order.

The format is told by content, not by name: gzip by its magic bytes, WARC by ``WARC/`` at
the start of the (decompressed) stream; anything else is read as JSONL, a UTF-8 byte order
mark at its start skipped. A path is opened once, so it may be a pipe or a FIFO. ``-`` is
stdin, read as plain JSONL.
Broken input becomes ``Rejected`` records; a file that cannot be read on stops with one.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from isal import isal_zlib

from neardup.contract import derive_page_id, load_line, max_line_bytes, parse_loaded
from neardup.reading import Reading, Skip, ids_of, not_jsonl
from neardup.records import RawPage, Reason, Rejected

STDIN = "-"
_STDIN_NAME = "<stdin>"  # in details
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 31  # zlib's window bits for a gzip header and trailer
_WARC_MAGIC = b"WARC/"
UTF8_BOM = b"\xef\xbb\xbf"
_HEAD = len(_WARC_MAGIC)  # bytes that tell the format: gzip's magic, WARC's
_BUFFER = 1 << 20
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_PAGE_RECORDS = frozenset({"response", "resource"})  # WARC-Types that may hold a page
_HTTP_SCHEMES = ("http:", "https:")
_HTTP_HEADER_BYTES = 1 << 20  # a response's status line and headers; real ones are KiBs
# A WARC record's headers, with the blank lines before them; real ones are a few KiB.
_WARC_HEADER_BYTES = 1 << 20
_LINE_PIECE = 1 << 14  # warcio's buffer size: a line is read in pieces of at most this
_MISFRAMED = "not followed by a blank line: its Content-Length is wrong"
_UNCONFIRMED = "not followed by a WARC record, so its Content-Length cannot be trusted"
_SWALLOWED = "its block ends with a whole WARC record: its Content-Length is wrong"
_WARC_VERSIONS = (b"WARC/1.1", b"WARC/1.0", b"WARC/0.17", b"WARC/0.18")  # what warcio reads
_RECORD_START = b"\r\n\r\nWARC/"  # the blank lines that end a record, and the next one
_SEPARATOR = b"\r\n\r\n"
# A Content-Length header, in WARC headers without the CRLF of their last line.
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([0-9]{1,19})[ \t]*(?:\r\n|$)", re.I)
# What a damaged gzip stream or file raises while being read.
# isal's stubs type its error class as an instance of Exception; it is a class.
_ISAL_ERROR = cast("type[Exception]", isal_zlib.error)
STREAM_ERRORS = (OSError, EOFError, zlib.error, _ISAL_ERROR)


class _Lines(Protocol):
    """What a plain file, a GzipFile and stdin all offer."""

    def read(self, size: int = -1, /) -> bytes: ...
    def readline(self, size: int = -1, /) -> bytes: ...


def iter_pages(
    paths: Sequence[str],
    max_bytes: int,
    *,
    skip: Skip | None = None,
    reading: Reading | None = None,
) -> Iterator[RawPage | Rejected]:
    """Every page of every file, in file order then record order.

    Raises ``FileNotFoundError`` before yielding anything if a path does not exist: that is
    a mistake in the command, not bad data. Everything after that is data, never an error.
    ``skip`` is asked about each page's id as soon as it is known, for a JSONL line before
    its body is decoded: a page it says yes to is left out. ``reading`` is kept up to date.
    """
    missing = [p for p in paths if p != STDIN and not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"no such input file: {', '.join(map(_shown_path, missing))}")
    reading = reading or Reading()
    for path in paths:
        if path == STDIN:
            yield from _stdin_pages(max_bytes, skip, reading)
        else:
            yield from _file_pages(path, max_bytes, skip, reading)


def _stdin_pages(
    max_bytes: int, skip: Skip | None, reading: Reading
) -> Iterator[RawPage | Rejected]:
    if sys.stdin is None:  # started with descriptor 0 closed (found by a review: `<&-`)
        yield _bad_input(f"{_STDIN_NAME}: cannot read: standard input is closed")
        return
    yield from _jsonl_pages(sys.stdin.buffer, _STDIN_NAME, max_bytes, skip, reading)


def _shown_path(path: str) -> str:
    """``path`` as text that is valid UTF-8, for a message: a file name may hold any bytes,
    and those that are not UTF-8 are shown as ``\\xNN``."""
    try:
        raw = os.fsencode(path)  # undoes the surrogate escapes of argv and os.listdir
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to
        return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _file_pages(
    path: str, max_bytes: int, skip: Skip | None, reading: Reading
) -> Iterator[RawPage | Rejected]:
    # A detail holding the path as given would not encode as UTF-8, and the reject could
    # not be written (found by a review of hostile input: a file named b"bad\xffname").
    name = _shown_path(path)
    try:
        stream, head = open_input(path, reading)
    except STREAM_ERRORS as exc:
        yield _bad_input(f"{name}: cannot read: {_say(exc)}")
        return
    with stream:
        try:
            if not head.startswith(_WARC_MAGIC):
                yield from _jsonl_pages(stream, name, max_bytes, skip, reading)
            elif skip is None:
                yield from _warc_pages(stream, name, max_bytes)
            else:  # a record's page id is known once it is parsed
                for item in _warc_pages(stream, name, max_bytes):
                    if isinstance(item, Rejected) or not skip(item.page_id, item.url):
                        yield item
        finally:
            reading.closed()


def open_input(path: str, reading: Reading | None = None) -> tuple[io.BufferedReader, bytes]:
    """The file's bytes, gunzipped if they are gzip, and the first few of those (what tells
    the format), from one open: a pipe or a FIFO gives its bytes once. (Found by a review
    of hostile input: the format was sniffed by opening the file, then it was opened again
    to be read, so `neardup dedup <(cat pages.jsonl)` read an empty pipe and a FIFO hung.)
    """
    raw = open(path, "rb", buffering=0)  # noqa: SIM115 (the stream returned closes it)
    if reading is not None:
        reading.opened(raw)
    try:
        source, head = _rewound(raw)
        if head.startswith(_GZIP_MAGIC):
            inflater = _Inflater(source)
            return io.BufferedReader(inflater, _BUFFER), inflater.peek(_HEAD)
        return io.BufferedReader(source, _BUFFER), head
    except BaseException:
        raw.close()
        raise


def _rewound(raw: io.FileIO) -> tuple[io.RawIOBase, bytes]:
    """``raw`` and its first bytes, still to be read from the stream returned: sought back
    to on a file, put back in front of the rest on a pipe (nothing else is held)."""
    seekable = raw.seekable()
    start = raw.tell() if seekable else 0
    head = b""
    while len(head) < _HEAD:
        piece = raw.read(_HEAD - len(head))
        if not piece:
            break
        head += piece
    if seekable:
        raw.seek(start)
        return raw, head
    return _Prefixed(head, raw), head


class _Prefixed(io.RawIOBase):
    """A stream that cannot seek, with the bytes already read from it put back in front."""

    def __init__(self, head: bytes, raw: io.RawIOBase) -> None:
        self._head = head
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if not self._head:
            return self._raw.readinto(buffer)
        n = min(len(buffer), len(self._head))
        buffer[:n] = self._head[:n]
        self._head = self._head[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Inflater(io.RawIOBase):
    """The decompressed bytes of a gzip file (any number of members, zero padding after
    them), inflated by ISA-L: half the CPU of zlib on the dev pages (0.70 s against 1.45 s
    for 340 MB, a tenth of a whole ``neardup dedup`` run). Not isal's own GzipFile, which
    on a truncated file drops output it has inflated: this one hands out every byte before
    a truncation or trailing garbage, as gzip.GzipFile does, then raises EOFError or
    BadGzipFile. A member whose checksum fails raises isal_zlib.error, and the output of
    the last 16 KiB read before it is not handed out (GzipFile hands it out unchecked)."""

    _CHUNK = 1 << 14  # compressed bytes a call

    def __init__(self, raw: io.RawIOBase) -> None:
        self._raw = raw
        self._inflate = isal_zlib.decompressobj(_GZIP_WBITS)
        self._out = b""
        self._done = False
        self._error: Exception | None = None  # raised once the output before it is read

    def readable(self) -> bool:
        return True

    def _more(self) -> None:
        data = self._raw.read(self._CHUNK)
        if not data:
            self._done = True
            if not self._inflate.eof:
                self._error = EOFError(
                    "Compressed file ended before the end-of-stream marker was reached"
                )
            return
        while data:
            if self._inflate.eof:  # the next member, or zero padding after the last one
                data = data.lstrip(b"\0")
                if not data:
                    return
                if not data.startswith(_GZIP_MAGIC[: len(data)]):
                    self._done = True
                    self._error = gzip.BadGzipFile(f"Not a gzipped file ({data[:2]!r})")
                    return
                self._inflate = isal_zlib.decompressobj(_GZIP_WBITS)
            self._out += self._inflate.decompress(data)
            data = self._inflate.unused_data if self._inflate.eof else b""

    def peek(self, size: int) -> bytes:
        """The next ``size`` bytes of output (fewer at its end), left to be read."""
        while len(self._out) < size and not self._done:
            self._more()
        return self._out[:size]

    def readinto(self, buffer: Any) -> int:
        while not self._out and not self._done:
            self._more()
        if not self._out and self._error is not None:
            raise self._error
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _say(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _bad_input(detail: str, url: str | None = None) -> Rejected:
    page_id = derive_page_id(url) if url else None
    return Rejected(Reason.BAD_INPUT, detail, page_id=page_id, url=url)


def _jsonl_pages(
    stream: _Lines, name: str, max_bytes: int, skip: Skip | None, reading: Reading
) -> Iterator[RawPage | Rejected]:
    limit = max_line_bytes(max_bytes)
    lineno = 0
    first = True
    while True:
        try:
            line = stream.readline(limit + 1)
            if len(line) > limit and not line.endswith(b"\n"):
                # Rejected from its head by parse_raw; the rest is read past, never held.
                _skip_rest_of_line(stream, limit)
        except STREAM_ERRORS as exc:
            detail = f"{name}:{lineno + 1}: stream broken, rest of file skipped: {_say(exc)}"
            yield _bad_input(detail)
            return
        if not line:
            return
        lineno += 1
        if lineno == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]  # RFC 8259 lets a parser ignore one; editors add it
        if not line.strip():
            continue
        loaded = load_line(line, max_bytes)
        if first and isinstance(loaded, Rejected) and loaded.reason is Reason.BAD_JSON:
            reading.hints.append(not_jsonl(name, line))
        first = False
        if skip is not None and not isinstance(loaded, Rejected):
            # before the body is checked and decoded (base64), and before the page is sent
            # to be analysed: for a page decided before, only reading the line is left
            ids = ids_of(loaded)
            if ids is not None and skip(*ids):
                continue
        result = loaded if isinstance(loaded, Rejected) else parse_loaded(loaded, max_bytes)
        if isinstance(result, Rejected):
            result = dataclasses.replace(result, detail=f"{name}:{lineno}: {result.detail}")
        yield result


def _skip_rest_of_line(stream: _Lines, chunk: int) -> None:
    while True:
        piece = stream.readline(chunk)
        if not piece or piece.endswith(b"\n"):
            return


class _Watched:
    """A stream that keeps the error it raised: warcio takes an EOFError from its stream,
    which is what a truncated gzip file raises, for the end of the file."""

    def __init__(self, stream: io.BufferedReader) -> None:
        self._stream = stream
        self._offset = 0
        self.error: Exception | None = None

    def read(self, size: int = -1, /) -> bytes:
        try:
            # read1: a read that filled its buffer from several raw reads, the last raising
            # (a truncated gzip file), would lose the bytes before the error
            data = self._stream.read1(size)
        except STREAM_ERRORS as exc:
            self.error = exc
            raise
        self._offset += len(data)
        return data

    def tell(self) -> int:
        return self._offset


class _HeaderLines:
    """Bounds the lines warcio reads between records and in a record's WARC headers: it
    reads them with no limit, 16 KiB more at a time, each time copying what it has (found
    by a review of hostile input: one 32 MB line cost 11 s of CPU and 121 MB). The reads of
    a record's block pass a limit and are left alone.

    A line is put together here from reads of at most 16 KiB: warcio's readline with a
    limit takes the length of all it has read off the limit after each 16 KiB, so a long
    line comes back cut, well short of the limit and without its line break."""

    def __init__(self, reader: Any) -> None:
        self._readline = reader.readline
        # warcio builds its reader inside ArchiveIterator and gives no way to pass one in
        reader.readline = self.readline
        self._read = 0
        self.first: bytes | None = None  # the first line read that is not blank
        self.blank = True  # nothing but blank lines read since ``restart``

    def restart(self) -> None:
        """Before the next record is looked for."""
        self._read = 0
        self.first = None
        self.blank = True

    def readline(self, size: int | None = None) -> bytes:
        if size is not None and size >= 0:
            return cast(bytes, self._readline(size))
        line = self._piece()
        if line and not line.endswith(b"\n"):
            pieces = [line]
            while pieces[-1] and not pieces[-1].endswith(b"\n"):
                pieces.append(self._piece())
            line = b"".join(pieces)
        if self.first is None and line.strip():
            self.first = line
        return line

    def _piece(self) -> bytes:
        piece = cast(bytes, self._readline(_LINE_PIECE))
        self._read += len(piece)
        self.blank = self.blank and not piece.strip()
        if self._read > _WARC_HEADER_BYTES:
            raise ValueError(f"WARC headers over {_WARC_HEADER_BYTES} bytes")
        return piece


def _starts_record(line: bytes | None) -> bool:
    """Whether ``line``, the first that is not blank after a record, is where a WARC record
    starts (warcio may still fail to read it, its version damaged), or would be but for
    the end of the file inside it: either way the record before ends where it says."""
    if line is None:
        return False
    head = line.upper()  # as warcio compares
    return head.startswith(_WARC_MAGIC) or (
        not line.endswith(b"\n") and _WARC_MAGIC.startswith(head)
    )


class _Block:
    """A record's block as it is read, watched for WARC records inside it that end where
    it ends, but for part of the blank lines after them: what a Content-Length too long by
    one or more whole records gives (found by a review of hostile input: a page held the
    whole record after it, and nothing was rejected).

    Not any ``\\r\\n\\r\\nWARC/1.`` in a block: a page about WARC may quote a record,
    and a WARC fetched over HTTP is full of them. That a record found inside ends exactly
    where the block ends, short of the blank lines after it, is what a wrong length does;
    a WARC file ends with those blank lines, so a block that holds one does not match.
    """

    def __init__(self, raw: Any, length: int) -> None:
        self._raw = raw
        self._length = length
        self._seen = 0
        self._carry = b""  # the last bytes seen, where a record start may begin
        # From a record start whose headers have not ended yet, if any; then the bytes
        # after it that were seen, and where in them to look for the end of the headers.
        self._buf: bytearray | None = None
        self._buf_at = 0  # where _buf is in the block
        self._blank_from = 0
        # where records inside end, if near the block's end: at most four places, however
        # many records point there (a set: found by a review, a list grew with the block)
        self._ends: set[int] = set()

    @property
    def limit(self) -> int:
        """Bytes of the block still to read, the file permitting."""
        return int(getattr(self._raw, "limit", 0))

    def read(self, size: int) -> bytes:
        data: bytes = self._raw.read(size)
        self._see(data)
        return data

    def readline(self, size: int) -> bytes:
        line: bytes = self._raw.readline(size)
        self._see(line)
        return line

    def holds_record(self) -> bool:
        """Whether the block, read whole, ends with a WARC record (short of the blank
        lines after it)."""
        if self._seen != self._length:
            return False
        tail = self._carry if self._buf is None else bytes(self._buf[-3:])
        return any(
            tail[len(tail) - (self._length - end) :] == _SEPARATOR[: self._length - end]
            for end in self._ends
        )

    def _see(self, data: bytes) -> None:
        self._seen += len(data)
        if self._buf is None:
            joined = self._carry + data
            at = joined.find(_RECORD_START)
            if at < 0:
                self._carry = joined[1 - len(_RECORD_START) :]
                return
            self._buf, self._buf_at = bytearray(joined[at:]), self._seen - len(joined) + at
            self._blank_from = 0
        else:
            self._buf += data
        self._read_starts(self._buf)

    def _read_starts(self, buf: bytearray) -> None:
        """The record starts in ``buf``, which begins with one."""
        at = 0
        while True:
            end = buf.find(_SEPARATOR, max(at + len(_SEPARATOR), self._blank_from))
            if end < 0 and len(buf) - at <= _WARC_HEADER_BYTES:
                # its headers may end in what is read next
                self._blank_from = max(at, len(buf) - len(_SEPARATOR) + 1)
                break
            if 0 <= end - at <= _WARC_HEADER_BYTES:
                self._found(buf, at + len(_SEPARATOR), end)
            at = buf.find(_RECORD_START, at + 1)
            if at < 0:
                self._carry, self._buf = bytes(buf[1 - len(_RECORD_START) :]), None
                return
            self._blank_from = 0
        del buf[:at]
        self._buf_at += at
        self._blank_from -= at

    def _found(self, buf: bytearray, start: int, end: int) -> None:
        """The WARC headers in ``buf[start:end]``, of a record whose block is after them."""
        if not buf.startswith(_WARC_VERSIONS, start):
            return
        length = _CONTENT_LENGTH.search(buf, start, end)
        if length is not None:
            block_end = self._buf_at + end + len(_SEPARATOR) + int(length[1])
            if 0 <= self._length - block_end < len(_SEPARATOR):
                self._ends.add(block_end)


def _warc_pages(
    stream: io.BufferedReader, name: str, max_bytes: int
) -> Iterator[RawPage | Rejected]:
    """The pages of a WARC's records, in order; ``stream`` is gunzipped already."""
    from warcio.archiveiterator import ArchiveIterator  # only for WARC input

    # A .warc.gz reaches warcio inflated (by _Inflater), gzipped per record or whole: warcio
    # missed a gzip member cut inside its headers and took the EOFError of a file cut
    # elsewhere for its end, and it refused a WARC gzipped whole (found by a review of
    # hostile input: a whole-file .warc.gz cut to 2/3 gave 0 pages and 0 rejects).
    source = _Watched(stream)
    # no_record_parse: warcio's own parsing of a record's HTTP headers fails on a request
    # record without WARC-Target-URI, and that lost the rest of the file (found by a review
    # of hostile input). Pages are found, and their headers parsed, by _page_from_record.
    archive = ArchiveIterator(source, no_record_parse=True)
    lines = _HeaderLines(archive.reader)
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
            yield _bad_input(f"{name}: WARC record {number - 1}: {_MISFRAMED}", _url_of(held))
        elif held is not None and (
            failure is None
            or source.error is not None
            or lines.blank  # only blank lines after it, too many of them: its end is sure
            or _starts_record(lines.first)
        ):
            yield held
        elif held is not None:
            # Blank lines, then no WARC record: a Content-Length too long by some lines put
            # the next record's headers in this block (found by a review of hostile input).
            # A file cut short is not that, and is said next.
            yield _bad_input(f"{name}: WARC record {number - 1}: {_UNCONFIRMED}", held.url)
        held = None
        if source.error is not None:
            yield _broken(name, number, source.error)
            return
        if failure is not None:
            yield _bad_input(f"{name}: WARC record {number}: {_say(failure)}; rest of file skipped")
            return
        if record is None:
            return
        url = _target_uri(record)
        length = _content_length(record)
        if length is None:
            # warcio then reads the rest of the file as this record's block: a page made of
            # the records after it (found by a review of hostile input). Where the next
            # record starts cannot be told without guessing.
            why = _unframed(record, archive.reader)
            if source.error is not None:
                yield _broken(name, number, source.error)
            else:
                yield _bad_input(f"{name}: WARC record {number}: {why}; rest of file skipped", url)
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
    block = record.raw_stream = _Block(record.raw_stream, length)
    try:
        page = _page_from_record(record, url, max_bytes)
    # A record whose payload cannot be read (bad chunking, bad Content-Encoding) is
    # dead-lettered; the iterator skips to the next record by the WARC's own length.
    except Exception as exc:
        page = _bad_input(_say(exc), url)
    try:
        # Of every record, not only of pages: a file cut inside a request record lost
        # nothing but that record, yet it is a truncated file (found by a review of
        # hostile input; the end of that record was past the end of the file).
        missing = _bytes_missing(record)
    except STREAM_ERRORS:
        missing = 0  # the stream broke: the caller says so
    where = url if record.rec_type in _PAGE_RECORDS else None
    if missing:
        detail = f"{record.rec_type} record truncated: {missing} of {record.length} bytes"
        return _bad_input(f"{detail} missing (file cut short)", where)
    if block.holds_record():
        return _bad_input(_SWALLOWED, where)
    return page


def _next_record(records: Iterator[Any], lines: _HeaderLines) -> tuple[Any, Exception | None]:
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
    detail = f"WARC record {number}: {what}, rest of file skipped: {_say(error)}"
    return _bad_input(f"{name}: {detail}")


def _url_of(page: RawPage | None) -> str | None:
    return page.url if page is not None else None


def _content_length(record: Any) -> int | None:
    """The record's Content-Length, None if it has none that is a number of bytes."""
    value = record.rec_headers.get_header("Content-Length")
    text = value.strip() if isinstance(value, str) else ""
    # 19 digits at most: int() refuses over 4,300, and no file is longer (found by a review)
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
        http = _http_headers(record.raw_stream)
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
        return _bad_input(f"{record.rec_type} record without WARC-Target-URI")
    fetched_at = record.rec_headers.get_header("WARC-Date")
    if not fetched_at:
        return _bad_input(f"{record.rec_type} record without WARC-Date", url)
    # One byte past the limit is read: it bounds what a compression bomb can cost.
    body = _payload(record.raw_stream, http, max_bytes + 1)
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


class _HeadOf:
    """The start of a block, for warcio's header parser: it reads lines of any length, and
    a block of a gigabyte without a line break would be held whole."""

    def __init__(self, block: Any, size: int) -> None:
        self._block = block
        self._left = size

    def readline(self, size: int = -1, /) -> bytes:
        if self._left <= 0:
            raise ValueError(f"HTTP headers over {_HTTP_HEADER_BYTES} bytes")
        line: bytes = self._block.readline(self._left)
        self._left -= len(line)
        return line


def _http_headers(block: Any) -> Any:
    """The status line and headers at the start of a response record's block."""
    from warcio.statusandheaders import StatusAndHeadersParser

    parser = StatusAndHeadersParser(["HTTP/1.0", "HTTP/1.1"], verify=False)
    return parser.parse(_HeadOf(block, _HTTP_HEADER_BYTES))


def _payload(block: Any, http: Any, size: int) -> bytes:
    """At most ``size`` bytes of the payload after a block's HTTP headers (``http``, None
    for a resource record), chunking and content coding undone.

    Not warcio's content_stream: its brotli decoder fails on every body (warcio 1.8.1 sets
    an attribute that brotli's Decompressor refuses; found by a review of hostile input),
    and it decodes a whole 16 KiB block at once, whatever that inflates to.
    """
    if http is None:
        return _read_at_most(block, size)
    if str(http.get_header("Transfer-Encoding") or "").strip().lower() == "chunked":
        block = _Dechunked(block)
    coding = str(http.get_header("Content-Encoding") or "").strip().lower()
    return _decoded(block, coding, size)


_CHUNK_LINE = 1024  # a chunk-size line with its extensions; real ones are a few bytes
_CHUNK_READ = 64 * 1024  # chunk bytes read at a time; a chunk up to this size is held whole
_CHUNK_MAX = 1 << 31  # warcio's bound: a bigger size is not a chunk size
# A trailer field (RFC 9110 5.1: a token, then a colon) after the last chunk.
_TRAILER_FIELD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:")


class _Dechunked:
    """A chunked body (RFC 9112 7.1) undone as it is read: warcio's ChunkedDataReader
    reads a whole chunk, up to 2 GiB, before it hands any of it on (found by a review of
    hostile input: a 915 KB .warc.gz holding one 200 MB chunk cost 472 MB).

    warcio's lenient rule is kept: a body that turns out not to be chunked (a line where a
    chunk size should be that is not one, a chunk not followed by CRLF) is read on as it is
    from there, for crawlers store bodies dechunked under the original header; a body cut
    inside a chunk gives what it has. Where the results differ from warcio's, warcio is at
    fault: it takes trailers for body, a size line with over 60 bytes of extensions for no
    size line, and it drops the two bytes read where a CRLF should have been. One difference
    is the price of the bound: a chunk over 64 KiB not followed by CRLF has been handed on
    by then, so its size line is not put back.
    """

    def __init__(self, block: Any) -> None:
        self._block = block
        self._out = b""  # body bytes read and not yet handed on
        self._left = 0  # bytes of a chunk bigger than _CHUNK_READ still to read
        self._as_is = False  # not chunked after all: the rest is the body
        self._ended = False
        self._first = True  # no chunk read yet

    def read(self, size: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < size:
            if not self._out:
                self._refill()
                if not self._out:
                    break
            piece, self._out = self._out[: size - got], self._out[size - got :]
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

    def _refill(self) -> None:
        """The next bytes of the body into ``_out``, left empty at the body's end."""
        while not self._out and not self._ended:
            if self._as_is or self._left:
                room = self._left or _CHUNK_READ
                self._out = self._block.read(min(room, _CHUNK_READ))
                if not self._out:
                    self._ended = True  # in a chunk: a body cut short gives what it has
                elif self._left:
                    self._left -= len(self._out)
                    if not self._left:
                        self._end_of_chunk(b"")
            else:
                self._next_chunk()

    def _next_chunk(self) -> None:
        first, self._first = self._first, False
        line = self._block.readline(_CHUNK_LINE)
        size = _chunk_size(line)
        if size is None:
            self._out, self._as_is = line, True  # b"" at the end of the block: the end
        elif size == 0:
            after = self._block.readline(_CHUNK_LINE)
            if after in (b"", b"\r\n") or _TRAILER_FIELD.match(after):
                self._ended = True  # trailers are not body; the rest of the block is skipped
            else:
                self._out, self._as_is = line + after, True
        elif size > _CHUNK_READ:
            # Handed on as it is read, so the size line can no longer be put back if no
            # CRLF follows: a body that is not chunked is not likely to start so.
            self._left = size
        else:
            # Held whole until its CRLF is seen, so that a body that is not chunked but
            # starts with a line like "cafe" is read as it is, size line and all.
            data = _read_at_most(self._block, size)
            if len(data) < size:
                # The first chunk shorter than its size line says is a body stored
                # dechunked that starts with a word like "cafe": its line is kept (found by
                # a review). A later one is a body cut short inside a chunk.
                self._out, self._ended = (line + data if first else data), True
            else:
                self._out = data
                self._end_of_chunk(line)

    def _end_of_chunk(self, line: bytes) -> None:
        """Checks the CRLF after a chunk whose data is in ``_out``, ``line`` its size line
        if it was held."""
        crlf = _read_at_most(self._block, 2)
        if crlf != b"\r\n":
            self._out, self._as_is = line + self._out + crlf, True


def _chunk_size(line: bytes) -> int | None:
    """The size a chunk-size line gives, as warcio reads it; None if it gives none."""
    if not line.endswith(b"\r\n"):
        return None
    try:
        size = int(line[:-2].split(b";", 1)[0], 16)
    except ValueError:
        return None
    return size if 0 <= size <= _CHUNK_MAX else None


class _Undo(Protocol):
    """One content coding being undone, a step at a time."""

    def step(self, data: bytes, room: int) -> tuple[bytes, bytes]:
        """At most ``room`` bytes decoded from ``data``, and the input left over; raises
        ValueError on data that is not in the coding."""
        ...

    def done(self) -> bool:
        """Whether the coded stream has ended."""
        ...


class _Inflate:
    def __init__(self, wbits: int) -> None:
        self._inflate = zlib.decompressobj(wbits)

    def step(self, data: bytes, room: int) -> tuple[bytes, bytes]:
        try:
            out = self._inflate.decompress(data, room)
        except zlib.error as exc:
            raise ValueError(str(exc)) from exc
        return out, self._inflate.unconsumed_tail

    def done(self) -> bool:
        return self._inflate.eof


class _Unbrotli:
    def __init__(self) -> None:
        import brotli  # only for a WARC response coded br

        self._error: type[Exception] = brotli.error
        self._brotli = brotli.Decompressor()

    def step(self, data: bytes, room: int) -> tuple[bytes, bytes]:
        try:
            # brotli takes no input while output over a limit is still to come
            if self._brotli.can_accept_more_data():
                return self._brotli.process(data, output_buffer_limit=room), b""
            return self._brotli.process(b"", output_buffer_limit=room), data
        except self._error as exc:
            raise ValueError(str(exc)) from exc

    def done(self) -> bool:
        return bool(self._brotli.is_finished())


# Each coding's decoders, tried in turn on a body's first block: "deflate" is meant to be
# zlib-wrapped, but servers send raw deflate too.
_CODINGS: dict[str, tuple[Callable[[], _Undo], ...]] = {
    "gzip": (functools.partial(_Inflate, _GZIP_WBITS),),
    "x-gzip": (functools.partial(_Inflate, _GZIP_WBITS),),
    "deflate": (functools.partial(_Inflate, zlib.MAX_WBITS), functools.partial(_Inflate, -15)),
    "br": (_Unbrotli,),
}
_CODED_BLOCK = 64 * 1024  # coded bytes a step
# A body whose first bytes do not decode is not in the coding; one that fails further on
# is damaged. (Any header is a few bytes; zlib keeps no output of a step that fails.)
_CODED_START = 512


def _decoded(stream: Any, coding: str, size: int) -> bytes:
    """At most ``size`` bytes of a body with its Content-Encoding undone.

    As warcio does: a body that does not start in the coding named is taken as it is (some
    crawlers store the decoded body under the original header), and a coding not known
    here is left for the decode stage to judge. A coded body that ends early gives what it
    decoded to, as a body cut at a crawler's size limit does; one that is damaged further
    on, or ends before any of it decodes, raises ValueError.
    """
    first = stream.read(_CODED_BLOCK) if coding in _CODINGS else b""
    for make in _CODINGS.get(coding, ()):
        undo = make()
        try:
            out, left = undo.step(first[:_CODED_START], size)
        except ValueError:
            continue  # its start is not in this coding
        parts, got, data = [out], len(out), left + first[_CODED_START:]
        while got < size:
            if not data:
                data = b"" if undo.done() else stream.read(_CODED_BLOCK)
                if not data:
                    break
            try:
                out, data = undo.step(data, size - got)
            except ValueError as exc:
                raise ValueError(f"{coding} body damaged after {got} bytes: {exc}") from exc
            parts.append(out)
            got += len(out)
        if not got and first and not undo.done():
            raise ValueError(f"{coding} body ends before any of it decodes")
        return b"".join(parts)[:size]
    return (first + _read_at_most(stream, max(0, size - len(first))))[:size]


def _bytes_missing(record: Any) -> int:
    """How many bytes of the record's declared Content-Length the file does not have."""
    raw = record.raw_stream
    while raw.read(64 * 1024):  # what follows the payload (chunk trailers, padding)
        pass
    return int(getattr(raw, "limit", 0))


def _read_at_most(stream: Any, size: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < size:
        chunk = stream.read(size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
