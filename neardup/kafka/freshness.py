"""Local table partitions too old to catch up from their changelogs are restored whole.

A Faust table partition's RocksDB database records the changelog offset it has applied
(its persisted offset), and when a worker opens it again, Faust reads the changelog on
from there. That is right only while the changelog still holds every record after that
offset, deletions included; a compacted topic drops a tombstone ``delete.retention.ms``
after it compacts it (a day, as the worker creates its changelogs). A database that no
worker process held for longer than that (a worker stopped over a weekend, a replica
scaled down and up again, a partition moved to another worker and back, a volume
restored from a backup) would miss those deletions. It would then keep keys the
changelog has deleted, such as pages long decided that are still pending, or still in
flight, so its table would differ from what any other worker restores.

So each database carries a stamp: a small file in its directory holding a time no
later than the first changelog record the database may still have to read.

* A database caught up with its changelog is stamped with the time then. The worker
  stamps every ``STAMP_INTERVAL_S``, while no restore is under way, the databases of its
  active partitions (it writes them), and those of its standby partitions with the
  time at which the changelog ended (asked of the broker) where their applied offset has
  reached since (``StandbyMarks``: Faust applies a standby's records in batches, so
  under steady writes a standby is seldom at the changelog's very end).
* A database about to be restored from the start is stamped when that begins: what it
  reads is in the changelog from then on (a tombstone read later was compacted after the
  values it deletes, or they would be gone too).

At start, and when a partition is newly assigned to a running worker (``faustfix``), a
database whose stamp is older than half the changelog topics' ``delete.retention.ms``
is removed, so that Faust restores it from the start. A database without a stamp (from
a build before stamps) is judged by its files' newest mtime, RocksDB rewriting its LOG
every 10 minutes while it is open; a stamp that cannot be read, or lies more than
``FUTURE_SLACK_S`` ahead, counts as infinitely old.

Why half: the deletions a database has not applied were written after its stamp, so
the broker keeps them for at least ``delete.retention.ms`` after it. Half leaves room for
a wrong clock and a slow restore. The stamp is the database's own, in its own directory:
it survives a clean stop, travels with a copied volume, and a worker that crashes again
and again during a restore does not freshen it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("neardup.kafka")

#: The stamp's file name in a partition database's directory (RocksDB leaves files whose
#: names are not its own alone).
STAMP = "NEARDUP-CAUGHT-UP"
#: How often the worker stamps the databases it holds.
STAMP_INTERVAL_S = 60.0
#: The most changelog ends remembered per standby partition (a day of ticks).
STANDBY_MARKS = 1440
#: A stamp further ahead of the clock than this is not believed.
FUTURE_SLACK_S = 3600.0
#: Suffix of a database directory being removed (renamed first, then deleted).
ASIDE = ".removing"
#: The changelogs' ``delete.retention.ms`` as the worker creates them (Kafka's default).
TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000


def max_age_s(retention_ms: float) -> float:
    """The oldest stamp still trusted, for changelogs that keep tombstones this long."""
    return retention_ms / 1000 / 2


#: The limit in force: set at start from the changelog topics' actual setting
#: (``neardup.kafka.topics.tombstone_retention_ms``).
MAX_AGE_S = max_age_s(TOMBSTONE_RETENTION_MS)


def stamp(path: Path, at: float | None = None) -> None:
    """Record that the database at ``path`` is caught up with its changelog (now, or
    ``at``): written aside and renamed, so a crash leaves the old stamp or the new one."""
    tmp = path / f"{STAMP}.tmp"
    tmp.write_text(f"{time.time() if at is None else at:.3f}\n")
    os.replace(tmp, path / STAMP)


def caught_up_at(path: Path, now: float | None = None) -> float | None:
    """When the database at ``path`` was last known to be caught up: its stamp (0.0 if
    unreadable or in the future), or for a database without one the newest mtime of its
    files; None if there is no database."""
    try:
        text = (path / STAMP).read_text()
    except FileNotFoundError:
        return _newest_mtime(path)
    except OSError:
        return 0.0
    try:
        at = float(text.split()[0])
    except (ValueError, IndexError):
        return 0.0
    limit = (time.time() if now is None else now) + FUTURE_SLACK_S
    return at if math.isfinite(at) and at <= limit else 0.0


def _newest_mtime(path: Path) -> float | None:
    """The newest mtime of the files in the directory ``path`` (None if there is no such
    directory; 0.0 if it cannot be listed). A file RocksDB deletes meanwhile is skipped."""
    if not path.is_dir():
        return None
    newest = 0.0
    try:
        for f in path.iterdir():
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, f.stat().st_mtime)
    except OSError:
        return 0.0
    return newest


def stale_age(path: Path, max_age: float | None = None, now: float | None = None) -> float | None:
    """How long ago the database at ``path`` was last caught up, if that is more than
    ``max_age`` seconds (``MAX_AGE_S``); None if it is fresh enough or absent."""
    now = time.time() if now is None else now
    at = caught_up_at(path, now)
    if at is None:
        return None
    age = now - at
    return age if age > (MAX_AGE_S if max_age is None else max_age) else None


def discard(path: Path, age: float, max_age: float | None = None) -> None:
    """Remove the database at ``path`` (no handle may be open on it), and leave an empty
    directory stamped now: Faust restores it from the start, beginning now."""
    log.warning(
        "the local table %s was last caught up with its changelog %.1f hours ago, more "
        "than %.1f hours (half the time the changelog keeps deletions): it is removed, "
        "and restored from the changelog whole",
        path.name,
        age / 3600,
        (MAX_AGE_S if max_age is None else max_age) / 3600,
    )
    aside = path.with_name(path.name + ASIDE)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)  # the name is free at once, whatever rmtree meets
    shutil.rmtree(aside)
    begin_restore(path)


def begin_restore(path: Path) -> None:
    """An empty database directory at ``path``, stamped now (``stamp``): what Faust
    restores into it from the start is in the changelog from now on."""
    path.mkdir(parents=True, exist_ok=True)
    stamp(path)


def discard_stale(tabledir: str, max_age: float | None = None) -> list[str]:
    """``discard`` every partition database under ``tabledir`` last caught up more than
    ``max_age`` seconds ago (``MAX_AGE_S``), before anything opens them: their names."""
    root = Path(tabledir)
    if not root.is_dir():
        return []
    for leftover in root.glob(f"*{ASIDE}"):  # a removal cut short
        shutil.rmtree(leftover, ignore_errors=True)
    removed = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith(".db")):
        if (age := stale_age(path, max_age)) is not None:
            discard(path, age, max_age)
            removed.append(path.name)
    return removed


class StandbyMarks:
    """Where each standby partition's changelog ended, and when: a standby is caught up
    to the time of the latest end its applied offset has reached."""

    def __init__(self) -> None:
        self._ends: dict[Any, list[tuple[int, float]]] = {}

    def caught_up_at(
        self, tp: Any, end: int | None, applied: int | None, now: float
    ) -> float | None:
        """Record that ``tp``'s changelog ends before ``end`` (its highwater, None if not
        known yet) at ``now``; the time of the latest end recorded that ``applied`` (the
        offset the standby's database has applied) has reached, or None."""
        ends = self._ends.setdefault(tp, [])
        if end is not None and (not ends or end >= ends[-1][0]):
            ends.append((end, now))
        reached = [t for e, t in ends if e == 0 or (applied is not None and applied >= e - 1)]
        # the ends only grow: those reached are the oldest, and only the latest matters
        del ends[: len(reached)]
        del ends[: max(len(ends) - STANDBY_MARKS, 0)]
        return reached[-1] if reached else None

    def keep(self, tps: Iterable[Any]) -> None:
        """Forget the partitions not in ``tps`` (no longer standbys here)."""
        wanted = set(tps)
        for tp in [tp for tp in self._ends if tp not in wanted]:
            del self._ends[tp]
