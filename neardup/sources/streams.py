"""Opening an input file: gunzipped if it is gzip, the first bytes (what tells JSONL from
WARC) read without losing them on a pipe, and what a broken stream becomes.

Apart from the readers of each format (``jsonl.py``, ``warc.py``) because both read
through it, and ``neardup.produce`` opens its input the same way.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import Any, cast

from isal import isal_zlib

from neardup.contract import derive_page_id
from neardup.reading import Reading
from neardup.records import Reason, Rejected

_GZIP_MAGIC = b"\x1f\x8b"
GZIP_WBITS = 31  # zlib's window bits for a gzip header and trailer
WARC_MAGIC = b"WARC/"
UTF8_BOM = b"\xef\xbb\xbf"
_HEAD = len(WARC_MAGIC)  # bytes that tell the format: gzip's magic, WARC's
_BUFFER = 1 << 20
# What a damaged gzip stream or file raises while being read.
# isal's stubs type its error class as an instance of Exception; it is a class.
_ISAL_ERROR = cast("type[Exception]", isal_zlib.error)
STREAM_ERRORS = (OSError, EOFError, zlib.error, _ISAL_ERROR)


def open_input(path: str, reading: Reading | None = None) -> tuple[io.BufferedReader, bytes]:
    """The file's bytes, gunzipped if they are gzip, and the first few of those (what tells
    the format), from one open: a pipe or a FIFO gives its bytes once, so a second open to
    read what the first sniffed would find `neardup dedup <(cat pages.jsonl)` empty, and a
    FIFO would hang.
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
        self._inflate = isal_zlib.decompressobj(GZIP_WBITS)
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
                self._inflate = isal_zlib.decompressobj(GZIP_WBITS)
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


def say(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def bad_input(detail: str, url: str | None = None) -> Rejected:
    page_id = derive_page_id(url) if url else None
    return Rejected(Reason.BAD_INPUT, detail, page_id=page_id, url=url)
