"""Raw pages from files: JSONL (plain or gzip) and WARC (plain or gzip), in order.

The format is told by content, not by name: gzip by its magic bytes, WARC by ``WARC/`` at
the start of the (decompressed) stream; anything else is read as JSONL, a UTF-8 byte order
mark at its start skipped. A path is opened once, so it may be a pipe or a FIFO. ``-`` is
stdin, read as plain JSONL.
Broken input becomes ``Rejected`` records; a file that cannot be read on stops with one.

``iter_pages`` is here; how a file is opened and told apart is ``streams.py``, JSONL
lines are ``jsonl.py``, WARC records are ``warc.py`` (the pages they hold) and
``framing.py`` (where each record ends, checked), and the HTTP bodies of response records
are ``bodies.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

from neardup.reading import Reading, Skip
from neardup.records import RawPage, Rejected
from neardup.sources.jsonl import jsonl_pages
from neardup.sources.streams import STREAM_ERRORS, WARC_MAGIC, bad_input, open_input, say
from neardup.sources.warc import warc_pages

STDIN = "-"
_STDIN_NAME = "<stdin>"  # in details


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
    if sys.stdin is None:  # started with descriptor 0 closed (`<&-`)
        yield bad_input(f"{_STDIN_NAME}: cannot read: standard input is closed")
        return
    yield from jsonl_pages(sys.stdin.buffer, _STDIN_NAME, max_bytes, skip, reading)


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
    # A detail holding the path as given would not encode as UTF-8 (a file named
    # b"bad\xffname"), and the reject could not be written.
    name = _shown_path(path)
    try:
        stream, head = open_input(path, reading)
    except STREAM_ERRORS as exc:
        yield bad_input(f"{name}: cannot read: {say(exc)}")
        return
    with stream:
        try:
            if not head.startswith(WARC_MAGIC):
                yield from jsonl_pages(stream, name, max_bytes, skip, reading)
            elif skip is None:
                yield from warc_pages(stream, name, max_bytes)
            else:  # a record's page id is known once it is parsed
                for item in warc_pages(stream, name, max_bytes):
                    if isinstance(item, Rejected) or not skip(item.page_id, item.url):
                        yield item
        finally:
            reading.closed()
