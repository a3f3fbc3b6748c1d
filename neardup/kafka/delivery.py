"""Exactly-once tasks over aiokafka: what a step sees, and the commit step.

A task (``neardup.kafka.assignor.Task``) reads its input partitions, keeps state in its
own RocksDB store and writes to any topic, through one transactional producer with the
stable id ``<app>-<task>``. The worker (``neardup.kafka.runtime``) runs a ``TaskRunner``
per task it was dealt. Nothing here knows a stage: a step gets records, a key-value
overlay (``neardup.kafka.taskstate.Overlay``) and an ``Out``.

The commit step (``TaskRunner.commit``), in one place: begin; send the buffered outputs
and the overlay's dirty keys (the changelog; a delete is a tombstone) as one batch per
partition; send the input offsets reached; commit; only then write the overlay to RocksDB
together with the changelog offset reached. Any error before the commit: abort, drop the
overlay, seek the inputs back to the committed offsets, replay. ``ProducerFenced``: the
task has a new owner; it is dropped without writing anything.

Outputs are buffered until the commit, so a transaction is open only while it commits
(tens of milliseconds). ``transaction_timeout_ms`` therefore need not cover a step, only a
slow commit; what it bounds, when no new owner re-initialises a dead worker's producer
id, is how long that worker's open transaction holds back every read_committed reader of
the partitions it wrote to (the timeout plus the broker's abort sweep). 15 s: longer than
the session timeout (10 s), after which the group gives the task to another worker, whose
producer start aborts the transaction at once.
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
from neardup.store import StateError

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
    commit_min_ms: int = 50
    #: A batch of records is stepped in chunks; after a chunk, a task whose last commit
    #: is older than this commits without waiting for the batch's end.
    commit_max_ms: int = 250
    tick_ms: int = 100
    session_timeout_ms: int = 10_000
    #: See the module's docstring for why 15 s.
    transaction_timeout_ms: int = 15_000
    #: Buffered outputs and state writes that make a task commit early.
    max_pending_bytes: int = 16 << 20
    max_records: int = 5000
    chunk_records: int = 500
    auto_offset_reset: str = "earliest"
    #: Extra keyword arguments for every client (security: ``security.aiokafka_kwargs``).
    client: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.app or not self.topics:
            raise ValueError("the runtime needs an app id and at least one input topic")
        if not 0 < self.commit_min_ms <= self.commit_max_ms:
            raise ValueError(
                f"commit_min_ms ({self.commit_min_ms}) must be above 0 and at most "
                f"commit_max_ms ({self.commit_max_ms})"
            )
        if min(self.tick_ms, self.max_records, self.chunk_records, self.max_pending_bytes) < 1:
            raise ValueError("tick_ms, max_records, chunk_records, max_pending_bytes: at least 1")
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
        self.next: dict[Any, int] = {}
        self.last_commit = time.monotonic()
        self.last_tick = 0.0
        #: Failed steps or commits in a row.
        self.failures = 0

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
                runner.kv = Overlay(await open_store(path, task.changelog, reader))
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
                runner.committed[tp] = runner.next[tp] = offset
        except BaseException:
            await runner.close()
            raise
        log.info("task %s open at %s", task.name, runner.committed)
        return runner

    @property
    def pending(self) -> bool:
        assert self.kv is not None
        return bool(self.out.pending or self.kv.dirty or self.next != self.committed)

    def feed(self, batch: Mapping[Any, Sequence[Any]]) -> list[Record]:
        """The records of ``batch`` for this task that it has not read yet."""
        records: list[Record] = []
        for tp in self.task.inputs:
            start, topic, partition = self.next[tp], tp.topic, tp.partition
            for r in batch.get(tp, ()):
                if r.offset >= start:
                    records.append(Record(topic, partition, r.offset, r.key, r.value, r.timestamp))
        return records

    def stepped(self, records: Sequence[Record]) -> None:
        """``records`` are stepped: the next commit covers them (TopicPartition is a named
        tuple, so a (topic, partition) pair finds it)."""
        for r in records:
            self.next[(r.topic, r.partition)] = r.offset + 1

    def due(self, now: float, mid_batch: bool) -> bool:
        if not self.pending:
            return False
        assert self.kv is not None
        age_ms = (now - self.last_commit) * 1000
        if self.out.nbytes + self.kv.nbytes >= self.cfg.max_pending_bytes:
            return True
        return age_ms >= (self.cfg.commit_max_ms if mid_batch else self.cfg.commit_min_ms)

    async def commit(self, group_id: str) -> float:
        """The commit step; returns its duration. Raises ``FencedError``, or the error after
        aborting (the caller rewinds)."""
        kv, p = self.kv, self.producer
        assert kv is not None
        start = time.perf_counter()
        sent: list[tuple[Any, int]] = []
        changelog: list[tuple[Any, int]] = []
        try:
            await p.begin_transaction()
            for (topic, partition), msgs in self.out.pending.items():
                sent += await self._send(topic, partition, msgs)
            cl = self.task.changelog
            changelog = await self._send(cl.topic, cl.partition, list(kv.dirty.items()))
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
        self.last_commit = time.monotonic()
        try:
            kv.flush(reached)
        except Exception as exc:
            # committed: a replay would double it. A store that cannot be written (a full
            # disk) stops the worker; the next start catches it up from its changelog
            path = os.path.join(self.cfg.state_dir, self.task.name)
            raise StateError(f"cannot write the task store {path}: {exc}") from exc
        return time.perf_counter() - start

    async def _send(
        self, topic: str, partition: int, msgs: Sequence[tuple[bytes | None, bytes | None]]
    ) -> list[tuple[Any, int]]:
        """``msgs`` in as few batches as fit; each batch's future and record count."""
        p, sent = self.producer, []
        batch = p.create_batch()
        for key, value in msgs:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full
                count = batch.record_count()
                sent.append((await p.send_batch(batch, topic, partition=partition), count))
                batch = p.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        if count := batch.record_count():
            sent.append((await p.send_batch(batch, topic, partition=partition), count))
        return sent

    def rewind(self, consumer: Any) -> None:
        """Drop everything since the last commit (a new step object too) and read again
        from the committed offsets."""
        assert self.kv is not None
        self.kv.drop()
        self.out = Out()
        self.step = self.factory(self.task)
        for tp, offset in self.committed.items():
            consumer.seek(tp, offset)
        self.next = dict(self.committed)

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
