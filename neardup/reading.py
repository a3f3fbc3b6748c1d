"""What reading the input files shows as it goes: how far it is (for a progress bar), hints
for a person about input that looks wrong, and the page id of a parsed line (for
skipping pages decided before)."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable

from neardup.contract import MAX_PAGE_ID, derive_page_id

#: ``skip(page_id, url)``: whether to leave a page out (``iter_pages``).
Skip = Callable[[str, str], bool]


class Reading:
    """How far the input files have been read, and hints about them, for whoever shows
    progress: filled in by ``iter_pages`` as it reads."""

    def __init__(self) -> None:
        self.done = 0  # bytes of the files read to their end
        self.hints: list[str] = []  # one line each, for a person: what looks wrong
        self._file: io.RawIOBase | None = None

    def bytes_read(self) -> int:
        """Bytes of the input files read so far (of a gzip file, its compressed bytes)."""
        file = self._file
        if file is None or file.closed:
            return self.done
        try:
            return self.done + file.tell()
        except OSError:  # a pipe: no position
            return self.done

    def opened(self, file: io.RawIOBase) -> None:
        self._file = file

    def closed(self) -> None:
        """The file is done with (read to its end, or left where it broke): all of it counts,
        as its size counts in the total a progress bar shows."""
        file, self._file = self._file, None
        if file is None or file.closed:
            return
        with contextlib.suppress(OSError):  # a pipe: neither a position nor a size
            self.done += max(file.tell(), os.fstat(file.fileno()).st_size)


def ids_of(obj: object) -> tuple[str, str] | None:
    """The page id and URL that ``parse_loaded`` gives ``obj``, if it has a URL."""
    if not isinstance(obj, dict):
        return None
    url, page_id = obj.get("url"), obj.get("page_id")
    if not isinstance(url, str) or not url:
        return None
    if isinstance(page_id, str) and 0 < len(page_id) <= MAX_PAGE_ID:
        return page_id, url
    return derive_page_id(url), url


def not_jsonl(name: str, line: bytes) -> str:
    """The hint for a file whose first line is no JSON: most likely not JSONL at all."""
    head = line.lstrip()[:64]
    if head.startswith(b"<"):
        looks = "it looks like HTML or XML"
    elif b"\0" in head or not _is_utf8(head):
        looks = "it looks like binary data"
    else:
        looks = f"it starts {head[:24].decode('utf-8', 'replace').rstrip()!r}"
    return (
        f"{name} is not JSONL: its first line is not JSON ({looks}). neardup reads raw-page "
        "JSONL (a JSON object a line, with url, fetched_at, content_type, and html or "
        "body_b64) or WARC, each plain or gzip; lines that are not JSON are rejected as bad_json"
    )


def _is_utf8(data: bytes) -> bool:
    for cut in range(4):  # the last character may be cut off by the slice
        try:
            data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False
