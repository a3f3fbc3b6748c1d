"""Fixes to faust-streaming's consumer (0.15.3, pinned in ``requirements.lock``) that the
worker's promise rests on: every raw page comes out, as a decision or a dead letter.

Each fix wraps or replaces one method of Faust's ``Consumer``; ``install`` applies them
all, once. They were found by tracing offsets through Faust under the fault tests
(``tests/integration/test_faults.py``: SIGKILLs, restarts, rebalances):

* ``strict_commits``: Faust committed past one unacknowledged message at the committed
  offset (faust-streaming #312, #606).
* ``no_skipped_acks``: a stream skips a message fetched while the flow was stopped or for
  an older generation (a rebalance; faust-streaming #221, #223), and *acknowledges* it, so
  that it was committed although no agent ever saw it.
* ``strict_commits`` also takes no offset as absent (a gap, committed past) on Faust's
  guess; only when the broker says so (``mark_absent``, ``neardup.kafka.absent``).
With them, a message a stream skipped is never committed; it holds its partition's
commits back until it is read again. Faust seeks to the committed offsets at the end of
a rebalance, but its fetch loop may go on with records fetched before that seek and
move its read offset past it, so that the copy fetched again is dropped as read already.
``stuck_partitions`` finds such a partition (the message at the committed offset read,
and no agent holding it), and the worker reads it again from there (``Worker.unstick``).
(A first attempt made the seeks authoritative inside Faust's fetch loop; it raced with
the consumer thread and stalled partitions, and was taken out.)

* ``seeks_between_fetches``: that reading again is itself a seek, and Faust's loop could
  drop what it brought back the same way, until the next try 10 s later. The worker's
  seeks are now made between two fetches, where no batch fetched before is left
  (nothing is judged stale: the seek is only put off until the batch in hand is
  delivered). Faust's own seek at an assignment cannot wait; a fetch that starts below
  the loop's read offset is delivered all the same (``deliver_what_a_seek_brought``):
  more copies, never fewer records.

* ``guard_commits``: Faust commits the offsets of acknowledged messages after flushing its
  producer, whether the batches then reached the broker or failed. The worker acknowledges
  a step's messages once their table records are handed over to the changelog's producer;
  no offset is committed now until those records are in the changelog, and none at all
  once a batch of them failed (``neardup.kafka.tablekv.Changelog.settled``).
* ``bulk_standbys``: the fetched records of a standby replica's changelog partitions, and
  of a partition being restored (but the last of each fetch), are written to its RocksDB
  store in one batch a partition, as Faust's recovery writes them, instead of going
  through Faust's stream machinery one record at a time (a cost that made two workers
  with standbys slower than one, and restores ten times slower).
* ``fresh_assignments`` (of Faust's RocksDB ``Store``): a newly assigned table
  partition's database last caught up with its changelog longer ago than half the time
  the changelog keeps deletions is removed before Faust opens it, and restored whole
  (``neardup.kafka.freshness``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Container, Mapping
from pathlib import Path
from typing import Any

from neardup.kafka import freshness

log = logging.getLogger("neardup.kafka")

#: How long the broker may hold a fetch for data. Faust hard-codes 1500 ms; the consumer
#: fetches every partition it owns in one request, and the worker owns internal partitions
#: that are mostly idle, so a fetch for the busy raw partitions would wait behind them.
FETCH_MAX_WAIT_MS = 50


def install() -> None:
    tune_fetch()
    strict_commits()
    no_skipped_acks()
    committing_seen()
    guard_commits()
    fresh_assignments()
    bulk_standbys()
    seeks_between_fetches()


def _once(cls: Any, name: str, fn: Any) -> None:
    """Replace ``cls.name`` with ``fn`` unless it was replaced already."""
    if getattr(getattr(cls, name), "neardup_fix", False):
        return
    fn.neardup_fix = True
    setattr(cls, name, fn)


def guard_commits() -> None:
    """Commit no offset while changelog records handed over may still fail, nor after
    some did (a wrap of the delegate consumer's ``_commit``, under every commit Faust
    makes: the periodic one, at a rebalance and at shutdown)."""
    from faust.transport.consumer import ThreadDelegateConsumer

    commit = ThreadDelegateConsumer._commit

    async def _commit(self: Any, offsets: Any) -> bool:
        changelog = getattr(self.app, "neardup_changelog", None)  # set by the worker
        if changelog is not None and not await changelog.settled():
            # raised, not False: Faust would take offsets it was told were not committed
            # as committed all the same (Consumer._commit_offsets)
            raise RuntimeError(
                f"not committing offsets {dict(offsets)}: changelog records of the steps "
                "before them did not reach the broker; those messages are read again at "
                "the next start"
            )
        return bool(await commit(self, offsets))

    _once(ThreadDelegateConsumer, "_commit", _commit)


def seeks_between_fetches() -> None:
    """Make the seeks the worker asks for (``request_seek``) just before the next fetch
    (a wrap of the delegate consumer's ``_getmany``, which Faust's fetch loop calls once
    it has delivered the batch before).

    Faust's ``Consumer.seek`` moves aiokafka's position and the loop's read offset at
    once, but the loop may be in the middle of delivering a batch fetched before. It goes
    on delivering that batch's records of the partition, from above the new position,
    and sets its read offset past them; the records fetched again from the new position
    are then dropped as read already, and the partition stays held back until it is read
    again (``Worker.unstick``: seen as a stall of about 10 s after a rebalance,
    docs/faults.md). Between two fetches no batch fetched before is left, and aiokafka drops what
    it prefetched for the partition (aiokafka's ``seek``: "use it ... after all pending
    messages are processed")."""
    from faust.transport.consumer import ThreadDelegateConsumer

    getmany = ThreadDelegateConsumer._getmany

    async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:
        await make_requested_seeks(self)
        records = await getmany(self, active_partitions, timeout)
        if records:
            deliver_what_a_seek_brought(self, records)
        return records

    _once(ThreadDelegateConsumer, "_getmany", _getmany)


def deliver_what_a_seek_brought(consumer: Any, records: Mapping[Any, Any]) -> None:
    """Faust's own seek to the committed offsets at an assignment can meet a batch in
    hand the same way (seen in a joining worker: raw partition 3 fetched again from its
    committed offset 14 while the loop's read offset stood at 153, so 14 to 152 were
    dropped and the commits held at 23 until the partition was read again). aiokafka
    hands out only records from the partition's position, which goes back only when it
    is reset (a seek, or an out-of-range reset to the earliest offset, after an unclean
    leader election): a fetch that starts below the loop's read offset is what the reset
    asked for. The read offset is put back to its first record (not below the committed
    offset: those were handled), so the loop delivers them; records it delivered already
    come twice, and are answered twice, identically. Not for changelogs: the standbys
    written in bulk read their read offsets (``_handed_over``)."""
    read = consumer._read_offset
    for tp, batch in records.items():
        if not batch:
            continue
        at = read.get(tp)
        first = int(batch[0].offset)
        if at is None or first >= at or consumer._is_changelog_tp(tp):
            continue
        committed = consumer._committed_offset.get(tp)
        back = first if committed is None else max(first, int(committed))
        if back < at:
            read[tp] = back
            log.info("%s[%d]: fetched from %d, below the fetch loop's read offset %d: "
                     "delivered from %d", tp.topic, tp.partition, first, at, back)  # fmt: skip


def request_seek(consumer: Any, tp: Any, offset: int) -> None:
    """Have Faust's fetch loop seek ``tp`` to ``offset`` before its next fetch
    (``seeks_between_fetches``). A seek asked for in an earlier generation of the group
    is dropped: the rebalance sought to the committed offsets itself."""
    pending = consumer.__dict__.setdefault("_neardup_seeks", {})
    pending[tp] = (consumer.app.consumer_generation_id, offset)


def requested_seeks(consumer: Any) -> dict[Any, int]:
    """The seeks asked for and not made yet: offset by partition."""
    pending = consumer.__dict__.get("_neardup_seeks") or {}
    return {tp: offset for tp, (_, offset) in pending.items()}


async def make_requested_seeks(consumer: Any) -> None:
    """Make the seeks asked for (``request_seek``): the fetch loop, before each fetch."""
    pending = consumer.__dict__.get("_neardup_seeks")
    if not pending:
        return
    generation = consumer.app.consumer_generation_id
    assigned = consumer.assignment()
    consumer.__dict__["_neardup_seeks"] = {}
    for tp, (asked_in, offset) in pending.items():
        if asked_in != generation or tp not in assigned:
            log.info("no seek of %s[%d] to %d: the partitions moved since it was asked for",
                     tp.topic, tp.partition, offset)  # fmt: skip
            continue
        try:
            await consumer.seek(tp, offset)
        except Exception as exc:  # taken away all the same: nothing to read
            log.info("no seek of %s[%d] to %d: %r", tp.topic, tp.partition, offset, exc)


def fresh_assignments() -> None:
    """Before Faust's RocksDB store takes the partitions newly assigned to it (as active
    or standby: it opens or restores them next), remove the database of each that is too
    old to catch up from its changelog (``neardup.kafka.freshness``), closing it first if
    it is still open (Faust does not close a revoked partition's database, and a late
    write may have opened it again); stamp a database about to be restored from the start;
    and forget the changelog offset the worker cached for each
    (``Changelog.persisted``): the partition may have moved away and back since."""
    from faust.stores.rocksdb import Store

    on_rebalance = Store.on_rebalance

    async def _on_rebalance(
        self: Any, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        topics = self.table.changelog_topic.topics
        for tp in sorted(tp for tp in newly_assigned if tp.topic in topics):
            fresh_partition(self, tp.partition)
        await on_rebalance(self, assigned, revoked, newly_assigned, generation_id)

    _once(Store, "on_rebalance", _on_rebalance)


def fresh_partition(store: Any, partition: int) -> None:
    """``fresh_assignments`` for one partition of a RocksDB ``store``."""
    changelog = getattr(store.app, "neardup_changelog", None)  # set by the worker
    if changelog is not None:
        changelog.forget(store.table, partition)
    path = Path(store.partition_path(partition))
    if not path.exists():
        freshness.begin_restore(path)
    elif (age := freshness.stale_age(path)) is not None:
        db = store._dbs.pop(partition, None)
        if db is not None:
            db.close()  # RocksDB refuses to open a path this process holds open
        freshness.discard(path, age)
    else:
        return
    # Faust's recovery keeps the larger of an offset it still holds and the database's
    # (setdefault, max): none may outlive the database it was read from
    recovery = getattr(getattr(store.app, "tables", None), "recovery", None)
    if recovery is not None:
        from faust.types import TP

        tp = TP(store.table.changelog_topic.get_topic_name(), partition)
        for offsets in (
            recovery.active_offsets,
            recovery.standby_offsets,
            recovery.active_highwaters,
            recovery.standby_highwaters,
        ):
            offsets.pop(tp, None)


def bulk_standbys() -> None:
    """Apply the records fetched for standby changelog partitions in bulk (a wrap of the
    consumer's ``_wait_next_records``, which returns each fetch to Faust's loop).

    Faust hands every fetched record to its streams one at a time: in
    ``Consumer._drain_messages`` two tasks and an ``asyncio.wait`` for each, then a queue
    put and a ``wait_for`` on the queue's get in ``Recovery._slurp_changelogs``, with two
    f-strings formatted for debug logs, before the record joins a buffer that is written
    to the table's store 1,000 at a time. That path suits the few, framed messages of the
    worker's own topics. A page writes about 60 changelog records, and each worker
    applies the other workers' records to its standby replicas: two workers with one
    standby replica each made fewer pages/s than one worker (``bench/worker.py``).

    Here, each standby partition's records in a fetch go to its table in one
    ``Table.apply_changelog_batch`` (Faust's own write: one RocksDB write batch and the
    persisted offset), and are taken out of the fetch before Faust's loop sees them. The
    same records are applied, in the same order, with the same checks: only records
    Faust would hand out (the flow active, the generation unchanged since the fetch
    began, the partition active in the fetch), at or after the consumer's read offset and
    after the recovery's offset for the partition, whose buffered records of the table
    are written first; none while Faust's changelog queue holds records its recovery has
    not read, nor of a partition with a record handed to the recovery and not applied
    yet (``_handed_over``). An active partition being restored is written the same way, all but the
    last record of each fetch, which goes through Faust's path: its recovery decides
    from those events when the restore is done (and so logs its progress). A partition
    whose table's store is not Faust's RocksDB store keeps Faust's path."""
    from faust.transport.consumer import Consumer

    wait_next = Consumer._wait_next_records

    async def _wait_next_records(self: Any, timeout: float) -> Any:
        began = self.app.consumer_generation_id
        records, active = await wait_next(self, timeout)
        if not (isinstance(records, dict) and records):  # a fetch nothing else holds
            return records, active
        if _changelogs_in(self.app, records):
            # let Faust's recovery (a task on this loop) first apply what its path took:
            # otherwise the guards leave this fetch to that path too, and the next, ...
            await _recovery_drained(self.app)
        if (
            self.flow_active
            and not self.should_stop
            and self.app.consumer_generation_id == began  # no rebalance meanwhile
        ):
            take_changelogs(self, records, active)
        return records, active

    _once(Consumer, "_wait_next_records", _wait_next_records)


#: How long a fetch of changelog records waits at most for Faust's recovery to read what
#: its queue holds.
DRAIN_WAIT_S = 1.0


def _changelogs_in(app: Any, records: Any) -> bool:
    recovery = getattr(getattr(app, "tables", None), "recovery", None)
    if recovery is None:
        return False
    return any(tp in recovery.standby_tps or tp in recovery.active_tps for tp in records)


async def _recovery_drained(app: Any) -> None:
    """Wait, ``DRAIN_WAIT_S`` at most, until Faust's changelog queue is empty, then a few
    event-loop turns more: the recovery's get runs in a task of its own, and applies the
    record it took a turn or two later. Without it, a fetch that Faust's path took (the
    first after a seek, or one a guard left to it) keeps records in the queue while the
    next fetch arrives, so the guards leave that one to Faust's path too, and so on."""
    queue = app.tables.changelog_queue
    deadline = time.monotonic() + DRAIN_WAIT_S
    while not queue.empty() and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    for _ in range(3):
        await asyncio.sleep(0)


class _Change:
    """A fetched changelog record as ``Store.apply_changelog_batch`` reads an event: its
    ``message``'s ``tp``, ``partition``, ``offset``, ``key`` and ``value``."""

    __slots__ = ("key", "offset", "partition", "tp", "value")

    def __init__(self, tp: Any, record: Any) -> None:
        self.tp, self.partition, self.offset = tp, tp.partition, int(record.offset)
        self.key, self.value = record.key, record.value

    @property
    def message(self) -> _Change:
        return self


def take_changelogs(consumer: Any, records: dict[Any, list[Any]], active: Any) -> int:
    """``bulk_standbys`` for one fetch: apply and remove from ``records`` the changelog
    records it may take, of standby partitions and of active ones being restored
    (``active``: the partitions fetched, None for every one). How many it applied."""
    from faust.stores.rocksdb import Store

    tables: Any = getattr(consumer.app, "tables", None)
    recovery = getattr(tables, "recovery", None)
    if recovery is None:
        return 0
    if not tables.changelog_queue.empty():
        # changelog records Faust's path took (a restore's last of a fetch, or a fetch
        # left to it) that its recovery has not read yet: a later record applied here
        # first would move the partition's offset past them, and the recovery would then
        # drop them as seen
        return 0
    standbys, actives = recovery.standby_tps, recovery.active_tps
    restoring = bool(recovery.in_recovery)
    buffered_tps = consumer._buffered_partitions
    applied = {"standby": 0, "restore": 0}
    taken = False
    for tp in list(records):
        if tp in actives:
            if not restoring:
                continue
            kind, offsets = "restore", recovery.active_offsets
        elif tp in standbys:
            kind, offsets = "standby", recovery.standby_offsets
        else:
            continue
        if active is not None and tp not in active and tp not in buffered_tps:
            continue  # Faust's loop would not hand these out either
        table = recovery.tp_to_table.get(tp)
        if table is None or not isinstance(table.data, Store):
            continue
        if _handed_over(consumer, tp, offsets):
            continue
        fetched = records[tp]
        if kind == "restore":
            if len(fetched) < 2:
                continue
            records[tp] = fetched[-1:]  # the last one through Faust's path
            fetched = fetched[:-1]
        else:
            del records[tp]
            taken = True
        applied[kind] += _write(consumer, recovery, table, tp, fetched, restore=kind == "restore")
    if applied["restore"]:
        _timed(recovery, applied["restore"])
    app = consumer.app
    app.neardup_standby_records = getattr(app, "neardup_standby_records", 0) + applied["standby"]
    app.neardup_restored_records = getattr(app, "neardup_restored_records", 0) + applied["restore"]
    if taken and not tables.standbys_ready and not recovery.standby_remaining_total():
        tables.on_standbys_ready()  # as Faust's recovery does after a standby's record
    return applied["standby"] + applied["restore"]


def _write(
    consumer: Any, recovery: Any, table: Any, tp: Any, fetched: list[Any], *, restore: bool
) -> int:
    """Write to ``table`` the records of ``fetched`` Faust would apply, after the table's
    buffered records; how many. ``restore``: ``tp`` is an active partition being restored,
    not a standby."""
    offsets = recovery.active_offsets if restore else recovery.standby_offsets
    read = consumer._read_offset.get(tp)  # Faust's loop drops records below it
    seen = offsets.get(tp)  # and its recovery those at or below it
    fresh = [
        _Change(tp, r)
        for r in fetched
        if (read is None or r.offset >= read) and (seen is None or r.offset > seen)
    ]
    if not fresh:
        return 0
    buffer = recovery.buffers.get(table)
    if buffer:  # records of the table Faust's path took before, written first
        table.apply_changelog_batch(buffer)
        buffer.clear()
    table.apply_changelog_batch(fresh)
    offsets[tp] = fresh[-1].offset
    consumer._read_offset[tp] = fresh[-1].offset
    # Faust's recovery warns of a restore whose buffers were not written for 120 s
    recovery._last_flush_at = time.monotonic()
    return len(fresh)


def _timed(recovery: Any, n: int) -> None:
    """Keep Faust's estimate of a restore's remaining time true: it takes the mean time
    between two records its loop applied (over the last
    ``num_samples_required_for_estimate``) times the records left. Written in bulk, ``n``
    records (of every partition a fetch restores) came between two of those; each gets
    its share of the time since the last."""
    now = time.monotonic()
    last = recovery._last_active_event_processed_at
    if last is not None:
        times = recovery._processing_times
        keep = recovery.num_samples_required_for_estimate
        times.extend([(now - last) / n] * min(n, keep))
        while len(times) > keep:
            times.popleft()
    recovery._last_active_event_processed_at = now


def _handed_over(consumer: Any, tp: Any, offsets: Any) -> bool:
    """Whether Faust's loop has handed the recovery a record of ``tp`` that it has not
    applied yet: the consumer's read offset (the last record the loop handed out, or
    where a seek put it) past the recovery's offset (the last record applied). Such a
    record may have left the changelog queue and not yet reached the recovery (its get
    runs in a task of its own), so the queue being empty does not rule it out. Written
    here first, later records would move the offset past it, and the recovery would drop
    it as seen. Right after a seek this holds too, until Faust's path has taken one fetch
    of the partition."""
    read = consumer._read_offset.get(tp)
    if read is None:
        return False
    seen = offsets.get(tp)
    return seen is None or read > seen


def tune_fetch() -> None:
    """Give Faust's consumer ``FETCH_MAX_WAIT_MS`` (a wrap of the one method that builds
    it: Faust has no setting for it)."""
    from faust.transport.drivers import aiokafka as driver

    thread = driver.AIOKafkaConsumerThread
    build = thread._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = build(self, transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts
        return consumer

    _once(thread, "_create_worker_consumer", create)


def strict_commits() -> None:
    """Never commit past a message that was not acknowledged, nor past an offset taken
    as absent on a guess.

    Faust's ``Consumer._new_offset`` commits the run of acknowledged offsets that starts
    at the smallest one, and only checks that this run starts where the last commit ended
    if ``min(acked) - committed > 1``: one unacknowledged message right at the committed
    offset is committed past (faust-streaming issues #312, #606). This is the same
    function with the check made exact (``committed`` is the next offset to read, as
    Kafka's commits are); with no commit yet, the run starts at the lowest offset still
    in hand, not at ``min(acked)``. Offsets the topic does not have (transaction markers, compacted
    records) are gaps, counted as acknowledged; but only those the broker said it lacks
    (``mark_absent``). Faust's ``_add_gap`` took any jump in what its fetch loop saw for
    one: after a seek, a batch fetched before it jumps, and messages that exist were
    committed past, never handled (the join-then-kill fault test lost pages so)."""
    from faust.transport import consumer as faust_consumer

    def first_unhandled(self: Any, tp: Any) -> int:
        # No commit yet (or one of offset 0, which Faust keeps as none): where reading
        # began is unknown here. Every message below an acknowledged one was delivered
        # to the streams before it (the fetch loop hands a partition's messages over in
        # order, tracking each as unacknowledged first), so the lowest offset still
        # unacknowledged in this generation, if below every acknowledged one, is where
        # the run must start: it is not committed past.
        generation = self.app.consumer_generation_id
        waiting = [
            m.offset
            for m in list(self._unacked_messages)
            if m.tp == tp and not m.acked and m.generation_id in (None, generation)
        ]
        return int(min([*waiting, *self._acked[tp]]))

    def new_offset(self: Any, tp: Any) -> int | None:
        acked = self._acked[tp]
        index = self._acked_index[tp]
        gaps = self._gap[tp]
        committed = self._committed_offset[tp]
        if committed is None and not acked:
            return None
        # from the committed offset (the next one to read), over acknowledged offsets
        # and offsets that hold no message; none acknowledged past a trailing gap too
        start = at = int(committed) if committed is not None else first_unhandled(self, tp)
        while True:
            if at in index:
                at += 1
            elif gaps and (spans := gaps[at]):
                at = max(span.end for span in spans)
            else:
                break
        # forget what is below: also copies read again while a commit was in flight,
        # acknowledged against the committed offset before it, which only mislead
        acked[:] = sorted(o for o in acked if o >= at)
        index.difference_update([o for o in index if o < at])
        if gaps:
            gaps.chop(0, at)
        return None if at == start else at  # None: the message there is not handled yet

    async def add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        # Faust's guess that the offsets from ``offset_from`` up to ``offset_to`` are
        # absent, from a jump in what its fetch loop saw: not taken (``mark_absent``)
        log.debug("%s: Faust saw offsets %d to %d skipped", tp, offset_from, offset_to - 1)

    base = faust_consumer.Consumer
    _once(base, "_new_offset", new_offset)
    _once(base, "_add_gap", add_gap)


def mark_absent(consumer: Any, tp: Any, begin: int, end: int) -> None:
    """Offsets ``begin`` up to ``end`` of ``tp`` hold no message (the broker said so:
    ``neardup.kafka.absent``): commits pass over them, as over acknowledged ones."""
    committed = consumer._committed_offset.get(tp)
    if committed is not None:
        begin = max(begin, int(committed))
    if begin < end:
        gaps = consumer._gap[tp]
        gaps.addi(begin, end)
        gaps.merge_overlaps()
        consumer._acked.setdefault(tp, [])  # Faust commits the partitions listed there


def no_skipped_acks() -> None:
    """A message no stream took (``tracked`` is set when one does) is never acknowledged.

    ``Stream`` skips a message that was fetched while the flow was stopped, or for an
    older generation, and then acknowledges it "so that the lag does not grow": its offset
    is committed with the others, and the message is lost. Left unacknowledged, it holds
    the partition's commits back until it is read again (after the rebalance's seek)."""
    from faust.transport import consumer as faust_consumer

    base = faust_consumer.Consumer
    ack = base.ack

    def ack_taken(self: Any, message: Any) -> bool:
        if not message.tracked:
            return False
        return bool(ack(self, message))

    _once(base, "ack", ack_taken)


def committing_seen() -> None:
    """Keep the offsets being committed visible while the commit runs
    (``consumer._neardup_committing``). Faust takes them out of its acknowledged offsets
    when the commit starts and records the new committed offset when it ends, after the
    producer's flush, which takes seconds when the downstream is slow: in between, the
    partition would look held back to ``stuck_partitions``."""
    from faust.transport import consumer as faust_consumer

    base = faust_consumer.Consumer
    commit_offsets = base._commit_offsets

    async def commit_seen(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        self.__dict__["_neardup_committing"] = dict(offsets)
        try:
            return bool(await commit_offsets(self, offsets, start_new_transaction))
        finally:
            self.__dict__["_neardup_committing"] = {}

    _once(base, "_commit_offsets", commit_seen)


#: Why a partition is held back at its committed offset (``stuck_partitions``).
AFTER = "after"  # a later message was acknowledged: the one there was dropped, or absent
READ = "read"  # the fetch loop read past it: dropped (or just sought to), or absent
UNREAD = "unread"  # the fetch loop has not got to it: absent, or not fetched yet


def stuck_partitions(
    consumer: Any, idle: Callable[[str], bool], left: Mapping[Any, int] | None = None
) -> dict[Any, tuple[int, str]]:
    """Partitions whose commits are held back at the committed offset, by a message that
    no agent holds or by an offset that holds no message: each one's committed offset and
    why (``AFTER``, ``READ``, ``UNREAD``). The offset is not acknowledged, not in
    progress, not known to be absent, and the partition is not paused; then either a
    later message was acknowledged, or its end offset is past it, every message the
    fetch loop read was handled, and ``idle(topic)`` says no stream has messages of the
    topic waiting. (``READ`` and ``UNREAD`` are found so for a moment between two fetches
    too: the caller waits before it acts.)

    A stream takes a partition's messages in offset order, so such an offset was either
    passed over by the fetch (a transaction marker, a compacted record: ask the broker,
    ``neardup.kafka.absent``), or its message was dropped on the way: skipped around a
    rebalance, and its copy fetched again dropped as read (read it again). ``UNREAD``
    only says the first: a message there was not dropped, it is still to come (the fetch
    loop may wait on a full queue of another topic).

    ``left``: for a partition, the offset of a message an agent took and left
    unacknowledged to be read again in order (``neardup.kafka.inorder``). Left at or past
    the committed offset, it says what a later message acknowledged says (``AFTER``),
    however busy the topic's streams are."""
    taken = {(m.tp, m.offset) for m in list(consumer.unacked)}
    committing = getattr(consumer, "_neardup_committing", None) or {}
    paused = set(consumer._paused_partitions)
    stuck = {}
    for tp in list(consumer.assignment()):
        committed = consumer._committed_offset.get(tp)
        if committed is None or (tp, committed) in taken or tp in committing or tp in paused:
            continue
        if committed in consumer._acked_index.get(tp, ()):
            continue  # handled; the commit is on its way
        gaps = consumer._gap.get(tp)
        if gaps is not None and gaps.overlaps(committed):
            continue
        if any(o > committed for o in consumer._acked.get(tp) or ()) or (
            left and left.get(tp, -1) >= committed
        ):
            stuck[tp] = (int(committed), AFTER)
            continue
        read = consumer._read_offset.get(tp)
        try:
            end = consumer.highwater(tp)
        except Exception:  # (aiokafka asserts the partition is still assigned)
            end = None
        if read is None or end is None or end <= committed or not idle(tp.topic):
            continue
        if read >= committed:  # (the last offset read; after a seek, the next)
            stuck[tp] = (int(committed), READ)
        elif read == committed - 1:
            stuck[tp] = (int(committed), UNREAD)
    return stuck


def topic_idle(app: Any, topic: str) -> bool:
    """Whether no stream of ``app`` has messages of ``topic`` waiting to be taken."""
    conductor: Any = app.topics
    channels = conductor._topic_name_index.get(topic, ())
    return all(channel.queue.empty() for channel in list(channels))


def committed_or_committing(consumer: Any, tp: Any) -> int | None:
    """The committed offset of ``tp``, or the one being committed if higher (None: no
    commit known yet)."""
    committed = consumer._committed_offset.get(tp)
    committing = (getattr(consumer, "_neardup_committing", None) or {}).get(tp)
    if committing is not None:
        committed = committing if committed is None else max(committed, committing)
    return None if committed is None else int(committed)


def handled_below(
    consumer: Any, tp: Any, offset: int, handled: Container[int] = frozenset()
) -> int:
    """While the message at ``offset`` of ``tp`` is being handled: the offset below which
    every message of the partition was handled, counting from the committed offset (or
    the one being committed) over acknowledged offsets, offsets in ``handled`` (handled
    and not acknowledged yet: earlier in the same batch) and offsets the topic does not
    have (gaps). ``offset`` itself (or more) when nothing before it is missing, or when
    no commit is known yet. Less when a message before it was skipped (see
    ``no_skipped_acks``): it will be read again."""
    committed = committed_or_committing(consumer, tp)
    if committed is None:
        return offset
    acked = consumer._acked_index.get(tp) or ()
    gaps = consumer._gap.get(tp)
    at = int(committed)
    while at < offset and (
        at in acked or at in handled or (gaps is not None and gaps.overlaps(at))
    ):
        at += 1
    return at


def set_fetch_size(app: Any, nbytes: int) -> None:
    """Bytes a partition per fetch from now on (Faust's ``consumer_max_fetch_size``, which
    it sets once): aiokafka's fetcher reads it for each fetch request it builds, in the
    consumer's thread. Nothing happens before the consumer has started."""
    from faust.exceptions import ConsumerNotStarted

    try:
        fetcher = app.consumer._thread._ensure_consumer()._fetcher
    except ConsumerNotStarted:
        return
    if fetcher is not None:
        fetcher._max_partition_fetch_bytes = nbytes


def assigned(app: Any, events: list[Any]) -> list[Any]:
    """The events of ``events`` fetched in the consumer's current generation, of
    partitions it has now (all of them where there is no consumer running: the agent
    tests). The others were taken before a rebalance: their partitions went to another
    worker, or came back here and are read again from the committed offset."""
    from faust.exceptions import ConsumerNotStarted

    try:
        now = app.consumer.assignment()
    except ConsumerNotStarted:
        return events
    generation = app.consumer_generation_id
    return [
        e for e in events if e.message.tp in now and e.message.generation_id in (None, generation)
    ]


def restoring_again(app: Any) -> bool:
    """Whether Faust has been given a new assignment whose restore has not begun yet.

    Its recovery service sends ``on_rebalance_complete`` at the end of a restore without
    checking that no rebalance came meanwhile; an assignment since then sets this signal,
    and the service clears it as it starts the next restore."""
    return bool(app.tables.recovery.signal_recovery_start.is_set())


async def acked_when_done(
    stream: Any,
    events: list[Any],
    handle: Callable[[list[Any]], Awaitable[Collection[Any] | None]],
) -> None:
    """Handle a batch from ``take_events`` and acknowledge it only once handled.

    ``Stream.take_events`` acknowledges a batch in a ``finally``: when the agent is
    cancelled halfway through it (the worker stopping, at a leave or a restart), the
    messages not yet handled are acknowledged too, their offsets committed, and they are
    never seen again. Holding one more reference on each message until its outputs went
    to the producer leaves them unacknowledged in that case, to be read again.

    Messages of partitions revoked meanwhile are not acknowledged: Faust forgot their
    offsets at the revoke, and an acknowledgement now would put them back as handled,
    with no committed offset to compare them with, where a later assignment of the
    partition would take them as handled in its generation too. The partition's next
    owner reads them from its committed offset.

    ``handle`` may return events it left to be read again (``neardup.kafka.inorder``):
    those are never acknowledged either, and no longer waited for (``forget``)."""
    for event in events:
        event.message.incref()
    left = await handle(events) or ()
    for event in left:
        forget(stream.app.consumer, event.message)
    skip = {id(event) for event in left}
    for event in assigned(stream.app, events):
        if id(event) not in skip:
            await stream.ack(event)


def forget(consumer: Any, message: Any) -> None:
    """A message left unacknowledged, to be read again: Faust no longer tracks it as in
    hand (a stop does not wait for it; ``stuck_partitions`` does not take its offset for
    one an agent holds). Its offset holds the commits back until a copy is handled."""
    consumer._unacked_messages.discard(message)


def passed_over(consumer: Any, tp: Any, begin: int, end: int) -> bool:
    """Whether the commits of ``tp`` pass over every offset from ``begin`` up to ``end``
    without a message there being handled: below the committed offset, or held to hold
    no message (``mark_absent``). (While a commit runs, its offset counts as committed:
    the gaps below it are forgotten already.)"""
    committed = committed_or_committing(consumer, tp)
    at = begin if committed is None else max(begin, int(committed))
    gaps = consumer._gap.get(tp)
    while at < end:
        spans = gaps[at] if gaps else ()
        if not spans:
            return False
        at = max(span.end for span in spans)
    return True
