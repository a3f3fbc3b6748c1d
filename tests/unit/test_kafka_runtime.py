"""The runtime's commit pipelining, without a broker: a task commits in the background
while the loop steps the others; what comes for it meanwhile is held and goes into its
next transaction; a commit that fails leaves nothing of it, nor of what was held, and the
task reads again from its committed offsets. And tasks assigned are opened by the loop,
not in the rebalance callback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from rocksdict import DbClosedError

from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Config, Out, Record, TaskRunner
from neardup.kafka.runtime import Runtime
from neardup.kafka.taskstate import Overlay, items
from neardup.store import RocksKV

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


class Fetched:
    """A consumer record as aiokafka hands it over."""

    def __init__(self, tp: TopicPartition, offset: int) -> None:
        self.offset, self.key, self.value, self.timestamp = offset, b"k", b"v%d" % offset, 0
        self.topic, self.partition = tp.topic, tp.partition


def batch(tp: TopicPartition, *offsets: int) -> dict[TopicPartition, list[Fetched]]:
    return {tp: [Fetched(tp, o) for o in offsets]}


class Consumer:
    """Records seeks and pauses; ``getmany`` waits until ``stop`` is set, then returns
    ``fetched``."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.paused: set[TopicPartition] = set()
        self.stop = asyncio.Event()
        self.fetched: dict[Any, Any] = {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        await self.stop.wait()
        return self.fetched

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {A.partition, B.partition}


class Batch:
    def __init__(self) -> None:
        self.n = 0

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: None) -> object:
        self.n += 1
        return object()

    def record_count(self) -> int:
        return self.n


class Sent:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class Producer:
    """Each transaction's offsets; a commit waits for ``gate``, and raises ``fail``."""

    def __init__(self) -> None:
        self.end = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None
        self.offsets: list[dict[Any, int]] = []
        self.aborts = 0

    async def begin_transaction(self) -> None:
        pass

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.set_result(Sent(self.end))
        self.end += batch.record_count()
        return future

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group: str) -> None:
        self.offsets.append(dict(offsets))

    async def commit_transaction(self) -> None:
        await self.gate.wait()
        if self.fail is not None:
            self.offsets.pop()
            raise self.fail

    async def abort_transaction(self) -> None:
        self.aborts += 1

    async def stop(self) -> None:
        pass


class Steps:
    """The records a step object saw; it writes one key a record."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_records(self, records: Sequence[Record], kv: Overlay, out: Out) -> None:
        self.seen += [r.offset for r in records]
        kv.put_many([(b"o%d" % r.offset, b"1") for r in records])

    def on_tick(self, now: float, kv: Overlay, out: Out, caught_up: bool) -> None:
        pass


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, RocksKV]]:
    kvs = {name: RocksKV(str(tmp_path / name)) for name in ("a", "b")}
    yield kvs
    for kv in kvs.values():
        with contextlib.suppress(DbClosedError):  # closed with its task
            kv.close()


#: The tasks of these tests: one an input partition.
LAYOUT = [Task(n, (tp,), TopicPartition("log", tp.partition)) for n, tp in (("a", A), ("b", B))]


def runner(task: Task, rt: Runtime, stores: dict[str, RocksKV]) -> TaskRunner:
    """``task`` as opened on its empty store, its input at offset 0."""
    r = TaskRunner(task, rt.factory, rt.cfg, Producer())
    r.kv = Overlay(stores[task.name])
    (tp,) = task.inputs
    r.committed, r.next, r.fed = {tp: 0}, {tp: 0}, {tp: 0}
    return r


async def runtime(
    stores: dict[str, RocksKV], chunk: int = 500, opened: bool = True
) -> tuple[Runtime, dict[str, TaskRunner]]:
    """A runtime over a stand-in consumer, with the tasks of ``LAYOUT`` open (or none)."""
    # ticks never due: a tick's caught-up check would ask the broker
    cfg = Config(bootstrap="-", app="app", topics=("in",), state_dir="-", tick_ms=10**9,
                 chunk_records=chunk)  # fmt: skip
    rt = Runtime(cfg, lambda counts: LAYOUT, lambda task: Steps())
    await rt.consumer.stop()  # never started: only replaced
    await rt.reader.stop()
    rt.consumer = Consumer()
    for task in LAYOUT if opened else ():
        r = rt.tasks[task.name] = runner(task, rt, stores)
        r.last_tick = float("inf")
    aged(rt)
    return rt, rt.tasks


def aged(rt: Runtime) -> None:
    """Every task's last commit long ago: ``commit_min_ms`` is not what these tests see."""
    for r in rt.tasks.values():
        r.last_commit = -float("inf")


async def turn(rt: Runtime, fetched: dict[Any, Any]) -> None:
    aged(rt)
    await rt._turn(fetched)


async def settled(rt: Runtime) -> None:
    """Every commit in flight ended and taken."""
    for r in list(rt.tasks.values()):
        if r.committing is not None:
            await asyncio.wait([r.committing])
    await turn(rt, {})


def seen(r: TaskRunner) -> list[int]:
    assert isinstance(r.step, Steps)
    return r.step.seen


def test_a_task_commits_in_the_background_and_what_comes_meanwhile_goes_into_its_next_one(
    stores: dict[str, RocksKV],
) -> None:
    async def run() -> None:
        rt, t = await runtime(stores)
        pa = t["a"].producer
        pa.gate.clear()  # a's first commit hangs
        await turn(rt, batch(A, 0, 1) | batch(B, 0))
        assert t["a"].committing is not None and t["b"].committing is not None
        await asyncio.wait([t["b"].committing])
        # a still commits: b goes on, a's new records wait
        await turn(rt, batch(A, 2, 3) | batch(B, 1))
        await turn(rt, batch(A, 4))
        assert seen(t["b"]) == [0, 1] and seen(t["a"]) == [0, 1]
        assert [r.offset for r in t["a"].held] == [2, 3, 4]
        assert t["b"].producer.offsets == [{B: 1}]
        # the fetch ends when a's commit does, not at its timeout
        fetch = asyncio.ensure_future(rt._fetch())
        await asyncio.sleep(0)
        assert not fetch.done()
        pa.gate.set()
        assert await asyncio.wait_for(fetch, 5) == {}
        await turn(rt, {})
        assert seen(t["a"]) == [0, 1, 2, 3, 4]
        await settled(rt)
        assert pa.offsets == [{A: 2}, {A: 5}]  # the held records in one transaction
        assert t["a"].committed == {A: 5} and not t["a"].pending and not t["a"].held
        assert {k for k, _ in items(stores["a"])} == {b"o%d" % i for i in range(5)}

    asyncio.run(run())


def test_a_failed_commit_drops_what_was_held_and_replays_from_the_committed_offsets(
    stores: dict[str, RocksKV],
) -> None:
    async def run() -> None:
        rt, t = await runtime(stores)
        a = t["a"]
        pa = a.producer
        await turn(rt, batch(A, 0, 1))
        await settled(rt)
        assert a.committed == {A: 2}
        first_step = a.step
        pa.gate.clear()
        pa.fail = RuntimeError("the broker said no")
        await turn(rt, batch(A, 2))
        await turn(rt, batch(A, 3, 4))  # held behind the commit that will fail
        assert [r.offset for r in a.held] == [3, 4]
        pa.gate.set()
        await settled(rt)
        assert pa.aborts == 1 and pa.offsets == [{A: 2}]
        assert a.committed == a.next == a.fed == {A: 2} and not a.held and not a.pending
        assert rt.consumer.seeks[-1] == (A, 2) and A in rt.consumer.paused
        assert a.step is not first_step and seen(a) == []
        assert {k for k, _ in items(stores["a"])} == {b"o0", b"o1"}
        # replayed once resumed: the records come again from offset 2
        rt.paused["a"] = 0.0
        pa.fail = None
        await turn(rt, batch(A, 2, 3, 4))
        await settled(rt)
        assert seen(a) == [2, 3, 4] and pa.offsets == [{A: 2}, {A: 5}]

    asyncio.run(run())


def test_closing_a_task_waits_for_its_commit_then_commits_what_it_stepped(
    stores: dict[str, RocksKV],
) -> None:
    async def run() -> None:
        rt, t = await runtime(stores)
        a = t["a"]
        a.producer.gate.clear()
        await turn(rt, batch(A, 0, 1))
        await turn(rt, batch(A, 2))  # held: never stepped, so not committed
        closing = asyncio.ensure_future(rt._close(a))
        await asyncio.sleep(0.01)
        assert not closing.done(), "closed while its commit was in flight"
        a.producer.gate.set()
        await asyncio.wait_for(closing, 5)
        assert a.producer.offsets == [{A: 2}] and "a" not in rt.tasks

    asyncio.run(run())


def test_a_fetch_waits_for_records_when_no_commit_is_in_flight(
    stores: dict[str, RocksKV],
) -> None:
    async def run() -> None:
        rt, t = await runtime(stores)
        assert all(r.committing is None for r in t.values())
        consumer = rt.consumer
        assert isinstance(consumer, Consumer)
        consumer.fetched = batch(A, 0)
        fetch = asyncio.ensure_future(rt._fetch())
        await asyncio.sleep(0.01)
        assert not fetch.done()
        consumer.stop.set()
        assert await asyncio.wait_for(fetch, 5) == consumer.fetched

    asyncio.run(run())


def test_a_task_whose_commit_is_slow_holds_a_chunk_and_leaves_the_rest_in_kafka(
    stores: dict[str, RocksKV],
) -> None:
    async def run() -> None:
        rt, t = await runtime(stores, chunk=3)
        consumer, a = rt.consumer, t["a"]
        assert isinstance(consumer, Consumer)
        a.producer.gate.clear()
        await turn(rt, batch(A, 0))
        await turn(rt, batch(A, 1, 2))
        assert A not in consumer.paused  # two held: less than a chunk
        await turn(rt, batch(A, 3) | batch(B, 0))
        assert A in consumer.paused and B not in consumer.paused
        a.producer.gate.set()
        await settled(rt)  # the first commit; the held records stepped, the next begun
        assert A not in consumer.paused and seen(a) == [0, 1, 2, 3]
        await settled(rt)
        assert a.producer.offsets == [{A: 1}, {A: 4}]

    asyncio.run(run())


def test_a_task_steps_as_many_records_at_once_as_take_about_chunk_seconds() -> None:
    """A chunk holds the event loop, and with it the group's heartbeats: a task whose
    records are slow (raw pages under analysis) steps fewer of them at once."""
    cfg = Config(bootstrap="-", app="app", topics=("in",), state_dir="-",
                 chunk_records=500, chunk_seconds=0.2, first_chunk=16)  # fmt: skip
    r = TaskRunner(Task("a", (A,), TopicPartition("log", 0)), lambda task: Steps(), cfg, None)
    assert r.chunk_size() == 16  # its cost not known yet
    r.timed(16, 1.6)  # 0.1 s a record
    assert r.chunk_size() == 2
    r.timed(2, 4.0)  # slower than the whole budget a record: one at a time
    assert r.chunk_size() == 1
    r.timed(100, 0.001)  # cheap records: the most a chunk holds
    assert r.chunk_size() == 500
    r.timed(0, 0.0)  # nothing stepped says nothing
    assert r.chunk_size() == 500


def test_tasks_assigned_are_opened_by_the_loop_not_in_the_rebalance_callback(
    stores: dict[str, RocksKV], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka sends no heartbeat until ``on_partitions_assigned`` returns: were the tasks
    opened there, a restore longer than the session timeout would get the worker dropped
    from the group. The callback notes them, their inputs paused; the loop opens them."""

    async def run() -> None:
        rt, _ = await runtime(stores, opened=False)
        consumer = rt.consumer
        assert isinstance(consumer, Consumer)
        opened: list[str] = []

        async def open_task(task: Task, *_: Any, **__: Any) -> TaskRunner:
            opened.append(task.name)
            return runner(task, rt, stores)

        monkeypatch.setattr(TaskRunner, "open", open_task)
        await rt.assign({A, B})
        assert opened == [] and not rt.tasks
        assert set(rt.waiting) == {"a", "b"} and consumer.paused == {A, B}
        await rt._turn({})
        assert sorted(opened) == ["a", "b"] and set(rt.tasks) == {"a", "b"}
        assert not rt.waiting and not consumer.paused

    asyncio.run(run())
