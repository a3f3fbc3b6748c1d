"""The toy world of ``tests/integration/test_delivery.py``: topics, a word-counting step,
workers in child processes, readers of the output and the sequential result.

The step counts words per key in the task's store and emits, for every input record,
``topic:partition:offset:count:worker``; ``reset`` deletes the word's count and ``wipe``
all of the task's counts (a prefix delete), so tombstones go through the changelog too.
Two tasks own partition i of a 2-partition topic; the task ``order`` owns a 1-partition
topic.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from neardup.kafka import runtime
from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Config, Out, Record
from neardup.kafka.taskstate import RESERVED, Overlay, items
from neardup.store import RocksKV
from tests.integration.helpers import Names

WORDS = [f"w{i}".encode() for i in range(12)]


@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def inp(self) -> str:
        return f"{self.prefix}.in"

    @property
    def solo(self) -> str:
        return f"{self.prefix}.solo"

    @property
    def out(self) -> str:
        return f"{self.prefix}.out"

    @property
    def changelog(self) -> str:
        return f"{self.prefix}-changelog"

    def layout(self, counts: Mapping[str, int]) -> list[Task]:
        """Task i owns partition i of the input; ``order`` the 1-partition topic."""
        n = counts.get(self.inp, 0)
        tasks = [
            Task(f"task-{i}", (TopicPartition(self.inp, i),), TopicPartition(self.changelog, i))
            for i in range(n)
        ]
        if self.solo in counts:
            solo, log = TopicPartition(self.solo, 0), TopicPartition(self.changelog, 2)
            tasks.append(Task("order", (solo,), log, group="order"))
        return tasks


@dataclass(frozen=True)
class Counter:
    """The toy step's factory; ``stall``: stall this worker's step on the value ``stall``
    until the file ``<signals>/release`` exists."""

    topics: Topics
    worker: str
    signals: str
    stall: bool = False

    def __call__(self, task: Task) -> WordCount:
        return WordCount(self, task)


@dataclass
class WordCount:
    cfg: Counter
    task: Task
    ready: bool = field(default=False)

    def on_records(self, records: Sequence[Record], kv: Overlay, out: Out) -> None:
        for r in records:
            assert r.key is not None
            key = b"c:" + r.key
            if r.value == b"stall" and self.cfg.stall:
                self._stall()
            if r.value == b"reset":
                kv.delete_many([key])
                count = 0
            elif r.value == b"wipe":
                kv.delete_prefix(b"c:")
                count = 0
            else:
                (raw,) = kv.get_many([key])
                count = int(raw or b"0") + 1
                kv.put_many([(key, str(count).encode())])
            value = f"{r.topic}:{r.partition}:{r.offset}:{count}:{self.cfg.worker}"
            out.send(self.cfg.topics.out, r.partition, r.key, value.encode())

    def on_tick(self, now: float, kv: Overlay, out: Out, caught_up: bool) -> None:
        if caught_up and not self.ready:
            self.ready = True
            (Path(self.cfg.signals) / f"ready-{self.cfg.worker}-{self.task.name}").touch()

    def _stall(self) -> None:
        """Block the worker's event loop (no heartbeats either) until released."""
        signals = Path(self.cfg.signals)
        (signals / f"stalled-{self.cfg.worker}").touch()
        deadline = time.monotonic() + 180
        while not (signals / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def _child(cfg: Config, topics: Topics, factory: Counter, log_path: str) -> None:
    logging.basicConfig(
        filename=log_path, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    runtime.run(cfg, topics.layout, factory)


class Worker:
    """A runtime in a child process."""

    def __init__(self, cfg: Config, topics: Topics, factory: Counter, log: Path) -> None:
        self.log = log
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(target=_child, args=(cfg, topics, factory, str(log)))
        self.proc.start()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(30)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join(60)
        assert self.proc.exitcode == 0, f"exit {self.proc.exitcode}:\n{self.text()}"

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


class Tail:
    """All records of a topic, read from the beginning in a background thread."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        self.values: list[bytes] = []
        self._stop = threading.Event()
        self._args = (bootstrap, topic, isolation)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        bootstrap, topic, isolation = self._args
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level=isolation,
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    self.values += [r.value for r in records]
        finally:
            await consumer.stop()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


# -- the stream and its sequential result ----------------------------------------------------


def make_inputs(topics: Topics, n: int, seed: int) -> list[tuple[str, int, bytes, bytes]]:
    """(topic, partition, key, value): mostly counts, some resets, a rare wipe."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        where = rng.choice([(topics.inp, 0), (topics.inp, 1), (topics.solo, 0)])
        roll = rng.random()
        value = b"reset" if roll < 0.03 else b"wipe" if roll < 0.035 else b"x"
        out.append((*where, rng.choice(WORDS), value))
    return out


def sequential(
    inputs: list[tuple[str, int, bytes, bytes]],
) -> tuple[dict[tuple[str, int, int], int], dict[tuple[str, int], dict[bytes, bytes]]]:
    """Each input's (topic, partition, offset) -> count, and each partition's final store,
    computing one record after another (offsets in produce order: one producer, acks)."""
    counts: dict[tuple[str, int], dict[bytes, int]] = {}
    offsets: dict[tuple[str, int], int] = {}
    emitted = {}
    for topic, partition, key, value in inputs:
        state = counts.setdefault((topic, partition), {})
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        if value == b"reset":
            state.pop(key, None)
            count = 0
        elif value == b"wipe":
            state.clear()
            count = 0
        else:
            count = state[key] = state.get(key, 0) + 1
        emitted[(topic, partition, offset)] = count
    stores = {
        tp: {b"c:" + k: str(v).encode() for k, v in state.items()} for tp, state in counts.items()
    }
    return emitted, stores


def parse(values: list[bytes]) -> list[tuple[tuple[str, int, int], int, str]]:
    out = []
    for v in values:
        topic, partition, offset, count, worker = v.decode().rsplit(":", 4)
        out.append(((topic, int(partition), int(offset)), int(count), worker))
    return out


def assert_exactly_once(committed: list[bytes], want: dict[tuple[str, int, int], int]) -> None:
    got = parse(committed)
    seen: dict[tuple[str, int, int], int] = {}
    doubled = []
    for where, count, _ in got:
        if where in seen:
            doubled.append(where)
        seen[where] = count
    assert not doubled, f"{len(doubled)} inputs with more than one output, e.g. {doubled[:3]}"
    missing = want.keys() - seen.keys()
    assert not missing, f"{len(missing)} inputs without output, e.g. {sorted(missing)[:3]}"
    wrong = {w: (seen[w], c) for w, c in want.items() if seen[w] != c}
    assert not wrong, f"{len(wrong)} counts differ from a sequential run: {list(wrong.items())[:3]}"


def wait_outputs(tail: Tail, n: int, setup: Setup, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while len(tail.values) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(tail.values)} of {n} outputs after {timeout:.0f} s")
        time.sleep(0.2)


# -- Kafka -------------------------------------------------------------------------------------


def create(bootstrap: str, topics: Topics) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            compact = {"cleanup.policy": "compact"}
            await admin.create_topics(
                [
                    NewTopic(topics.inp, 2, 1),
                    NewTopic(topics.solo, 1, 1),
                    NewTopic(topics.out, 2, 1),
                    NewTopic(topics.changelog, 3, 1, topic_configs=compact),
                ]
            )
        finally:
            await admin.close()

    asyncio.run(run())


def produce(bootstrap: str, records: list[tuple[str, int, bytes, bytes]]) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            futures = [
                await producer.send(t, value=v, key=k, partition=p) for t, p, k, v in records
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


def changelog_state(bootstrap: str, tp: TopicPartition) -> dict[bytes, bytes]:
    """What the changelog partition holds for the step, read_committed: each key's last
    value (the runtime's own records, the state's format, left out)."""

    async def run() -> dict[bytes, bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
        )
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            state: dict[bytes, bytes | None] = {}
            while await consumer.position(tp) < end:
                for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    state[r.key] = r.value
            mine = (k for k in state if not k.startswith(RESERVED))
            return {k: v for k in mine if (v := state[k]) is not None}
        finally:
            await consumer.stop()

    return asyncio.run(run())


def store_items(state_dir: Path, task: str) -> dict[bytes, bytes]:
    kv = RocksKV(str(state_dir / task), read_only=True)
    try:
        return dict(items(kv))
    finally:
        kv.close()


@dataclass
class Setup:
    bootstrap: str
    tmp: Path
    topics: Topics = field(default_factory=lambda: Topics(Names().prefix))
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        create(self.bootstrap, self.topics)
        (self.tmp / "signals").mkdir()

    def config(self, name: str) -> Config:
        t = self.topics
        return Config(
            bootstrap=self.bootstrap,
            app=t.prefix,
            topics=(t.inp, t.solo),
            state_dir=str(self.tmp / f"state-{name}"),
            session_timeout_ms=6000,
        )

    def worker(self, name: str, *, stall: bool = False, cfg: Config | None = None) -> Worker:
        factory = Counter(self.topics, name, str(self.tmp / "signals"), stall)
        log = self.tmp / f"{name}-{len(self.workers)}.log"
        w = Worker(cfg or self.config(name), self.topics, factory, log)
        self.workers.append(w)
        return w

    def signal(self, name: str) -> Path:
        return self.tmp / "signals" / name

    def logs(self) -> str:
        return "\n".join(f"--- {w.log.name}\n{w.text()[-6000:]}" for w in self.workers)
