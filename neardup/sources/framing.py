"""Where a WARC record ends, checked: warcio trusts each record's Content-Length, and a
wrong one silently hands one record's bytes to another.

The wrappers here watch warcio's reads: ``Watched`` keeps the error a broken stream
raised, ``HeaderLines`` bounds the lines read between records, and ``Block`` notices a
block that swallowed whole records. ``warc.py`` reads them after each record.
"""

from __future__ import annotations

import io
import re
from typing import Any, cast

from neardup.sources.streams import STREAM_ERRORS, WARC_MAGIC

# A WARC record's headers, with the blank lines before them; real ones are a few KiB.
_WARC_HEADER_BYTES = 1 << 20
_LINE_PIECE = 1 << 14  # warcio's buffer size: a line is read in pieces of at most this
_WARC_VERSIONS = (b"WARC/1.1", b"WARC/1.0", b"WARC/0.17", b"WARC/0.18")  # what warcio reads
_RECORD_START = b"\r\n\r\nWARC/"  # the blank lines that end a record, and the next one
_SEPARATOR = b"\r\n\r\n"
# A Content-Length header, in WARC headers without the CRLF of their last line.
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([0-9]{1,19})[ \t]*(?:\r\n|$)", re.I)


class Watched:
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


class HeaderLines:
    """Bounds the lines warcio reads between records and in a record's WARC headers: it
    reads them with no limit, 16 KiB more at a time, each time copying what it has (one
    32 MB line costs 11 s of CPU and 121 MB). The reads of a record's block pass a limit
    and are left alone.

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


def starts_record(line: bytes | None) -> bool:
    """Whether ``line``, the first that is not blank after a record, is where a WARC record
    starts (warcio may still fail to read it, its version damaged), or would be but for
    the end of the file inside it: either way the record before ends where it says."""
    if line is None:
        return False
    head = line.upper()  # as warcio compares
    return head.startswith(WARC_MAGIC) or (not line.endswith(b"\n") and WARC_MAGIC.startswith(head))


class Block:
    """A record's block as it is read, watched for WARC records inside it that end where
    it ends, but for part of the blank lines after them: what a Content-Length too long by
    one or more whole records gives (unwatched, a page would hold the whole record after
    it, and nothing would be rejected).

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
        # many records point there (a set: a list would grow with the block)
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
