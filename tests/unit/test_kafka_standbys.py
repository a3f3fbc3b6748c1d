"""Standby replicas and restores written in bulk (``neardup.kafka.faustfix.bulk_standbys``):
the same records Faust's recovery would apply, in the same order, and nothing else."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from types import SimpleNamespace
from typing import Any

from faust.stores.rocksdb import Store
from faust.types import TP

from neardup.kafka import faustfix
from neardup.kafka.faustfix import take_changelogs

STANDBY, OTHER, ACTIVE = TP("t-changelog", 0), TP("t-changelog", 1), TP("t-changelog", 2)
ACTIVE2 = TP("t-changelog", 3)
RAW = TP("raw", 0)


class _Table:
    """What ``take_changelogs`` uses of a table: its store, and Faust's batch write."""

    def __init__(self, store: Any) -> None:
        self.data = store
        self.batches: list[list[tuple[int, int, bytes | None, bytes | None]]] = []

    def apply_changelog_batch(self, events: Any) -> None:
        self.batches.append(
            [
                (e.message.partition, e.message.offset, e.message.key, e.message.value)
                for e in events
            ]
        )


def _record(offset: int, key: bytes = b"k", value: bytes | None = b"v") -> Any:
    return SimpleNamespace(offset=offset, key=key, value=value)


def _consumer(table: _Table, **kw: Any) -> Any:
    recovery = SimpleNamespace(
        standby_tps={STANDBY, OTHER},
        active_tps={ACTIVE, ACTIVE2},
        tp_to_table={STANDBY: table, OTHER: table, ACTIVE: table, ACTIVE2: table},
        standby_offsets=Counter(kw.get("seen", {})),
        active_offsets=Counter(kw.get("active_seen", {})),
        in_recovery=kw.get("restoring", False),
        buffers={table: list(kw.get("buffered", []))},
        standby_remaining_total=lambda: 0,
        _processing_times=deque(),
        _last_active_event_processed_at=kw.get("last_processed_at"),
        num_samples_required_for_estimate=4,
    )
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for event in kw.get("queued", []):
        queue.put_nowait(event)
    tables = SimpleNamespace(
        recovery=recovery, standbys_ready=kw.get("ready", True), changelog_queue=queue
    )
    tables.on_standbys_ready = lambda: setattr(tables, "standbys_ready", True)
    app = SimpleNamespace(tables=tables, consumer_generation_id=1)
    return SimpleNamespace(
        app=app, _buffered_partitions=set(), _read_offset=dict(kw.get("read", {}))
    )


def _rocks_table() -> _Table:
    return _Table(Store.__new__(Store))  # only its type is looked at


def test_a_standby_partitions_records_are_written_in_one_batch_and_taken_out() -> None:
    table = _rocks_table()
    consumer = _consumer(table)
    records = {STANDBY: [_record(5, b"a"), _record(6, b"b", None)], RAW: [_record(9)]}
    assert take_changelogs(consumer, records, None) == 2
    assert table.batches == [[(0, 5, b"a", b"v"), (0, 6, b"b", None)]]  # a tombstone too
    assert list(records) == [RAW]  # the raw page is left to Faust's loop
    recovery = consumer.app.tables.recovery
    assert recovery.standby_offsets[STANDBY] == 6
    assert consumer._read_offset[STANDBY] == 6
    assert consumer.app.neardup_standby_records == 2


def test_records_faust_would_not_apply_are_not_applied() -> None:
    table = _rocks_table()
    # the recovery applied up to 5 of one and 4 of the other, the last records its
    # loop handed out
    consumer = _consumer(table, seen={STANDBY: 5, OTHER: 4}, read={STANDBY: 5, OTHER: 4})
    records = {
        STANDBY: [_record(4), _record(5), _record(6), _record(7)],
        OTHER: [_record(3), _record(4), _record(5)],
    }
    assert take_changelogs(consumer, records, None) == 3
    assert table.batches == [[(0, 6, b"k", b"v"), (0, 7, b"k", b"v")], [(1, 5, b"k", b"v")]]
    assert not records


def test_a_record_handed_to_the_recovery_and_not_applied_yet_holds_its_partition() -> None:
    # Faust's loop handed out 6 (read offset 6) and the recovery has applied only 5: 6 may
    # be between the queue and the recovery, so 7 and 8 must not be written before it
    table = _rocks_table()
    consumer = _consumer(table, seen={STANDBY: 5}, read={STANDBY: 6})
    records = {STANDBY: [_record(7), _record(8)]}
    assert take_changelogs(consumer, records, None) == 0
    assert records == {STANDBY: [_record(7), _record(8)]} and not table.batches
    consumer.app.tables.recovery.standby_offsets[STANDBY] = 6  # the recovery applied it
    assert take_changelogs(consumer, records, None) == 2
    # after a seek the read offset is the next to read: one fetch goes through Faust's
    # path first; a partition the recovery holds no offset for, likewise
    consumer = _consumer(table, seen={STANDBY: 5}, read={STANDBY: 6, OTHER: 0})
    records = {STANDBY: [_record(6)], OTHER: [_record(0)]}
    assert take_changelogs(consumer, records, None) == 0
    assert set(records) == {STANDBY, OTHER}


def test_the_tables_buffered_records_are_written_first() -> None:
    table = _rocks_table()
    earlier = SimpleNamespace(message=SimpleNamespace(partition=2, offset=1, key=b"x", value=b"1"))
    consumer = _consumer(table, buffered=[earlier])
    take_changelogs(consumer, {STANDBY: [_record(8)]}, None)
    assert table.batches == [[(2, 1, b"x", b"1")], [(0, 8, b"k", b"v")]]
    assert consumer.app.tables.recovery.buffers[table] == []


def test_actives_not_restoring_other_stores_and_partitions_not_fetched_keep_fausts_path() -> None:
    table = _rocks_table()
    consumer = _consumer(table)
    records = {ACTIVE: [_record(1)], STANDBY: [_record(1)]}
    # a restore's active partition, and a standby the fetch did not ask for (paused)
    assert take_changelogs(consumer, records, {ACTIVE}) == 0
    assert set(records) == {ACTIVE, STANDBY} and not table.batches
    consumer._buffered_partitions.add(STANDBY)  # unless Faust hands it out all the same
    assert take_changelogs(consumer, records, {ACTIVE}) == 1

    memory = _Table(object())  # not Faust's RocksDB store
    consumer = _consumer(memory)
    records = {STANDBY: [_record(1)]}
    assert take_changelogs(consumer, records, None) == 0
    assert STANDBY in records and not memory.batches


def test_a_fetch_that_spans_a_rebalance_is_left_to_faust(monkeypatch: Any) -> None:
    table = _rocks_table()
    consumer = _consumer(table)
    consumer.flow_active, consumer.should_stop = True, False

    async def fetch(self: Any, timeout: float) -> Any:
        self.app.consumer_generation_id += fetch.rebalances  # type: ignore[attr-defined]
        return {STANDBY: [_record(1)]}, None

    from faust.transport.consumer import Consumer

    monkeypatch.setattr(Consumer, "_wait_next_records", fetch)
    faustfix.bulk_standbys()
    wrapped = Consumer._wait_next_records
    for rebalances, left in ((1, {STANDBY}), (0, set())):
        fetch.rebalances = rebalances  # type: ignore[attr-defined]
        records, _ = asyncio.run(wrapped(consumer, 1.0))
        assert set(records) == left


def test_nothing_is_taken_while_fausts_recovery_has_records_to_read() -> None:
    # records Faust's path put in its queue (a fetch left to it) come first: a later record
    # applied now would move the offset past them, and the recovery would drop them
    table = _rocks_table()
    consumer = _consumer(table, queued=[object()])
    records = {STANDBY: [_record(8)]}
    assert take_changelogs(consumer, records, None) == 0
    assert STANDBY in records and not table.batches


def test_standbys_are_ready_once_caught_up_even_with_nothing_new_to_write() -> None:
    table = _rocks_table()
    consumer = _consumer(table, seen={STANDBY: 8}, ready=False)
    assert take_changelogs(consumer, {STANDBY: [_record(8)]}, None) == 0  # read again
    assert consumer.app.tables.standbys_ready


def test_a_restore_is_written_in_bulk_but_for_each_fetchs_last_record() -> None:
    # Faust's recovery sees the last record of each fetch of a partition it restores, and
    # so decides when the restore is done, as it would have from every record
    table = _rocks_table()
    consumer = _consumer(table, restoring=True, active_seen={ACTIVE: 3})
    last = _record(7)
    records = {ACTIVE: [_record(3), _record(4), _record(5, b"d", None), last]}
    assert take_changelogs(consumer, records, None) == 2
    assert table.batches == [[(2, 4, b"k", b"v"), (2, 5, b"d", None)]]
    assert records == {ACTIVE: [last]}
    assert consumer.app.tables.recovery.active_offsets[ACTIVE] == 5
    assert consumer.app.neardup_restored_records == 2
    assert take_changelogs(consumer, {ACTIVE: [_record(8)]}, None) == 0  # one: Faust's


def test_a_restore_in_bulk_keeps_fausts_estimate_of_the_time_left_per_record(
    monkeypatch: Any,
) -> None:
    # Faust estimates the time left as the mean time between two records it applied
    # times the records left: in bulk, a fetch's records share the time since the last,
    # those of every partition it restores
    now = [100.0]
    monkeypatch.setattr(faustfix.time, "monotonic", lambda: now[0])
    table = _rocks_table()
    consumer = _consumer(table, restoring=True, last_processed_at=98.0)
    records = {
        ACTIVE: [_record(o) for o in range(11)],
        ACTIVE2: [_record(o) for o in range(11)],
    }
    assert take_changelogs(consumer, records, None) == 20
    recovery = consumer.app.tables.recovery
    assert list(recovery._processing_times) == [0.1] * 4  # 2 s for 20 records; 4 kept
    assert recovery._last_active_event_processed_at == 100.0
    # standbys are not part of a restore's estimate
    now[0] = 200.0
    take_changelogs(consumer, {STANDBY: [_record(1), _record(2)]}, None)
    assert list(recovery._processing_times) == [0.1] * 4
    assert recovery._last_active_event_processed_at == 100.0
