"""The partitioned topology's tasks as the runtime runs them: records in, the stages of
``neardup.flow`` in between, records out (``neardup.kafka.topology`` names the tasks).

Each task's step object is made anew after an aborted transaction, and reads its state
again from the store; nothing it keeps in memory outlives a replay.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from aiokafka.partitioner import murmur2  # type: ignore[import-untyped]

from neardup.analysis import Analysed, Stats
from neardup.config import EngineConfig
from neardup.flow.buckets import BucketsTask
from neardup.flow.decide import DecideTask
from neardup.flow.hosts import HostsTask
from neardup.flow.messages import (
    HOSTS,
    Mark,
    Out,
    PageIn,
    WireError,
    encode,
    partition_of_host,
)
from neardup.flow.order import OrderStep
from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.stage import analyse_messages
from neardup.kafka.topology import ANALYSE, PART, Topics
from neardup.records import Rejected

log = logging.getLogger("neardup.kafka")

_HIGH = b"high"  # an analyse task's greatest fetch order read (decimal)


class Prefixed:
    """One stage's keys in a task store shared by several stages: every key under
    ``prefix``."""

    def __init__(self, kv: Any, prefix: bytes) -> None:
        self.kv, self.prefix = kv, prefix

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        p = self.prefix
        return list(self.kv.get_many([p + k for k in keys]))

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        p = self.prefix
        self.kv.put_many((p + k, v) for k, v in items)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        p = self.prefix
        self.kv.delete_many(p + k for k in keys)

    def delete_prefix(self, prefix: bytes) -> None:
        self.kv.delete_prefix(self.prefix + prefix)

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        p = self.prefix
        self.kv.write([(p + k, v) for k, v in records], [p + x for x in prefixes])

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        n = len(self.prefix)
        for k, v in self.kv.scan(self.prefix + prefix):
            yield k[n:], v

    def close(self) -> None:
        pass


class Sender:
    """Sends the stages' records (``neardup.flow.messages.Out``) to their real topics; a
    record without a partition goes where Kafka's default partitioner puts its key."""

    def __init__(self, topics: Topics, partitions: Callable[[str], int]) -> None:
        self.by_role = topics.by_role()
        self.partitions = partitions

    def send(self, sink: Sink, outs: Iterable[Out]) -> None:
        for o in outs:
            topic = self.by_role[o.topic]
            part = o.partition
            if part is None:
                part = (murmur2(o.key) & 0x7FFFFFFF) % self.partitions(topic)
            sink.send(topic, part, o.key, o.value)


class Marks:
    """When a task sends its mark: whenever it changes, and, while the task is drained,
    again every ``interval`` seconds (a drained mark's time vouches for what reached the
    downstream partitions before it; sent on every tick it would make a transaction a
    tick of every idle task)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = -math.inf

    def drained_due(self, now: float, caught_up: bool) -> bool:
        if not caught_up or now - self.last < self.interval:
            return False
        self.last = now
        return True


class AnalyseStep:
    """``analyse-j``: raw pages to analysed pages (to their host's partition) or
    rejections; its mark: the greatest fetch time read."""

    def __init__(self, j: int, ctx: Context) -> None:
        self.j, self.ctx = j, ctx
        self.high: int | None = None
        self.loaded = False
        self.sent: Mark | None = None
        self.marks = Marks(ctx.mark_interval)
        self.stats = Stats()

    def _load(self, kv: Any) -> None:
        if not self.loaded:
            (raw,) = kv.get_many([_HIGH])
            self.high = None if raw is None else int(raw)
            self.loaded = True

    def on_records(self, records: Sequence[Record], kv: Any, out: Sink) -> None:
        self._load(kv)
        ctx = self.ctx
        results = analyse_messages([r.value for r in records], ctx.cfg, self.stats, ctx.sandbox)
        outs: list[Out] = []
        for a in results:
            if isinstance(a, Rejected):
                body = a.to_json()
                key = (a.page_id or "").encode()
                outs.append(Out("rejects", None, key, ctx.json(body)))
                continue
            outs.append(self._page_in(a))
        ctx.sender.send(out, outs)
        if self.high is not None:
            kv.put_many([(_HIGH, str(self.high).encode())])

    def _page_in(self, a: Analysed) -> Out:
        self.high = a.order if self.high is None else max(self.high, a.order)
        part = partition_of_host(a.host, self.ctx.partitions)
        value = encode(PageIn((a.order, a.page.page_id), a))
        return Out(HOSTS, part, a.host.encode("utf-8", "surrogatepass"), value)

    def on_tick(self, now: float, kv: Any, out: Sink, caught_up: bool) -> None:
        self._load(kv)
        drained = self.marks.drained_due(now, caught_up)
        frontier = None if self.high is None else (self.high, "")
        mark = Mark(self.j, frontier, now if drained else None)
        if not drained and self.sent is not None and self.sent.frontier == frontier:
            return  # nothing new: an earlier drained mark still stands downstream
        self.sent = mark
        raw = encode(mark)
        self.ctx.sender.send(out, [Out(HOSTS, h, b"", raw) for h in range(self.ctx.partitions)])


class PartStep:
    """``part-i``: the hosts, buckets and decide stages of partition ``i``, each with its
    keys under its own prefix of the task's store."""

    def __init__(self, i: int, ctx: Context) -> None:
        self.i, self.ctx = i, ctx
        self.stages: tuple[HostsTask, BucketsTask, DecideTask] | None = None

    def _stages(self, kv: Any) -> tuple[HostsTask, BucketsTask, DecideTask]:
        if self.stages is None:
            c, i, n = self.ctx, self.i, self.ctx.partitions
            kw: dict[str, Any] = {"wait": c.order_wait, "clock": c.clock}
            hosts = HostsTask(Prefixed(kv, b"h"), c.cfg, i, n, sources=c.raw_partitions, **kw)
            buckets = BucketsTask(Prefixed(kv, b"b"), c.cfg, i, n, **kw)
            decide = DecideTask(Prefixed(kv, b"d"), c.cfg, i, n, **kw)
            self.stages = (hosts, buckets, decide)
        return self.stages

    def on_records(self, records: Sequence[Record], kv: Any, out: Sink) -> None:
        hosts, buckets, decide = self._stages(kv)
        topics, send = self.ctx.topics, self.ctx.sender.send
        for r in records:
            if r.value is None:
                raise WireError(f"a record without a value at {r.topic}[{r.partition}] {r.offset}")
            arrived = r.timestamp / 1000
            if r.topic == topics.hosts:
                send(out, hosts.step(r.value, arrived))
            elif r.topic == topics.probes:
                send(out, buckets.step(r.value, arrived))
            else:
                send(out, decide.step(r.value, arrived))

    def on_tick(self, now: float, kv: Any, out: Sink, caught_up: bool) -> None:
        # Marks are in-band: a source's mark comes after everything it vouches for, so a
        # stage that has read its sources' drained marks and holds nothing is drained as
        # of the oldest of their times, whatever else waits unread in its partitions (its
        # own reading position says nothing: the marks themselves keep it behind).
        hosts, buckets, decide = self._stages(kv)
        send = self.ctx.sender.send
        send(out, hosts.tick(True, as_of=math.inf))
        send(out, buckets.tick())
        send(out, decide.tick(True))


class Context:
    """What every task of one worker shares: settings, topics, the analysis sandbox."""

    def __init__(
        self,
        cfg: EngineConfig,
        topics: Topics,
        partitions: int,
        raw_partitions: int,
        *,
        order_wait: float,
        mark_interval: float,
        sandbox: Any = None,
        clock: Callable[[], float] = time.time,
        counts: Mapping[str, int] | None = None,
    ) -> None:
        """``counts``: each topic's partitions as the brokers have them (default: as the
        worker makes them)."""
        self.cfg, self.topics = cfg, topics
        self.partitions, self.raw_partitions = partitions, raw_partitions
        self.order_wait, self.mark_interval = order_wait, mark_interval
        self.sandbox, self.clock = sandbox, clock
        have = dict(topics.partitions(partitions, raw_partitions))
        have.update(counts or {})
        self.sender = Sender(topics, lambda t: have[t])

    @staticmethod
    def json(body: dict[str, Any]) -> bytes:
        import orjson

        return orjson.dumps(body)

    def step(self, task: Task) -> AnalyseStep | PartStep | OrderStep:
        """The step object of ``task`` (the runtime's ``StepFactory``)."""
        if task.group == ANALYSE:
            return AnalyseStep(int(task.name.rsplit("-", 1)[1]), self)
        if task.group == PART:
            return PartStep(int(task.name.rsplit("-", 1)[1]), self)
        return OrderStep(
            self.cfg,
            self.partitions,
            self.topics.pages,
            self.partitions,
            wait=self.order_wait,
            clock=self.clock,
        )
