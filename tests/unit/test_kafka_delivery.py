"""The task overlay and the commit step, without a broker: reads see the transaction's
writes, prefix deletes become tombstones, and the store is written only after the
transaction has committed (a producer stand-in records the order of the calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from neardup.kafka.assignor import Task
from neardup.kafka.delivery import (
    Config,
    FencedError,
    Out,
    ProducerBrokenError,
    Record,
    TaskRunner,
)
from neardup.kafka.taskstate import OFFSET_KEY, Overlay, items, stored_offset
from neardup.store import RocksKV


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksKV]:
    kv = RocksKV(str(tmp_path / "db"))
    kv.put_many([(b"c:a", b"1"), (b"c:b", b"2"), (b"d:x", b"3")])
    yield kv
    kv.close()


def test_reads_see_the_transaction_and_the_store_sees_nothing_before_flush(
    store: RocksKV,
) -> None:
    kv = Overlay(store)
    kv.put_many([(b"c:a", b"10"), (b"c:new", b"5")])
    kv.delete_many([b"d:x"])
    assert kv.get_many([b"c:a", b"c:b", b"c:new", b"d:x", b"none"]) == [
        b"10",
        b"2",
        b"5",
        None,
        None,
    ]
    assert dict(items(store)) == {b"c:a": b"1", b"c:b": b"2", b"d:x": b"3"}
    kv.flush(7)
    assert dict(items(store)) == {b"c:a": b"10", b"c:b": b"2", b"c:new": b"5"}
    assert stored_offset(store) == (None, 7)
    assert kv.dirty == {}


def test_a_prefix_delete_is_a_tombstone_for_every_key_it_covers(store: RocksKV) -> None:
    kv = Overlay(store)
    kv.put_many([(b"c:new", b"5")])
    kv.delete_prefix(b"c:")
    assert kv.dirty == {b"c:a": None, b"c:b": None, b"c:new": None}
    assert kv.get_many([b"c:a", b"c:new", b"d:x"]) == [None, None, b"3"]


def test_a_scan_sees_the_transaction_over_the_store(store: RocksKV) -> None:
    kv = Overlay(store)
    kv.put_many([(b"c:0", b"new"), (b"c:b", b"changed")])
    kv.delete_many([b"c:a"])
    assert list(kv.scan(b"c:")) == [(b"c:0", b"new"), (b"c:b", b"changed")]
    assert list(kv.scan(b"d:")) == [(b"d:x", b"3")]


def test_drop_forgets_the_transaction(store: RocksKV) -> None:
    kv = Overlay(store)
    kv.put_many([(b"c:a", b"99")])
    kv.drop()
    kv.flush(None)
    assert dict(items(store))[b"c:a"] == b"1"
    assert store.get_many([OFFSET_KEY]) == [None]


# -- the commit step -----------------------------------------------------------------------

IN, OUT, LOG = TopicPartition("in", 0), "out", TopicPartition("log", 0)


@dataclass
class Batch:
    capacity: int
    records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: None) -> object:
        if len(self.records) >= self.capacity:
            return None
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


@dataclass
class Meta:
    offset: int


class Producer:
    """Records what the commit step calls, and what the store held at the commit."""

    def __init__(self, store: RocksKV, fail: type[Exception] | None = None) -> None:
        self.store, self.fail = store, fail
        self.calls: list[Any] = []
        self.ends: dict[tuple[str, int], int] = {}
        self.at_commit: dict[bytes, bytes] | None = None

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    def create_batch(self) -> Batch:
        return Batch(capacity=3)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> Any:
        self.calls.append(("batch", topic, partition, list(batch.records)))
        base = self.ends.get((topic, partition), 100)
        self.ends[(topic, partition)] = base + batch.record_count()
        future = asyncio.get_running_loop().create_future()
        future.set_result(Meta(base))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group: str) -> None:
        self.calls.append(("offsets", dict(offsets), group))

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        self.at_commit = dict(items(self.store))
        if self.fail is not None:
            raise self.fail()

    async def abort_transaction(self) -> None:
        self.calls.append("abort")


@dataclass
class Count:
    """A step that counts records per key and forwards each record."""

    def on_records(self, records: Sequence[Record], kv: Overlay, out: Out) -> None:
        for r in records:
            assert r.key is not None
            (raw,) = kv.get_many([r.key])
            kv.put_many([(r.key, str(int(raw or b"0") + 1).encode())])
            out.send(OUT, 0, r.key, r.value)
        kv.delete_many([b"gone"])

    def on_tick(self, now: float, kv: Overlay, out: Out, caught_up: bool) -> None:
        pass


def runner(store: RocksKV, producer: Producer) -> TaskRunner:
    cfg = Config(bootstrap="-", app="app", topics=("in",), state_dir="-")
    r = TaskRunner(Task("t", (IN,), LOG), lambda task: Count(), cfg, producer)
    r.kv = Overlay(store)
    r.committed, r.next = {IN: 10}, {IN: 10}
    records = [Record("in", 0, 10 + i, b"k%d" % (i % 2), b"v%d" % i, 0) for i in range(5)]
    r.step.on_records(records, r.kv, r.out)
    r.stepped(records)
    return r


def test_the_commit_sends_everything_then_offsets_then_commits_then_writes_the_store(
    store: RocksKV,
) -> None:
    producer = Producer(store)
    r = runner(store, producer)
    before = dict(items(store))
    asyncio.run(r.commit("app"))
    outputs = [c for c in producer.calls if c[:2] == ("batch", OUT)]
    changelog = [c for c in producer.calls if c[:2] == ("batch", "log")]
    assert producer.calls[0] == "begin"
    assert producer.calls[-2:] == [("offsets", {IN: 15}, "app"), "commit"]
    assert [len(c[3]) for c in outputs] == [3, 2]  # batches of 3 at most, in order
    assert [v for c in outputs for _, v in c[3]] == [b"v%d" % i for i in range(5)]
    assert sorted(kv for c in changelog for kv in c[3]) == [
        (b"gone", None),
        (b"k0", b"3"),
        (b"k1", b"2"),
    ]
    assert producer.at_commit == before, "the store was written before the commit"
    assert dict(items(store))[b"k0"] == b"3"
    assert b"gone" not in dict(items(store))
    assert stored_offset(store)[1] == 103  # after the changelog's 3 records from offset 100
    assert r.committed == {IN: 15} and not r.pending


@pytest.mark.parametrize("fail", [KafkaError, ProducerFenced])
def test_a_failed_commit_leaves_the_store_alone(store: RocksKV, fail: type[Exception]) -> None:
    producer = Producer(store, fail)
    r = runner(store, producer)
    before = dict(items(store))
    # a refused batch leaves the producer's sequence numbers behind: it is replaced
    want = FencedError if fail is ProducerFenced else ProducerBrokenError
    with pytest.raises(want):
        asyncio.run(r.commit("app"))
    assert dict(items(store)) == before
    assert ("abort" in producer.calls) == (fail is KafkaError)  # a fenced producer can't
    r.rewind(consumer=Seeker())
    assert r.next == r.committed == {IN: 10} and not r.pending


class Seeker:
    def __init__(self) -> None:
        self.seeks: list[tuple[Any, int]] = []

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_a_prefix_delete_of_everything_keeps_the_runtime_keys(store: RocksKV) -> None:
    Overlay(store).flush(5)
    kv = Overlay(store)
    kv.delete_prefix(b"")
    assert OFFSET_KEY not in kv.dirty
    kv.flush(None)
    assert dict(items(store)) == {} and stored_offset(store)[1] == 5
