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

So each database the worker holds carries a stamp: a small file in its directory holding
the wall-clock time at which the database was last known to be caught up with its
changelog. The worker writes it every ``STAMP_INTERVAL_S`` while its restore is done.
Before a database is opened (at start, and at every assignment while the worker runs),
one whose stamp is older than half the changelog topics' ``delete.retention.ms`` is
removed, and Faust restores it from the changelog from the start. A database without a
stamp (written by a build from before stamps) is judged by its files' newest mtime;
RocksDB rewrites its LOG every 10 minutes while it is open.

Why half: a deletion the database has not applied was written after the database's
persisted offset, so after the stamp less the few seconds by which the persisted offset
trails it; the broker keeps it for at least ``delete.retention.ms`` after that. Half
leaves room for a wrong clock and a slow restore. The stamp is the database's own, in
its own directory, so it survives a clean stop and travels with a copied volume, and a
worker that crashes again and again during its restore does not freshen it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger("worker.kafka")

#: The stamp's file name in a partition database's directory (RocksDB leaves files whose
#: names are not its own alone).
STAMP = "NEARDUP-CAUGHT-UP"
#: How often the worker stamps the databases it holds.
STAMP_INTERVAL_S = 60.0
#: The changelogs' ``delete.retention.ms`` as the worker creates them (Kafka's default).
TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000


def max_age_s(retention_ms: float) -> float:
    """The oldest stamp still trusted, for changelogs that keep tombstones this long."""
    return retention_ms / 1000 / 2


#: The limit in force: set at start from the changelog topics' actual setting
#: (``worker.kafka.topics.tombstone_retention_ms``).
MAX_AGE_S = max_age_s(TOMBSTONE_RETENTION_MS)


def stamp(path: Path, at: float | None = None) -> None:
    """Record that the database at ``path`` is caught up with its changelog (now, or
    ``at``): written aside and renamed, so a crash leaves the old stamp or the new one."""
    tmp = path / f"{STAMP}.tmp"
    tmp.write_text(f"{time.time() if at is None else at:.3f}\n")
    os.replace(tmp, path / STAMP)


def caught_up_at(path: Path) -> float | None:
    """When the database at ``path`` was last known to be caught up: its stamp, or for a
    database without one the newest mtime of its files; None if there is no database."""
    with contextlib.suppress(OSError, ValueError):
        return float((path / STAMP).read_text().split()[0])
    with contextlib.suppress(OSError):
        newest = max((f.stat().st_mtime for f in path.rglob("*") if f.is_file()), default=0.0)
        return newest or None
    return None


def discard_if_stale(path: Path, max_age: float | None = None, now: float | None = None) -> bool:
    """Remove the database at ``path`` if it was last caught up more than ``max_age``
    seconds ago (``MAX_AGE_S``); whether it was removed."""
    limit = MAX_AGE_S if max_age is None else max_age
    at = caught_up_at(path)
    if at is None:
        return False
    age = (time.time() if now is None else now) - at
    if age <= limit:
        return False
    log.warning(
        "the local table %s was last caught up with its changelog %.1f hours ago, more "
        "than %.1f hours (half the time the changelog keeps deletions): it is removed, "
        "and restored from the changelog whole",
        path.name,
        age / 3600,
        limit / 3600,
    )
    shutil.rmtree(path)
    return True


def discard_stale(tabledir: str, max_age: float | None = None) -> list[str]:
    """``discard_if_stale`` for every partition database under ``tabledir``: the names of
    those removed."""
    root = Path(tabledir)
    if not root.is_dir():
        return []
    dbs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith(".db"))
    return [p.name for p in dbs if discard_if_stale(p, max_age)]
