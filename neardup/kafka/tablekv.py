"""``KV`` over a Faust table whose keys and values are raw bytes.

Faust keeps one store per table partition and picks it from the event being processed,
so every call must be made while an agent handles an event of the table's source
partition (``event_context`` sets it for events taken in batches).

With the RocksDB store, reads and writes go straight to the partition's rocksdict
database (one multi-get, one write batch), and the changelog records are collected by a
``Changelog`` and sent as one Kafka batch per partition when the agent flushes. Faust's
own path costs a Kafka message, a future and a RocksDB write of the persisted offset per
key; a page writes about a hundred keys. The records are exactly what Faust would have
sent (raw key, raw value, a tombstone for a delete, to the event's partition of the
table's changelog topic), so Faust's recovery and standby replicas read them as its own,
and ``Changelog`` keeps the persisted offset Faust recovers from. With the memory store
(agent tests) every call goes through the table's own API.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, cast

from neardup.kafka import undo
from neardup.store import KV

log = logging.getLogger("neardup.kafka")

#: Bytes of one Kafka batch of changelog records (a larger single record still goes).
_BATCH_BYTES = 1 << 20
_NO_COMPRESSION = 0


#: Called with a fatal state error as it is raised. The worker process sets it (to exit
#: even if the shutdown that follows hangs: ``neardup.kafka.__main__``); nothing else does.
on_fatal: Callable[[BaseException], object] | None = None
#: Called once when the local tables come into doubt (``Changelog.failed``): the worker
#: process marks its state directory then, so that a kill that follows cannot leave them
#: trusted (``neardup.kafka.__main__``).
on_doubt: Callable[[], object] | None = None


class StateWriteError(RuntimeError):
    """A write to the local RocksDB state failed (a full disk, a file size limit, an I/O
    error): the worker cannot go on, and must stop before it publishes anything more."""


class StateInconsistentError(RuntimeError):
    """The worker's local tables contradict themselves (a bug, or a table partition
    restored from a changelog that lacked some of its local writes): the worker stops,
    and its next start restores the tables from the changelogs instead of trusting them."""


class ScanKV(KV, Protocol):
    """A ``KV`` that can also list the items under a key prefix, in key order."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


@contextmanager
def event_context(event: Any) -> Iterator[None]:
    """Make ``event`` Faust's current event while a batch of events (``take_events``) is
    handled one by one: a table picks its partition from the current event."""
    from faust.streams import _current_event

    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def _current_partition() -> int | None:
    from faust.streams import current_event

    event = current_event()
    return None if event is None else int(event.message.partition)


class Changelog:
    """Changelog records of the worker's tables, waiting to be sent in batches."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._pending: dict[tuple[Any, int], list[tuple[bytes, bytes | None]]] = {}
        #: The undo records (``neardup.kafka.undo``) of the pending records, and the keys
        #: they cover: a key written again before the flush needs no second one (its
        #: value before the first write is what an undo must restore).
        self._undo: dict[tuple[Any, int], list[bytes]] = {}
        self._covered: dict[tuple[Any, int], set[bytes]] = {}
        #: The last changelog offset known to be in the changelog, per table partition.
        self._persisted: dict[tuple[Any, int], int | None] = {}
        self._sent: list[asyncio.Future[Any]] = []
        self._failed = False
        #: Records that may not be in the changelog (a batch failed, a hand-over was cut
        #: short): nothing more is sent, their undo records stay, and the next start
        #: undoes them (see ``clean``) ...
        self.unsent = False
        #: ... and of those, records of a batch handed over: a step acknowledged after a
        #: flush that does not wait may have them, so no offset is committed (``settled``).
        self.undelivered = False
        #: One flush at a time: a partition's records reach the producer in the order
        #: they were written locally, whichever agent flushes them.
        self._flushing = asyncio.Lock()
        #: The local write that failed, if one did (what the worker stops on).
        self.error: StateWriteError | None = None

    @property
    def failed(self) -> bool:
        """A local write failed, undo records of acknowledged writes could not be
        deleted, or the tables were found inconsistent: the local tables may differ from
        their changelogs in ways undo records do not cover. (Records that did not reach
        the broker are not that: ``unsent``.)"""
        return self._failed

    @failed.setter
    def failed(self, value: bool) -> None:
        if value and not self._failed and on_doubt is not None:
            on_doubt()
        self._failed = self._failed or value

    @property
    def clean(self) -> bool:
        """Whether every record written to a local table has reached the broker (if not,
        the local tables are ahead of their changelogs, and a stop must not say it was
        clean: the next start then undoes the writes their undo records cover)."""
        return (
            not self.failed
            and not self.unsent
            and not self._pending
            and all(f.done() for f in self._sent)
        )

    def add(
        self,
        table: Any,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        undo_key: bytes | None = None,
        covers: Iterable[bytes] = (),
    ) -> None:
        """Records written locally, to send at the next flush; ``undo_key`` names the undo
        record written with them, which holds the values of ``covers`` before, whole."""
        self._pending.setdefault((table, partition), []).extend(records)
        if undo_key is not None:
            self._undo.setdefault((table, partition), []).append(undo_key)
            self._covered.setdefault((table, partition), set()).update(covers)

    def uncovered(self, table: Any, partition: int, keys: list[bytes]) -> list[bytes]:
        """Those of ``keys`` no undo record of the pending records covers yet."""
        covered = self._covered.get((table, partition), ())
        return [k for k in dict.fromkeys(keys) if k not in covered]

    def persisted(self, table: Any, partition: int) -> int | None:
        """The last offset of the partition's changelog known to hold this worker's
        records (Faust's persisted offset, then what the broker acknowledged)."""
        where = (table, partition)
        if where not in self._persisted:
            from faust.types import TP

            topic = table.changelog_topic.get_topic_name()
            self._persisted[where] = table.data.persisted_offset(TP(topic, partition))
        return self._persisted[where]

    def forget(self, table: Any, partition: int) -> None:
        """Drop the cached ``persisted`` offset of a partition whose database is opened
        again: read from the database next time, never an older one from before."""
        self._persisted.pop((table, partition), None)

    async def flush(self, *, wait: bool = True) -> None:
        """Hand the records to the producer; with ``wait``, until the broker has them all
        (what a decision published next may rely on)."""
        from aiokafka.producer.message_accumulator import (  # type: ignore[import-untyped]
            BatchBuilder,
        )

        async with self._flushing:
            # nothing more goes out after lost records: records sent after them would put a
            # later state in the changelog without the earlier one it grew from
            self._raise_if_lost()
            pending, self._pending = self._pending, {}
            undo_keys, self._undo = self._undo, {}
            self._covered = {}
            try:
                for (table, partition), records in pending.items():
                    producer = self.app.producer._producer  # Faust's aiokafka producer
                    topic = table.changelog_topic.get_topic_name()
                    sent = []
                    batch = BatchBuilder(_BATCH_BYTES, _NO_COMPRESSION)
                    for key, value in records:
                        if batch.append(timestamp=None, key=key, value=value) is None:
                            sent.append(await self._send(producer, batch, table, topic, partition))
                            batch = BatchBuilder(_BATCH_BYTES, _NO_COMPRESSION)
                            batch.append(timestamp=None, key=key, value=value)
                    sent.append(await self._send(producer, batch, table, topic, partition))
                    if done := undo_keys.get((table, partition)):
                        self._forget_when_sent(table, partition, done, sent)
            except BaseException as exc:  # cancelled at shutdown, or the producer is gone
                # the records taken from _pending and not handed over are of steps not yet
                # acknowledged (their flushes wait for this one, or are this one); their
                # undo records stay (only a partition whose batches were all handed over and
                # then acknowledged has them deleted), so the next start undoes them
                self._lost(handed_over=False, stopping=isinstance(exc, asyncio.CancelledError))
                raise
        if wait:
            # a failed batch raises: the agent stops the worker; the futures stay in
            # _sent until they are done, for ``clean`` (a shutdown may drop this task)
            # (shielded: a flush cancelled while it waits must not cancel the deliveries)
            await asyncio.gather(*map(asyncio.shield, self._sent))
        self._sent = [f for f in self._sent if not f.done()]
        self._raise_if_lost()

    def _raise_if_lost(self) -> None:
        """Raise what stops the worker if a local write failed, the tables are in doubt,
        or records may be missing from the changelog."""
        if self.error is not None:
            raise self.error
        if self.failed or self.unsent:
            raise RuntimeError("changelog records did not reach the broker")

    async def settled(self) -> bool:
        """Whether every record handed to the producer so far has reached the broker, once
        those still on their way have got there or failed. The app's consumer commits
        offsets only then (``neardup.kafka.faustfix.guard_commits``): a step's messages are
        acknowledged after its records are handed over, not after they arrive, and no
        message may be committed past while its state may be missing from the changelog."""
        if waiting := [f for f in self._sent if not f.done()]:
            await asyncio.gather(*map(asyncio.shield, waiting), return_exceptions=True)
        return not self.failed and not self.undelivered

    def _lost(self, *, handed_over: bool, stopping: bool = False) -> None:
        """Records may never reach the changelog: from now on nothing more is sent, and the
        next start undoes the writes whose undo records are left, as after a kill. A
        batch that failed also stops the commits (``settled``) and the worker, which
        exits soon whatever its shutdown does (``on_fatal``); a stop that cancelled a
        flush before it handed everything over is only a stop."""
        was_unsent, was_undelivered = self.unsent, self.undelivered
        self.unsent = True
        self.undelivered = was_undelivered or handed_over
        if stopping and not handed_over:
            if not was_unsent:
                log.warning(
                    "stopped in the middle of a changelog flush: the next start undoes the "
                    "writes not sent, and reads again the messages not committed"
                )
            return
        if was_undelivered or (was_unsent and not handed_over):
            return  # said already
        log.error(
            "changelog records did not reach the broker: the worker stops; at the next "
            "start it undoes its writes that the changelog may lack and reads again the "
            "messages not committed"
        )
        if on_fatal is not None:
            on_fatal(RuntimeError("fatal: changelog records did not reach the broker"))

    async def _send(
        self, producer: Any, batch: Any, table: Any, topic: str, p: int
    ) -> asyncio.Future[Any]:
        from faust.types import TP

        count = batch.record_count()
        future: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=p)

        def persisted(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self._lost(handed_over=True)  # its undo records stay (_forget_when_sent)
                return
            # Faust recovers a partition from the offset after this one
            offset = fut.result().offset + count - 1
            self._persisted[(table, p)] = offset
            table.data.set_persisted_offset(TP(topic, p), offset)

        future.add_done_callback(persisted)
        self._sent.append(future)
        return future

    def _forget_when_sent(
        self, table: Any, partition: int, keys: list[bytes], sent: list[asyncio.Future[Any]]
    ) -> None:
        """Once every batch of a flush for one partition has reached the changelog, delete
        the undo records of its writes (after ``persisted``). If a batch failed, they stay
        (``unsent``): the next start undoes those writes, and reads again from the
        changelog whatever of them did reach it."""
        left = [len(sent)]

        def one_done(fut: asyncio.Future[Any]) -> None:
            left[0] -= 1
            if not left[0] and not any(f.cancelled() or f.exception() for f in sent):
                self._forget(table, partition, keys)

        for fut in sent:
            fut.add_done_callback(one_done)

    def _forget(self, table: Any, partition: int, keys: list[bytes]) -> None:
        """Delete the undo records of writes the changelog now has. If the partition's
        database is closed (the worker shutting down) they stay: the next start, after a
        clean stop, drops them, and after an unclean one undoes those writes and reads
        them from the changelog again, which is slower, never wrong."""
        db = getattr(table.data, "_dbs", {}).get(partition)
        if db is None:
            return
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key)
        try:
            db.write(batch)
        except Exception as exc:  # rocksdict raises a bare Exception
            # left, they would undo acknowledged writes at the next start, perhaps after
            # the changelog has dropped the tombstones that replay needs
            log.error("undo records of %s-%d not deleted: %s", table.name, partition, exc)
            self.failed = True


class TableKV:
    """A Faust table (``schema`` raw bytes to raw bytes) as a ``ScanKV``."""

    def __init__(self, table: Any, changelog: Changelog | None = None) -> None:
        self.table = table
        self.changelog = changelog

    def _rocks(self) -> tuple[Any, int] | None:
        """The rocksdict database of the current event's partition, if the store is
        RocksDB, and the partition."""
        store = self.table.data
        if not hasattr(store, "_db_for_partition"):
            return None
        partition = _current_partition()
        if partition is None:
            return None
        return store._db_for_partition(partition), partition

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        rocks = self._rocks()
        if rocks is not None:
            return cast("list[bytes | None]", rocks[0].get(list(keys)))
        get = self.table.get
        return [get(k) for k in keys]

    def _write(self, records: list[tuple[bytes, bytes | None]]) -> bool:
        """Write through the fast path; False if there is none (memory store)."""
        rocks = self._rocks() if self.changelog is not None else None
        if rocks is None or self.changelog is None:
            return False
        from rocksdict import WriteBatch

        db, partition = rocks
        batch = WriteBatch(raw_mode=True)
        # what the changelog may not get if the worker dies before the flush: undone at the
        # next start (neardup.kafka.undo), in the same atomic batch as the writes
        keys = self.changelog.uncovered(self.table, partition, [key for key, _ in records])
        undo_key = undo.next_key() if keys else None
        if undo_key is not None:
            floor = self.changelog.persisted(self.table, partition)
            written = dict(records)
            record, keys = undo.encode(floor, keys, db.get(keys), [written[k] for k in keys])
            batch.put(undo_key, record)
        for key, value in records:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        try:
            db.write(batch)
        except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's status
            # the local tables are in doubt now: restore them from the changelog next time
            self.changelog.failed = True
            where = self.table.data.partition_path(partition)
            self.changelog.error = StateWriteError(
                f"fatal: cannot write the worker's state ({where}): {exc}. Free disk space "
                "or fix the state directory, then restart the worker: nothing is lost, the "
                "pages not yet decided are read again and their state restored from the "
                "changelog"
            )
            if on_fatal is not None:
                on_fatal(self.changelog.error)
            raise self.changelog.error from exc
        self.changelog.add(self.table, partition, records, undo_key, keys)
        return True

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.write(list(items))

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self.write([(k, None) for k in keys])

    def delete_prefix(self, prefix: bytes) -> None:
        self.write((), (prefix,))

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        """Deletes the keys under ``prefixes``, then puts (a value) and deletes (None), in
        order: in RocksDB one batch, with one undo record."""
        records = list(records)
        if prefixes:
            written = {k for k, _ in records}
            under = dict.fromkeys(k for p in prefixes for k, _ in self.scan(p) if k not in written)
            records = [(k, None) for k in under] + records
        if records and not self._write(records):
            table = self.table
            for key, value in records:
                if value is not None:
                    table[key] = value
                elif key in table:
                    del table[key]

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        rocks = self._rocks()
        if rocks is not None:
            for key, value in rocks[0].items(from_key=prefix):
                if not key.startswith(prefix):
                    break
                if value is not None and not key.startswith(b"__faust"):
                    yield key, value
            return
        items = sorted((k, v) for k, v in self.table.items() if k.startswith(prefix))
        yield from items

    def close(self) -> None:
        """Nothing to do: Faust opens and closes the table's store."""
