"""The whole partitioned topology in memory: every task of ``neardup.flow``, the topics as
lists of records, a seeded scheduler, and crashes. Tests run it to show that any
partitioning, interleaving and crash decides as ``neardup dedup`` does.

Each task (analyse, hosts, buckets, decide: one per partition; order: one) reads its
partitions in offset order and commits as the Kafka runtime does: its outputs, its store
and its input offsets in one step. A *turn* of a task reads a few records (from its
partitions picked at random, each in order), ends with the task's ``tick`` and then
either commits or crashes. A crash drops the turn's store writes and outputs, rebuilds
the task from its store, and leaves its offsets where the last commit put them: the next
turn reads the same records again (exactly-once). Records carry their commit time on a
virtual clock, which is also every task's clock.

Analysis is pure and costly, so the analyse task here takes analysed pages (the raw
topic's records name them); it marks the hosts partitions with the greatest fetch order it
has read, as the Kafka analyse task does, drained once it has read all of its partition.

The raw pages are there from the start, or are written at given times, as a producer
writes them: each partition in fetch-time order, but a page up to the skew after pages of
later fetch times on other partitions; the hosts tasks allow for that ``skew``
(``NEARDUP_RAW_SKEW_MS``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from neardup.analysis import Analysed
from neardup.config import EngineConfig
from neardup.flow.buckets import BucketsTask
from neardup.flow.codec import decode, encode
from neardup.flow.decide import DECISIONS, MERGES, DecideTask
from neardup.flow.expiry import Horizon
from neardup.flow.hosts import HostsTask
from neardup.flow.messages import (
    HOSTS,
    ORDER,
    PAGES,
    PROBES,
    Edge,
    Mark,
    Out,
    PageIn,
    partition_of_host,
    partition_of_pid,
)
from neardup.flow.order import OrderTask
from neardup.store import MemoryKV

RAW = "raw"
TopicPartition = tuple[str, int]


class Overlay:
    """A task's store within a turn: reads through to the committed store, writes held
    until ``commit`` (then one ``write``) or dropped by ``drop``."""

    def __init__(self, base: MemoryKV) -> None:
        self.base = base
        self.puts: dict[bytes, bytes | None] = {}

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        got = self.base.get_many([k for k in keys if k not in self.puts])
        it = iter(got)
        return [self.puts[k] if k in self.puts else next(it) for k in keys]

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.puts.update(items)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self.puts.update((k, None) for k in keys)

    def delete_prefix(self, prefix: bytes) -> None:
        self.delete_many([k for k, _ in self.scan(prefix)])

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        for prefix in prefixes:
            self.delete_prefix(prefix)
        self.puts.update(records)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        merged: dict[bytes, bytes | None] = dict(self.base.scan(prefix))
        merged.update((k, v) for k, v in self.puts.items() if k.startswith(prefix))
        for k, v in sorted(merged.items()):
            if v is not None:
                yield k, v

    def close(self) -> None:
        pass

    def commit(self) -> None:
        self.base.write(list(self.puts.items()))
        self.puts.clear()

    def drop(self) -> None:
        self.puts.clear()


class Task(Protocol):
    """What the simulator asks of a task: take a record, end a turn, reload its state."""

    def step(self, raw: bytes, arrived: float) -> list[Out]: ...

    def end(self, idle: bool) -> list[Out]: ...

    def load(self) -> None: ...


class AnalyseTask:
    """Raw partition ``partition``: a record names an analysed page (by its index)."""

    def __init__(self, store: Overlay, pages: Sequence[Analysed], partition: int, n: int,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.store, self.pages, self.partition, self.n, self.clock = (
            store,
            pages,
            partition,
            n,
            clock,
        )
        self.high: int | None = None

    def load(self) -> None:
        (raw,) = self.store.get_many([b"high"])
        self.high = None if raw is None else int(raw)

    def step(self, raw: bytes, arrived: float) -> list[Out]:
        a = self.pages[int(raw)]
        self.high = a.order if self.high is None else max(self.high, a.order)
        self.store.put_many([(b"high", str(self.high).encode())])
        msg = PageIn((a.order, a.page.page_id), a)
        return [Out(HOSTS, partition_of_host(a.host, self.n), a.host.encode(), encode(msg))]

    def end(self, idle: bool) -> list[Out]:
        frontier = None if self.high is None else (self.high, "")
        mark = encode(Mark(self.partition, frontier, self.clock() if idle else None))
        return [Out(HOSTS, h, b"", mark) for h in range(self.n)]


class StageAdapter:
    """A partitioned stage (hosts, buckets, decide) as the simulator runs it: a turn ends
    with the stage's ``tick``, told whether the task is idle."""

    def __init__(
        self, task: HostsTask | BucketsTask | DecideTask, end: Callable[[bool], list[Out]]
    ) -> None:
        self.task, self._end = task, end

    def load(self) -> None:
        self.task.load()

    def step(self, raw: bytes, arrived: float) -> list[Out]:
        return self.task.step(raw, arrived)

    def end(self, idle: bool) -> list[Out]:
        return self._end(idle)


class OrderAdapter:
    def __init__(self, task: OrderTask, n: int) -> None:
        self.task, self.n = task, n
        self.horizon = Horizon(task.cfg.retention_days, n)

    def load(self) -> None:
        self.task.load()

    def step(self, raw: bytes, arrived: float) -> list[Out]:
        msg = decode(raw)
        if isinstance(msg, Edge):
            self.task.on_edge(msg, arrived, raw)
        elif isinstance(msg, Mark):
            self.task.on_mark(msg)
        return self._verdicts()

    def end(self, idle: bool) -> list[Out]:
        out = self._verdicts()
        self.task.flush()
        released = self.task.edges.released
        if released is not None:  # as ``OrderStep`` prunes, but on every turn
            self.task.prune(released[0])
        return out + [Out(PAGES, p, b"", raw) for p, raw in self.horizon.marks(self.task.edges.w)]

    def _verdicts(self) -> list[Out]:
        return [
            Out(PAGES, partition_of_pid(v.pid, self.n), v.key[1].encode(), encode(v))
            for v in self.task.release()
        ]


@dataclass
class Unit:
    """A task in the simulator: its inputs, committed offsets and store."""

    name: str
    inputs: list[TopicPartition]
    make: Callable[[Overlay], Task]
    store: MemoryKV = field(default_factory=MemoryKV)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.overlay = Overlay(self.store)
        self.task = self.make(self.overlay)
        self.task.load()


class Topology:
    """Every task over ``partitions`` partitions, fed ``pages`` (analysed) spread over the
    raw partitions; ``crash``: the chance that a turn crashes."""

    def __init__(
        self,
        pages: Sequence[Analysed],
        raw: Sequence[Sequence[int]],
        cfg: EngineConfig,
        rng: random.Random,
        *,
        crash: float = 0.0,
        written: Sequence[Sequence[float]] | None = None,
        skew: float = 0.0,
    ) -> None:
        """``raw``: the pages (indexes into ``pages``) in each raw partition, in order;
        there are as many partitions of every topic. ``written``: when each of them is
        written, beside ``raw`` (non-decreasing in each partition; None: all at the
        start). ``skew``: how long before a drained mark of an analyse task the
        hosts tasks take it to vouch for what arrived."""
        self.pages, self.cfg, self.n = pages, cfg, len(raw)
        self.rng, self.crash, self.now, self.skew = rng, crash, 0.0, skew
        self.logs: dict[TopicPartition, list[tuple[float, bytes]]] = {}
        #: Raw records not written yet, by partition: (when, record), in order.
        self.unwritten: dict[TopicPartition, list[tuple[float, bytes]]] = {}
        for i, part in enumerate(raw):
            times = [0.0] * len(part) if written is None else list(written[i])
            if len(times) != len(part) or times != sorted(times):
                raise ValueError(f"raw partition {i}: its write times do not fit its pages")
            self.logs[(RAW, i)] = []
            records = [(t, str(x).encode()) for t, x in zip(times, part, strict=True)]
            self.unwritten[(RAW, i)] = records[::-1]  # popped from the end
        self._write()
        self.published: list[Out] = []
        self.crashes = 0
        inputs = {"analyse": RAW, "hosts": HOSTS, "buckets": PROBES, "decide": PAGES}
        self.units = [
            Unit(f"{kind} {i}", [(topic, i)], functools.partial(self._task, kind, i))
            for i in range(self.n)
            for kind, topic in inputs.items()
        ]
        self.order = Unit("order", [(ORDER, 0)], functools.partial(self._task, "order", 0))
        self.units.append(self.order)

    def _task(self, kind: str, i: int, store: Overlay) -> Task:
        cfg, n, clock = self.cfg, self.n, self.clock
        if kind == "analyse":
            return AnalyseTask(store, self.pages, i, n, clock)
        if kind == "hosts":
            hosts = HostsTask(store, cfg, i, n, clock=clock, skew=self.skew)
            return StageAdapter(hosts, hosts.tick)
        if kind == "buckets":
            buckets = BucketsTask(store, cfg, i, n, clock=clock)
            return StageAdapter(buckets, lambda idle: buckets.tick())
        if kind == "decide":
            decide = DecideTask(store, cfg, i, n, clock=clock)
            return StageAdapter(decide, decide.tick)
        return OrderAdapter(OrderTask(store, cfg, n, clock=clock), n)

    def clock(self) -> float:
        return self.now

    def _write(self) -> None:
        """The raw records whose time has come, into their partitions."""
        for tp, pending in self.unwritten.items():
            while pending and pending[-1][0] <= self.now:
                self.logs[tp].append(pending.pop())

    def unread(self, unit: Unit) -> list[TopicPartition]:
        return [tp for tp in unit.inputs if unit.offsets.get(tp, 0) < len(self.logs.get(tp, ()))]

    def turn(self, unit: Unit, reads: int) -> None:
        """Up to ``reads`` records, the task's tick, then a commit or a crash."""
        self.now += 1.0
        self._write()
        offsets = dict(unit.offsets)
        out: list[Out] = []
        for _ in range(reads):
            ready = [tp for tp in unit.inputs if offsets.get(tp, 0) < len(self.logs.get(tp, ()))]
            if not ready:
                break
            tp = self.rng.choice(ready)
            at, raw = self.logs[tp][offsets.get(tp, 0)]
            offsets[tp] = offsets.get(tp, 0) + 1
            out += unit.task.step(raw, at)
        idle = all(offsets.get(tp, 0) >= len(self.logs.get(tp, ())) for tp in unit.inputs)
        out += unit.task.end(idle)
        if self.rng.random() < self.crash:
            self.crashes += 1
            unit.overlay.drop()
            unit.task = unit.make(unit.overlay)
            unit.task.load()
            return
        unit.overlay.commit()
        unit.offsets = offsets
        for o in out:
            if o.partition is None:
                self.published.append(o)
            else:
                self.logs.setdefault((o.topic, o.partition), []).append((self.now, o.value))

    def run(self, done: Callable[[list[Out]], bool], max_turns: int = 200_000) -> None:
        """Turns at random until ``done(published)``: a task with records to read, now and
        then one without (its tick: a timer that fires)."""
        for _ in range(max_turns):
            if done(self.published):
                break
            busy = [u for u in self.units if self.unread(u)]
            quiet = [u for u in self.units if u is not self.order]
            unit = self.rng.choice(busy if busy and self.rng.random() < 0.9 else quiet)
            self.turn(unit, self.rng.randint(1, 4))
        else:
            raise RuntimeError(f"no end after {max_turns} turns: {self.stalled()}")
        for _ in range(max_turns):  # what is still in flight, with no timer: must add nothing
            busy = [u for u in self.units if self.unread(u)]
            if not busy:
                return
            self.turn(self.rng.choice(busy), 4)

    def late(self) -> int:
        """Pages and edges that came behind a key already let go, in the tasks' current
        processes (a crash starts a task's counts afresh)."""
        total = 0
        for u in self.units:
            if isinstance(u.task, StageAdapter):
                total += u.task.task.counts["late"]
            elif isinstance(u.task, OrderAdapter):
                total += u.task.task.late
        return total

    def stalled(self) -> str:
        return ", ".join(f"{u.name}: {self.unread(u)}" for u in self.units if self.unread(u))


def decisions(published: Iterable[Out]) -> list[bytes]:
    return [o.value for o in published if o.topic == DECISIONS]


def merges(published: Iterable[Out]) -> list[bytes]:
    return [o.value for o in published if o.topic == MERGES]
