"""Exactly-once tasks over aiokafka: what a step sees, and the commit step.

A task (``neardup.kafka.assignor.Task``) reads its input partitions, keeps state in its
own RocksDB store and writes to any topic, through one transactional producer with the
stable id ``<app>-<task>``. The worker (``neardup.kafka.runtime``) runs a ``TaskRunner``
per task it was dealt. Nothing here knows a stage: a step gets records, a key-value
overlay (``neardup.kafka.taskstate.Overlay``) and an ``Out``.

The commit step is ``TaskRunner.commit``, in one place. Outputs are buffered until the
commit, so a transaction is open only while it commits (tens of milliseconds), and
``transaction_timeout_ms`` need not cover a step, only a slow commit. What it bounds,
when no new owner re-initialises a dead worker's producer id, is how long that worker's
open transaction holds back every read_committed reader of the partitions it wrote to
(the timeout plus the broker's abort sweep). 15 s: longer than the session timeout
(10 s), after which the group gives the task to another worker, whose producer start
aborts the transaction at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError, ProducerFenced  # type: ignore[import-untyped]

from neardup.kafka.assignor import Task
from neardup.kafka.taskstate import Overlay, open_store
from neardup.store import SharedMemory, StateError

log = logging.getLogger("neardup.kafka")


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class Out:
    """A step's outputs, held until the task commits."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
        self.nbytes = 0

    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.pending.setdefault((topic, partition), []).append((key, value))
        self.nbytes += len(key or b"") + len(value or b"")


class Step(Protocol):
    """A task's processing. State lives in ``kv`` (anything else it keeps is dropped with
    the step when the runtime replays); outputs go to ``out``."""

    def on_records(self, records: Sequence[Record], kv: Overlay, out: Out) -> None: ...

    def on_tick(self, now: float, kv: Overlay, out: Out, caught_up: bool) -> None:
        """Called every ``tick_ms``. ``caught_up``: the task had read every input up to
        its last stable offset as of ``now`` (read from the broker after ``now``)."""


StepFactory = Callable[[Task], Step]


@dataclass(frozen=True)
class Config:
    bootstrap: str
    #: The group id, and the prefix of every task's transactional id.
    app: str
    topics: tuple[str, ...]
    #: Each task's store is ``<state_dir>/<task name>``.
    state_dir: str
    #: A task's commits start at least this far apart; one in flight delays the next.
    commit_min_ms: int = 50
    #: A batch of records is stepped in chunks; after a chunk, a task whose last commit
    #: started longer ago than this commits, and holds the rest of the batch until then.
    commit_max_ms: int = 250
    tick_ms: int = 100
    session_timeout_ms: int = 10_000
    #: The group consumer's static member name (``neardup.kafka.membership``); None: a
    #: dynamic member.
    group_instance_id: str | None = None
    #: See the module's docstring for why 15 s.
    transaction_timeout_ms: int = 15_000
    #: Buffered outputs and state writes that make a task commit early.
    max_pending_bytes: int = 16 << 20
    max_records: int = 5000
    #: The most records stepped at once, and how long a chunk should take (``TaskRunner.
    #: chunk_size``); a task's first chunk, its cost unknown, is ``first_chunk`` records.
    chunk_records: int = 500
    chunk_seconds: float = 0.2
    first_chunk: int = 16
    auto_offset_reset: str = "earliest"
    #: Extra keyword arguments for every client (security: ``security.aiokafka_kwargs``).
    client: Mapping[str, Any] = field(default_factory=dict)
    #: Each changelog's ``delete.retention.ms``: a store away longer is restored afresh.
    delete_retention_ms: Mapping[str, int] = field(default_factory=dict)
    #: The RocksDB memory all the worker's task stores share; None: a store's own each.
    memory: SharedMemory | None = None

    def __post_init__(self) -> None:
        if not self.app or not self.topics:
            raise ValueError("the runtime needs an app id and at least one input topic")
        if not 0 < self.commit_min_ms <= self.commit_max_ms:
            raise ValueError(
                f"commit_min_ms ({self.commit_min_ms}) must be above 0 and at most "
                f"commit_max_ms ({self.commit_max_ms})"
            )
        counts = (self.tick_ms, self.max_records, self.chunk_records, self.first_chunk)
        if min(*counts, self.max_pending_bytes) < 1 or self.chunk_seconds <= 0:
            raise ValueError(
                "tick_ms, max_records, chunk_records, first_chunk, max_pending_bytes: at "
                "least 1; chunk_seconds: above 0"
            )
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(
                f"auto_offset_reset: earliest or latest, not {self.auto_offset_reset!r}"
            )


class ProducerBrokenError(Exception):
    """The task cannot go on (its producer's abort failed, or its store's write after a
    commit): it is closed and opened again, which restores the store."""


class FencedError(ProducerBrokenError):
    """The task's producer id was taken by a newer instance."""


class TaskRunner:
    """One task on this worker: its step, overlay, outputs, producer and offsets."""

    def __init__(self, task: Task, factory: StepFactory, cfg: Config, producer: Any) -> None:
        self.task, self.factory, self.cfg, self.producer = task, factory, cfg, producer
        self.step = factory(task)
        self.kv: Overlay | None = None
        self.out = Out()
        self.committed: dict[Any, int] = {}
        #: The offsets after the records stepped (what the next commit sends).
        self.next: dict[Any, int] = {}
        #: The offsets after the records taken from fetches, stepped or ``held``.
        self.fed: dict[Any, int] = {}
        #: Records fetched but not stepped yet: a task steps nothing while it commits.
        self.held: list[Record] = []
        self.held_bytes = 0
        #: The commit in flight, if any (``Runtime`` starts it and collects its result).
        self.committing: asyncio.Future[Any] | None = None
        #: When the last commit started.
        self.last_commit = time.monotonic()
        self.last_tick = 0.0
        #: Failed steps or commits in a row.
        self.failures = 0
        #: Seconds a record of this task takes to step, as last measured (None: not yet).
        self.per_record: float | None = None

    @classmethod
    async def open(
        cls,
        task: Task,
        factory: StepFactory,
        cfg: Config,
        *,
        consumer: Any,
        reader: Any,
        restore_lock: asyncio.Lock,
    ) -> TaskRunner:
        """Start the producer (InitProducerId completes or aborts what a previous owner
        left open, and fences it), restore the store from its changelog (with ``reader``,
        one task at a time), seek ``consumer`` to the committed offsets."""
        producer = AIOKafkaProducer(
            bootstrap_servers=cfg.bootstrap,
            transactional_id=f"{cfg.app}-{task.name}",
            transaction_timeout_ms=cfg.transaction_timeout_ms,
            # AddOffsetsToTxn and EndTxn retry on CONCURRENT_TRANSACTIONS after this
            # backoff while the previous commit's markers are written: 100 ms (the
            # default) made each commit wait about 76 ms, 10 ms about 28
            retry_backoff_ms=10,
            max_batch_size=256 << 10,
            **cfg.client,
        )
        runner = cls(task, factory, cfg, producer)
        try:
            await producer.start()
            await producer.begin_transaction()  # waits for InitProducerId
            await producer.commit_transaction()  # empty: nothing is sent
            async with restore_lock:
                path = os.path.join(cfg.state_dir, task.name)
                retention = cfg.delete_retention_ms.get(task.changelog.topic)
                store = await open_store(
                    path,
                    task.changelog,
                    reader,
                    delete_retention_ms=retention,
                    memory=cfg.memory,
                )
                runner.kv = Overlay(store)
            for tp in task.inputs:
                offset = await consumer.committed(tp)
                if offset is not None:
                    consumer.seek(tp, offset)
                elif cfg.auto_offset_reset == "earliest":
                    await consumer.seek_to_beginning(tp)
                else:
                    await consumer.seek_to_end(tp)
                if offset is None:
                    offset = await consumer.position(tp)
                runner.committed[tp] = runner.next[tp] = runner.fed[tp] = offset
        except BaseException:
            await runner.close()
            raise
        log.info("task %s open at %s", task.name, runner.committed)
        return runner

    @property
    def pending(self) -> bool:
        assert self.kv is not None
        return bool(self.out.pending or self.kv.dirty or self.next != self.committed)

    def feed(self, batch: Mapping[Any, Sequence[Any]]) -> int:
        """Hold the records of ``batch`` for this task that it has not taken yet; how many."""
        held = self.held
        n = len(held)
        for tp in self.task.inputs:
            start, topic, partition = self.fed[tp], tp.topic, tp.partition
            for r in batch.get(tp, ()):
                if r.offset >= start:
                    held.append(Record(topic, partition, r.offset, r.key, r.value, r.timestamp))
                    self.held_bytes += len(r.key or b"") + len(r.value or b"")
                    self.fed[tp] = r.offset + 1
        return len(held) - n

    def take(self, n: int) -> list[Record]:
        """The first ``n`` held records, no longer held."""
        records, self.held = self.held[:n], self.held[n:]
        self.held_bytes -= sum(len(r.key or b"") + len(r.value or b"") for r in records)
        return records

    def chunk_size(self) -> int:
        """How many held records to step at once: as many as take about
        ``Config.chunk_seconds``, at most ``chunk_records``. A step holds the worker's event
        loop, and with it the group heartbeats and the other tasks' commits: a chunk of
        raw pages, seconds of analysis on a loaded machine, would let the session expire."""
        n = self.cfg.chunk_records
        if self.per_record is None:
            return min(n, self.cfg.first_chunk)
        return max(1, min(n, int(self.cfg.chunk_seconds / max(self.per_record, 1e-9))))

    def timed(self, records: int, seconds: float) -> None:
        """Note that ``records`` took ``seconds`` to step (the clock's time, load included:
        what the event loop waited)."""
        if records:
            self.per_record = seconds / records

    def holds_enough(self) -> bool:
        """Whether the held records fill a chunk, or the pending bytes' cap: enough for
        the next transaction, and what bounds the memory of a task whose commit is slow."""
        return (
            len(self.held) >= self.cfg.chunk_records
            or self.held_bytes >= self.cfg.max_pending_bytes
        )

    def stepped(self, records: Sequence[Record]) -> None:
        """``records`` are stepped: the next commit covers them (TopicPartition is a named
        tuple, so a (topic, partition) pair finds it)."""
        for r in records:
            self.next[(r.topic, r.partition)] = r.offset + 1

    def due(self, now: float, mid_batch: bool) -> bool:
        """Whether to commit now: something to commit, no commit in flight, and the last
        one started long enough ago (or enough is buffered)."""
        if self.committing is not None or not self.pending:
            return False
        assert self.kv is not None
        age_ms = (now - self.last_commit) * 1000
        if self.out.nbytes + self.kv.nbytes >= self.cfg.max_pending_bytes:
            return True
        return age_ms >= (self.cfg.commit_max_ms if mid_batch else self.cfg.commit_min_ms)

    async def commit(self, group_id: str) -> float:
        """The commit step: begin; send the outputs and the overlay's dirty keys (the
        changelog; a delete is a tombstone), then the input offsets; commit; only then write
        the overlay to RocksDB with the changelog offset reached. Returns its duration.
        Raises ``FencedError``, or the error after aborting (the caller rewinds)."""
        kv, p = self.kv, self.producer
        assert kv is not None
        start = time.perf_counter()
        self.last_commit = time.monotonic()
        sent: list[tuple[Any, int]] = []
        changelog: list[tuple[Any, int]] = []
        try:
            await p.begin_transaction()
            for (topic, partition), msgs in self.out.pending.items():
                await self._send(topic, partition, msgs, sent)
            cl = self.task.changelog
            await self._send(cl.topic, cl.partition, list(kv.dirty.items()), changelog)
            offsets = {tp: n for tp, n in self.next.items() if n != self.committed[tp]}
            if offsets:
                await p.send_offsets_to_transaction(offsets, group_id)
            await asyncio.gather(*(f for f, _ in sent + changelog))
            await p.commit_transaction()
        except ProducerFenced as exc:
            _forget(sent + changelog)
            raise FencedError(self.task.name) from exc
        except Exception as error:
            _forget(sent + changelog)
            try:
                await p.abort_transaction()
            except Exception as exc:
                raise ProducerBrokenError(
                    f"{self.task.name}: the abort failed too ({exc!r})"
                ) from exc
            if isinstance(error, KafkaError):
                # a batch the broker refused leaves the producer's sequence numbers behind
                # the broker's: every later send of this producer would fail. A new one
                # (a new producer id) starts afresh
                raise ProducerBrokenError(f"{self.task.name}: {error!r}") from error
            raise
        reached = None
        if changelog:
            future, count = changelog[-1]
            reached = future.result().offset + count
        self.out = Out()
        self.committed = dict(self.next)
        try:
            kv.flush(reached)
        except Exception as exc:
            # committed: a replay would double it. A store that cannot be written (a full
            # disk) stops the worker; the next start catches it up from its changelog
            path = os.path.join(self.cfg.state_dir, self.task.name)
            raise StateError(f"cannot write the task store {path}: {exc}") from exc
        return time.perf_counter() - start

    async def _send(
        self,
        topic: str,
        partition: int,
        msgs: Sequence[tuple[bytes | None, bytes | None]],
        sent: list[tuple[Any, int]],
    ) -> None:
        """``msgs`` in as few batches as fit; each batch's future and record count to
        ``sent`` as it goes (a send that fails leaves the earlier ones there to retrieve)."""
        p = self.producer
        batch = p.create_batch()
        for key, value in msgs:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full
                count = batch.record_count()
                sent.append((await p.send_batch(batch, topic, partition=partition), count))
                batch = p.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        if count := batch.record_count():
            sent.append((await p.send_batch(batch, topic, partition=partition), count))

    def rewind(self, consumer: Any) -> None:
        """Drop everything since the last commit (a new step object too, and the held
        records) and read again from the committed offsets."""
        assert self.kv is not None and self.committing is None
        self.kv.drop()
        self.out = Out()
        self.step = self.factory(self.task)
        for tp, offset in self.committed.items():
            consumer.seek(tp, offset)
        self.next = dict(self.committed)
        self.drop_held()

    def drop_held(self) -> None:
        """Forget the held records: the next records taken are those after ``next``."""
        self.fed, self.held, self.held_bytes = dict(self.next), [], 0

    async def close(self) -> None:
        kv, self.kv = self.kv, None
        try:
            if kv is not None:
                kv.drop()
                kv.store.close()
        finally:
            await self.producer.stop()


def _forget(sent: Sequence[tuple[Any, int]]) -> None:
    """Retrieve the errors of an aborted transaction's batches (the abort reports them)."""
    for future, _ in sent:
        future.add_done_callback(lambda f: f.cancelled() or f.exception())


def quiet_fenced(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler while tasks run (``Runtime.start`` sets it): no
    "exception was never retrieved" for a ``ProducerFenced``, which aiokafka also sets on
    futures of its own that nothing awaits (a queued batch's drain waiter, the
    transaction's waiter) when the commit has raised it (``FencedError``)."""
    message = str(context.get("message", ""))
    fenced = isinstance(context.get("exception"), ProducerFenced)
    if not (fenced and message.endswith("exception was never retrieved")):
        loop.default_exception_handler(context)
