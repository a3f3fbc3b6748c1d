"""The page in a WARC response record's block: its HTTP status line and headers, then the
payload with chunked transfer and the gzip, deflate and br content codings undone, at
most ``size`` bytes of it however much it inflates to.

Not warcio's readers: each holds a whole chunk or a whole decoded block, whatever its size.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from neardup.sources.streams import GZIP_WBITS

_HTTP_HEADER_BYTES = 1 << 20  # a response's status line and headers; real ones are KiBs


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


def http_headers(block: Any) -> Any:
    """The status line and headers at the start of a response record's block."""
    from warcio.statusandheaders import StatusAndHeadersParser

    parser = StatusAndHeadersParser(["HTTP/1.0", "HTTP/1.1"], verify=False)
    return parser.parse(_HeadOf(block, _HTTP_HEADER_BYTES))


def payload(block: Any, http: Any, size: int) -> bytes:
    """At most ``size`` bytes of the payload after a block's HTTP headers (``http``, None
    for a resource record), chunking and content coding undone.

    Not warcio's content_stream: its brotli decoder fails on every body (warcio 1.8.1 sets
    an attribute that brotli's Decompressor refuses), and it decodes a whole 16 KiB block
    at once, whatever that inflates to.
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
    reads a whole chunk, up to 2 GiB, before it hands any of it on (a 915 KB .warc.gz
    holding one 200 MB chunk costs it 472 MB).

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
                # dechunked that starts with a word like "cafe": its line is kept. A later
                # one is a body cut short inside a chunk.
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
    "gzip": (functools.partial(_Inflate, GZIP_WBITS),),
    "x-gzip": (functools.partial(_Inflate, GZIP_WBITS),),
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
