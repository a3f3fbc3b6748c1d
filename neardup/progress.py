"""What ``neardup dedup`` and ``neardup extract`` tell a person as they run and when they end:
a progress bar on a terminal, a summary in words, and the same summary as JSON (``--stats``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from neardup.reading import Reading
from neardup.sources import STDIN

#: Seconds between two redraws of the bar: a page takes milliseconds, a redraw is not free.
REDRAW_S = 0.1


def input_bytes(paths: Sequence[str]) -> int | None:
    """The bytes the inputs hold, or None if one has no size known ahead (stdin, a pipe)."""
    total = 0
    for path in paths:
        if path == STDIN:
            return None
        try:
            info = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        total += info.st_size
    return total


class Bar:
    """A progress bar on standard error, shown only on a terminal. With inputs of known size
    it counts the bytes read (compressed bytes for a gzip file) and shows the percentage
    and time left; otherwise it counts pages."""

    def __init__(
        self,
        paths: Sequence[str],
        reading: Reading,
        *,
        show: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        """``file``: where to draw the bar, terminal or not (standard error if a terminal)."""
        self.reading = reading
        self._bar: Any = None
        self._next = 0.0
        self._by_bytes = False
        self._hints = 0  # how many of reading.hints are shown
        self._start = time.monotonic()
        out = sys.stderr if file is None else file
        if not show or (file is None and not sys.stderr.isatty()):
            return
        from tqdm import tqdm

        total = input_bytes(paths)
        if total is None:
            self._bar = tqdm(unit="page", file=out, smoothing=0.1)
        else:
            self._bar = tqdm(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, file=out, smoothing=0.1
            )
        self._by_bytes = total is not None

    def tick(self, pages: int, *, force: bool = False) -> None:
        """Show ``pages`` pages done (and the bytes read so far), at most every REDRAW_S,
        and the hints about the input found since the last call."""
        self._say_hints()
        if self._bar is None:
            return
        now = time.monotonic()
        if now < self._next and not force:
            return
        self._next = now + REDRAW_S
        done = self.reading.bytes_read() if self._by_bytes else pages
        self._bar.update(max(0, min(done, self._bar.total or done) - self._bar.n))
        if self._by_bytes:
            per_s = pages / max(now - self._start, 1e-9)
            self._bar.set_postfix_str(f"{count(pages, 'page')}, {per_s:,.0f}/s", refresh=False)
        self._bar.refresh()

    def say(self, line: str) -> None:
        """A line on standard error, above the bar if there is one."""
        if self._bar is None:
            print(line, file=sys.stderr)
        else:
            self._bar.write(line, file=sys.stderr)

    def _say_hints(self) -> None:
        while self._hints < len(self.reading.hints):
            self.say(f"neardup: hint: {self.reading.hints[self._hints]}")
            self._hints += 1

    def close(self) -> None:
        self._say_hints()
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def count(n: int, one: str, many: str | None = None) -> str:
    """``1 page``, ``2,744 pages``."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def by_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items(), key=lambda x: -x[1]))


def rejected_line(rejects: Mapping[str, int], kept_in: str | None) -> str:
    """How many pages were rejected, why, and where they went."""
    n = sum(rejects.values())
    where = f"written to {kept_in}" if kept_in else "not kept (--rejects FILE keeps them)"
    return f"{count(n, 'page')} rejected ({by_reason(rejects)}), {where}"


def rate(pages: int, seconds: float) -> str:
    per_s = pages / max(seconds, 1e-9)
    return f"{count(pages, 'page')} in {seconds:.1f} s ({per_s:,.0f} pages/s)"


def dedup_stats(
    *,
    seconds: float,
    decisions: Mapping[str, int],
    kinds: Sequence[str],
    skipped: int,
    repeated: int,
    conflicts: int,
    merges: int,
    rejects: Mapping[str, int],
    index_capped: Mapping[str, int],
    template_hosts_evicted: int,
    stage_seconds: Mapping[str, float],
) -> dict[str, Any]:
    """The summary of a ``neardup dedup`` run, as ``--stats`` writes it."""
    decided = sum(decisions.values())
    pages = decided + skipped + repeated + sum(rejects.values())
    staged = sum(stage_seconds.values()) or 1.0
    return {
        "command": "dedup",
        "pages": pages,
        "seconds": round(seconds, 3),
        "pages_per_second": round(pages / max(seconds, 1e-9), 1),
        "decided": decided,
        "decisions": {kind: decisions.get(kind, 0) for kind in kinds},
        "skipped": skipped,
        "repeated": repeated,
        "conflicts": conflicts,
        "merges": merges,
        "rejected": sum(rejects.values()),
        "rejects": dict(rejects),
        "index_capped": dict(index_capped),
        "template_hosts_evicted": template_hosts_evicted,
        "stage_share": {s: round(t / staged, 4) for s, t in stage_seconds.items()},
    }


def dedup_text(stats: Mapping[str, Any], rejects_path: str | None) -> list[str]:
    """The summary of a ``neardup dedup`` run in words, a line each."""
    kinds = ", ".join(f"{n:,} {kind}" for kind, n in stats["decisions"].items() if n)
    parts = [f"{stats['decided']:,} decided" + (f" ({kinds})" if kinds else "")]
    if stats["skipped"]:
        parts.append(f"{stats['skipped']:,} skipped")
    if stats["repeated"]:
        parts.append(f"{stats['repeated']:,} repeated")
    if stats["rejected"]:
        parts.append(f"{stats['rejected']:,} rejected")
    lines = [f"{rate(stats['pages'], stats['seconds'])}: {', '.join(parts)}"]
    if stats["skipped"]:
        lines.append(
            f"skipped: {count(stats['skipped'], 'page')} that an earlier run with this --state "
            "decided, neither analysed again nor written to --out"
        )
    if stats["repeated"]:
        other = f" ({stats['conflicts']:,} with other content)" if stats["conflicts"] else ""
        lines.append(
            f"repeated: {count(stats['repeated'], 'page id')} that came again in this run"
            f"{other}, answered with the first decision"
        )
    if stats["rejected"]:
        lines.append(rejected_line(stats["rejects"], rejects_path))
    capped = ", ".join(f"{part} {n}" for part, n in stats["index_capped"].items())
    lines.append(
        f"{count(stats['merges'], 'cluster merge')}; index entries not added, bucket full: "
        f"{capped or 'none'}; hosts idle past template_idle_days whose counts were dropped: "
        f"{stats['template_hosts_evicted']}"
    )
    if stats["decided"] or stats["rejected"]:
        shares = ", ".join(f"{s} {share:.0%}" for s, share in stats["stage_share"].items())
        lines.append(f"time by stage: {shares}")
    return lines


def extract_stats(*, seconds: float, extracted: int, rejects: Mapping[str, int]) -> dict[str, Any]:
    """The summary of a ``neardup extract`` run, as ``--stats`` writes it."""
    pages = extracted + sum(rejects.values())
    return {
        "command": "extract",
        "pages": pages,
        "seconds": round(seconds, 3),
        "pages_per_second": round(pages / max(seconds, 1e-9), 1),
        "extracted": extracted,
        "rejected": sum(rejects.values()),
        "rejects": dict(rejects),
    }


def extract_text(stats: Mapping[str, Any], rejects_path: str | None) -> list[str]:
    """The summary of a ``neardup extract`` run in words, a line each."""
    lines = [f"{rate(stats['pages'], stats['seconds'])}: {stats['extracted']:,} extracted"]
    if stats["rejected"]:
        lines.append(rejected_line(stats["rejects"], rejects_path))
    return lines


def write_stats(path: str, stats: Mapping[str, Any]) -> None:
    """``stats`` as one JSON object; '-' is standard output. Raises OSError."""
    text = json.dumps(stats, indent=2, ensure_ascii=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def report(
    stats: Mapping[str, Any],
    text: Sequence[str],
    rejects_path: str | None,
    *,
    quiet: bool,
    stats_path: str | None,
) -> None:
    """The summary on standard error (when quiet, only the line on rejected pages, which
    explains the exit status), and as JSON in ``stats_path``. Raises OSError."""
    if not quiet:
        for line in text:
            print(f"neardup: {line}", file=sys.stderr)
    elif stats["rejected"]:
        print(f"neardup: {rejected_line(stats['rejects'], rejects_path)}", file=sys.stderr)
    if stats_path is not None:
        write_stats(stats_path, stats)
