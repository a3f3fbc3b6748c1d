"""Undo records: a killed worker keeps its local tables instead of restoring them whole.

A worker writes a step's table records to its local RocksDB at once, and hands them to
the changelog's producer when the step flushes. Killed in between (SIGKILL, the OOM
killer), its local tables may hold writes that never reached the changelog: writes no
other worker would see, so the tables cannot be trusted as they are. Restoring them from
the changelogs is always right, and takes minutes per hundred thousand pages.

Instead, every local write batch carries, in the same atomic RocksDB batch, an undo
record: each key's value before the batch, and the changelog offset Faust had
persisted for the partition then (``P``, the last offset known to be in the changelog).
When the changelog has every record of a flush, its undo records are deleted. At the
next start, before Faust opens the tables, ``revert`` undoes the writes of every undo
record left, newest first, and sets the partition's persisted offset back to the
smallest ``P`` among them. Faust's recovery then reads the changelog from there, so every
record that did reach the changelog is applied again, in its order, and nothing that
did not reach it survives: the tables end as the changelog has them, exactly what a
full restore gives, after reading only its tail.

Why that is exact: the writes left in the table after the undo are those of batches
whose undo records were deleted, all of them in the changelog; those after ``P`` are
applied again by the recovery, in changelog order, with everything else after ``P``.
A key not written after ``P`` keeps the value it had at ``P``.

That needs the changelog's tail after ``P`` whole, its deletions (tombstones) included,
and a compacted topic drops a tombstone ``delete.retention.ms`` after it compacts it: a
database last caught up longer ago than half that is removed before anything else, and
restored whole (``neardup.kafka.freshness``).
"""

from __future__ import annotations

import itertools
import logging
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("neardup.kafka")

#: Key prefix of the undo records: local only, never sent to a changelog, and after
#: every key of the tables (their scans stop at their own prefixes).
UNDO_PREFIX = b"\xff\xfe\x00undo"
#: Faust's key for the changelog offset a partition's database has applied
#: (``faust.stores.rocksdb.Store.offset_key``).
OFFSET_KEY = b"__faust\x00offset__"

_HEAD = struct.Struct(">q")  # the persisted offset, -1 for none
_KEY = struct.Struct(">I")
# n >= 0: the value before, n bytes, follows; -1: the key was absent; -2 - n: the value
# before was the first n bytes of the value written (an append: a bucket gaining an entry)
_VALUE = struct.Struct(">i")
_ABSENT = -1

# Undo keys sort by when they were written: this process's start, then a counter.
_START = time.time_ns()
_COUNTER = itertools.count()


def next_key() -> bytes:
    return UNDO_PREFIX + _START.to_bytes(8, "big") + next(_COUNTER).to_bytes(8, "big")


def encode(
    persisted: int | None,
    keys: Sequence[bytes],
    before: Sequence[bytes | None],
    after: Sequence[bytes | None],
) -> tuple[bytes, list[bytes]]:
    """An undo record: ``keys`` had the values ``before`` and are written ``after``; and
    the keys it records whole (absent, or their value before), which no later write needs
    to record again until the flush. A key recorded by its length only is undone by
    cutting the value it has then, so every later write to it needs its own entry."""
    out = [_HEAD.pack(-1 if persisted is None else persisted)]
    whole = []
    for key, old, new in zip(keys, before, after, strict=True):
        out.append(_KEY.pack(len(key)))
        out.append(key)
        if old is not None and new is not None and new.startswith(old):
            out.append(_VALUE.pack(-2 - len(old)))  # only its length: a few bytes, not KiBs
            continue
        whole.append(key)
        if old is None:
            out.append(_VALUE.pack(_ABSENT))
        else:
            out.append(_VALUE.pack(len(old)))
            out.append(old)
    return b"".join(out), whole


def decode(raw: bytes) -> tuple[int | None, list[tuple[bytes, bytes | int | None]]]:
    """The persisted offset, and each key with its value before: bytes, None (absent) or
    the length of the prefix of the value written that it was."""
    (persisted,) = _HEAD.unpack_from(raw)
    pos = _HEAD.size
    items: list[tuple[bytes, bytes | int | None]] = []
    while pos < len(raw):
        (klen,) = _KEY.unpack_from(raw, pos)
        pos += _KEY.size
        key = raw[pos : pos + klen]
        pos += klen
        (vlen,) = _VALUE.unpack_from(raw, pos)
        pos += _VALUE.size
        value: bytes | int | None = None
        if vlen >= 0:
            value = raw[pos : pos + vlen]
            pos += vlen
        elif vlen <= -2:
            value = -2 - vlen
        items.append((key, value))
    return (None if persisted < 0 else persisted), items


def _records(db: Any) -> list[tuple[bytes, bytes]]:
    """The undo records of one partition's database (a rocksdict ``Rdict`` in raw mode),
    oldest first."""
    records = []
    for key, value in db.items(from_key=UNDO_PREFIX):
        if not key.startswith(UNDO_PREFIX):
            break
        records.append((key, value))
    return records


def revert_db(db: Any) -> int:
    """Undo the writes of the undo records in one partition's database and set its
    persisted offset back; the records undone."""
    from rocksdict import WriteBatch

    records = _records(db)
    if not records:
        return 0
    # newest first: each key goes back a write at a time, to its value before the oldest
    restored: dict[bytes, bytes | None] = {}
    floors: list[int | None] = []
    for _, raw in reversed(records):
        persisted, items = decode(raw)
        floors.append(persisted)
        for key, value in reversed(items):
            if isinstance(value, int):  # a prefix of the value this write left
                now = restored[key] if key in restored else db.get(key)
                restored[key] = None if now is None else now[:value]
            else:
                restored[key] = value
    batch = WriteBatch(raw_mode=True)
    for key, value in restored.items():
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    for key, _ in records:
        batch.delete(key)
    if any(f is None for f in floors):
        batch.delete(OFFSET_KEY)  # read the changelog from its start
    else:
        batch.put(OFFSET_KEY, str(min(f for f in floors if f is not None)).encode())
    db.write(batch)
    return len(records)


def drop_db(db: Any) -> int:
    """Delete the undo records of one partition's database without undoing anything (after
    a clean stop every record written had reached the changelog); how many."""
    from rocksdict import WriteBatch

    records = _records(db)
    if records:
        batch = WriteBatch(raw_mode=True)
        for key, _ in records:
            batch.delete(key)
        db.write(batch)
    return len(records)


def revert(tabledir: str, *, undo: bool = True) -> tuple[int, int]:
    """``revert_db`` (or, with ``undo`` false, ``drop_db``) over every partition database
    under ``tabledir``, before Faust opens them: the databases touched and the records
    undone (or dropped)."""
    from neardup.kafka.rocksmem import open_outside

    touched = undone = 0
    root = Path(tabledir)
    if not root.is_dir():
        return 0, 0
    for path in sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith(".db")):
        # Faust's options, filter and all: opening replays the log of a worker that did not
        # close its databases (Faust never does) and flushes it into a table file
        db = open_outside(path)
        try:
            n = revert_db(db) if undo else drop_db(db)
        finally:
            db.close()
        if n:
            touched += 1
            undone += n
            if undo:
                log.info("undid %d local write batches of %s not known to be in its "
                         "changelog", n, path.name)  # fmt: skip
    return touched, undone
