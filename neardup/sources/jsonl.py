"""Raw pages from JSONL lines, one page a line: a line too long is read past, never held,
and a page a resumed run decided before is skipped before its body is decoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Protocol

from neardup.contract import load_line, max_line_bytes, parse_loaded
from neardup.reading import Reading, Skip, ids_of, not_jsonl
from neardup.records import RawPage, Reason, Rejected
from neardup.sources.streams import STREAM_ERRORS, UTF8_BOM, bad_input, say


class _Lines(Protocol):
    """What a plain file, a GzipFile and stdin all offer."""

    def read(self, size: int = -1, /) -> bytes: ...
    def readline(self, size: int = -1, /) -> bytes: ...


def jsonl_pages(
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
            detail = f"{name}:{lineno + 1}: stream broken, rest of file skipped: {say(exc)}"
            yield bad_input(detail)
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
