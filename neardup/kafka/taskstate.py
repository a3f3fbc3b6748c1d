"""A task's state: its RocksDB store, the overlay that holds one transaction's writes, and
the restore from the task's changelog partition.

The store is never ahead of the changelog: an overlay reaches RocksDB only after its
transaction committed, in one write batch with the changelog offset reached, so a crash
between the two leaves the store behind, and ``open_store`` catches up from that offset
with committed records only. A store of another format (``neardup.flow.storeformat``)
stops the worker in one line, as no restore can help; one away from its changelog longer
than the changelog's ``delete.retention.ms`` may have missed deletions whose tombstones
compaction has since removed, so it is rebuilt.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from neardup import __version__
from neardup.flow import storeformat
from neardup.store import RocksKV, SharedMemory, StateError

log = logging.getLogger("neardup.kafka")

#: Keys under this prefix are the runtime's own; a step must not write them.
RESERVED = b"\x00delivery:"
#: The next changelog offset the store holds (decimal ASCII).
OFFSET_KEY = RESERVED + b"offset"
#: The changelog partition the store mirrors, ``topic:partition``.
SOURCE_KEY = RESERVED + b"source"
#: The format of the state (``neardup.flow.storeformat.marker``); a changelog record too,
#: so that a store restored from the changelog alone has it.
FORMAT_KEY = RESERVED + b"format"
#: The marker, while the changelog does not hold it yet: the task's next commit sends it.
UNSENT_KEY = RESERVED + b"format-unsent"
#: When the store last held everything its changelog held (Unix seconds, decimal ASCII).
SYNCED_KEY = RESERVED + b"synced-at"
#: Changelog records applied in one RocksDB write batch while restoring.
RESTORE_BATCH = 5000


class Overlay:
    """The task's key-value view during one transaction: reads see this transaction's
    writes, then the store; writes wait here until the runtime commits them.

    It has the methods of ``neardup.store.KV``, so the engine's state objects run over
    it. A prefix delete takes effect at once, for the keys the store and the overlay hold
    at that moment: each becomes a tombstone, which is what the changelog needs."""

    def __init__(self, store: RocksKV, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        (unsent,) = store.get_many([UNSENT_KEY])
        #: Writes that an abort keeps: the format marker, until a commit has sent it.
        self.keep: dict[bytes, bytes | None] = {} if unsent is None else {FORMAT_KEY: unsent}
        self.dirty: dict[bytes, bytes | None] = dict(self.keep)
        #: Bytes put since the last commit (overwrites counted again): the commit size cap.
        self.nbytes = 0

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        dirty = self.dirty
        if not dirty:
            return self.store.get_many(keys)
        out: list[bytes | None] = []
        misses: list[int] = []
        for i, k in enumerate(keys):
            if k in dirty:
                out.append(dirty[k])
            else:
                out.append(None)
                misses.append(i)
        if misses:
            found = self.store.get_many([keys[i] for i in misses])
            for i, v in zip(misses, found, strict=True):
                out[i] = v
        return out

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        dirty = self.dirty
        n = 0
        for k, v in items:
            dirty[k] = v
            n += len(k) + len(v)
        self.nbytes += n

    def delete_many(self, keys: Iterable[bytes]) -> None:
        dirty = self.dirty
        for k in keys:
            dirty[k] = None
            self.nbytes += len(k)

    def delete_prefix(self, prefix: bytes) -> None:
        keys = [k for k, _ in self.store.scan(prefix) if not k.startswith(RESERVED)]
        keys += [k for k in self.dirty if k.startswith(prefix)]
        self.delete_many(keys)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The keys under ``prefix`` with their values, in key order: this transaction's
        writes over the store's. The store is read as the caller goes (a caller that stops
        early reads no further), this transaction's writes as they were when it began."""
        mine = sorted(
            (k, v)
            for k, v in self.dirty.items()
            if k.startswith(prefix) and not k.startswith(RESERVED)
        )
        stored = ((k, v) for k, v in self.store.scan(prefix) if not k.startswith(RESERVED))
        cur = next(stored, None)
        for k, v in mine:
            while cur is not None and cur[0] < k:
                yield cur
                cur = next(stored, None)
            if cur is not None and cur[0] == k:
                cur = next(stored, None)
            if v is not None:
                yield k, v
        while cur is not None:
            yield cur
            cur = next(stored, None)

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        for prefix in prefixes:
            self.delete_prefix(prefix)
        for k, v in records:
            if v is None:
                self.delete_many([k])
            else:
                self.put_many([(k, v)])

    def drop(self) -> None:
        """Forget this transaction's writes (it was aborted)."""
        self.dirty = dict(self.keep)
        self.nbytes = 0

    def flush(self, next_offset: int | None) -> None:
        """Write this transaction's writes to the store in one batch, with the changelog
        offset after its records (None: it wrote none).

        The transaction committed, so no other owner has written the changelog since this
        task's last commit: the store holds all of it, as of now (``SYNCED_KEY``)."""
        records = list(self.dirty.items())
        if next_offset is not None:
            records.append((OFFSET_KEY, str(next_offset).encode()))
            if self.keep:  # the marker went with this commit's changelog records
                records.append((UNSENT_KEY, None))
                self.keep = {}
        records.append((SYNCED_KEY, _stamp(self.clock())))
        self.store.write(records)
        self.drop()

    def close(self) -> None:
        """The store is the runtime's to close."""


def stored_offset(store: RocksKV) -> tuple[str | None, int]:
    """The changelog partition the store mirrors (None: a new store) and the next
    changelog offset it holds."""
    source, offset = store.get_many([SOURCE_KEY, OFFSET_KEY])
    return (None if source is None else source.decode()), int(offset or 0)


def items(store: RocksKV) -> Iterator[tuple[bytes, bytes]]:
    """The step's items in the store, without the runtime's own keys."""
    for key, value in store.scan(b""):
        if not key.startswith(RESERVED):
            yield key, value


class StateFormatError(StateError):
    """A task's state is of a format this version does not read."""


async def open_store(
    path: str,
    changelog: Any,
    reader: Any,
    *,
    delete_retention_ms: int | None = None,
    memory: SharedMemory | None = None,
    clock: Callable[[], float] = time.time,
) -> RocksKV:
    """The task's store at ``path``, caught up with its ``changelog`` TopicPartition, or
    rebuilt if its offset lies outside the changelog (the topics were made again) or it is
    older than ``delete_retention_ms`` (None: not known); ``StateFormatError`` for state of
    another format. ``reader``: a started read_committed AIOKafkaConsumer with no group,
    used by nothing else meanwhile; the task's producer must have started first (which
    ends what a previous owner left open, so the end offset read here is final).
    ``memory``: the worker's, shared by its task stores (None: the store's own)."""
    name = f"{changelog.topic}:{changelog.partition}"
    begin = (await reader.beginning_offsets([changelog]))[changelog]
    # a record past the end read next is written after this: the store, caught up to that
    # end, is in step with the changelog as of now
    now = clock()
    end = (await reader.end_offsets([changelog]))[changelog]
    store = RocksKV(path, shared=memory)
    source, offset = stored_offset(store)
    fresh = source is None and offset == 0 and next(items(store), None) is None
    why = None
    if not fresh and (source != name or not begin <= offset <= end):
        why = f"does not fit changelog {name} [{begin}, {end})"
    elif not fresh and delete_retention_ms is not None:
        why = _too_old(store, now, delete_retention_ms)
    if why is not None:
        log.warning(
            "state at %s (changelog %s, offset %d) %s: rebuilding it from the changelog",
            path,
            source,
            offset,
            why,
        )
        store.close()
        shutil.rmtree(path)
        store = RocksKV(path, shared=memory)
        offset = 0
    try:
        _check_format(store, path, name)
        store.write([(SOURCE_KEY, name.encode())])
        await _catch_up(store, changelog, reader, max(offset, begin), end)
        _check_format(store, path, name)
        if store.get_many([FORMAT_KEY]) == [None]:  # a new state: its first commit says
            marker = storeformat.marker()
            store.write([(FORMAT_KEY, marker), (UNSENT_KEY, marker)])
        store.write([(SYNCED_KEY, _stamp(now))])
    except BaseException:
        store.close()
        raise
    return store


def _stamp(t: float) -> bytes:
    return f"{t:.3f}".encode()


def _too_old(store: RocksKV, now: float, delete_retention_ms: int) -> str | None:
    """Why the store may have missed deletions, if it may: it was last in step with its
    changelog longer ago than the changelog keeps tombstones."""
    (raw,) = store.get_many([SYNCED_KEY])
    if raw is None:  # a restore cut short: in step with nothing yet
        return "was never caught up with its changelog"
    age = now - float(raw)
    if age * 1000 < delete_retention_ms:
        return None
    return (
        f"was last caught up with its changelog {age:.0f} s ago, longer than the "
        f"changelog's delete.retention.ms ({delete_retention_ms / 1000:.0f} s): it may "
        "have missed deletions"
    )


def _check_format(store: RocksKV, path: str, changelog: str) -> None:
    """Refuse state of another format; a store with no marker and nothing in it is new."""
    (raw,) = store.get_many([FORMAT_KEY])
    if raw is None and next(items(store), None) is None:
        return
    found = None if raw is None else storeformat.read_marker(raw)
    if found is not None and storeformat.fits(found):
        return
    raise StateFormatError(
        f"the task store {path} (changelog {changelog}) holds state of "
        f"{storeformat.describe(found)}; this neardup ({__version__}) keeps "
        f"{storeformat.describe(storeformat.current())}. Run the version that wrote it, "
        "or start this one with a new NEARDUP_APP_ID and an empty NEARDUP_STATE_DIR "
        "(new topics and state; it decides the raw topic again from its start; "
        "docs/kafka.md, Upgrading)"
    )


async def _catch_up(store: RocksKV, tp: Any, reader: Any, start: int, end: int) -> None:
    """Apply the committed changelog records in [start, end) to ``store``."""
    if start >= end:
        return
    reader.assign([tp])
    reader.seek(tp, start)
    pending: dict[bytes, bytes | None] = {}
    applied = start
    while (position := await reader.position(tp)) < end:
        # short: a fetch of markers only moves the position but ends no wait
        fetched = await reader.getmany(tp, timeout_ms=100, max_records=RESTORE_BATCH)
        for record in fetched.get(tp, ()):
            if record.offset < end:
                pending[record.key] = record.value
        position = await reader.position(tp)
        if len(pending) >= RESTORE_BATCH or position >= end:
            applied = min(position, end)
            store.write([*pending.items(), (OFFSET_KEY, str(applied).encode())])
            pending = {}
    if applied < end:  # the last records were markers only
        store.write([(OFFSET_KEY, str(end).encode())])
    reader.unsubscribe()
