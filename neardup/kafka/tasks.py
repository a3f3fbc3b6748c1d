"""The partitioned topology's tasks as the runtime runs them: records in, the stages of
``neardup.flow`` in between, records out (``neardup.kafka.topology`` names the tasks).

Each task's step object is made anew after an aborted transaction, and reads its state
again from the store; nothing it keeps in memory outlives a replay, so a stored message
that does not decode stops the worker (``StateError``) rather than replay forever.

A record on an internal topic that no version reads goes to the dead-letter topic and the
task goes on (``Unreadable``; docs/kafka.md, Failures). A lost mark holds nothing back for
long: marks say where their source is, not what changed, and the source's next mark says
it again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from aiokafka.partitioner import murmur2  # type: ignore[import-untyped]

from neardup.analysis import Analysed, Stats
from neardup.config import EngineConfig
from neardup.flow.analyse import analyse_messages
from neardup.flow.buckets import BucketsTask
from neardup.flow.codec import encode
from neardup.flow.decide import DecideTask
from neardup.flow.hosts import HostsTask
from neardup.flow.messages import (
    HOSTS,
    Mark,
    Out,
    PageIn,
    WireError,
    partition_of_host,
)
from neardup.flow.order import OrderStep
from neardup.flow.upkeep import dead_letter, lost_notice
from neardup.flow.watermark import key_from_bytes
from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.topology import ANALYSE, ORDER_TASK, PART, Topics
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


class Tally:
    """What this worker's tasks counted, for ``/metrics`` (``neardup.kafka.endpoint``):
    added up over the tasks' step objects, a replayed step counted again."""

    def __init__(self) -> None:
        #: Records read, by kind of task.
        self.records: Counter[str] = Counter()
        #: Dead letters, by kind of task and reason (a rejection's, or ``unreadable``: a
        #: record on an internal topic no version reads, or ``given_up``: a page whose
        #: record was lost).
        self.dead: Counter[tuple[str, str]] = Counter()
        #: The stages' own counts (``HostsTask.counts`` and the like), by stage and name.
        self.stages: Counter[tuple[str, str]] = Counter()

    def add(self, stage: str, now: Counter[str], before: Counter[str]) -> None:
        """Count ``now - before``, a stage's counts since they were ``before``."""
        for name, n in now.items():
            if n != before.get(name, 0):
                if name == "late" and n > before.get(name, 0):
                    log.warning(
                        "%d item(s) reached the %s stage after a later key had gone on "
                        "(late): taken at once, outside the order guarantee",
                        n - before.get(name, 0),
                        stage,
                    )
                self.stages[(stage, name)] += n - before.get(name, 0)
                before[name] = n


class Unreadable:
    """Records of an internal topic no version reads: each to the dead-letter topic, and,
    when its key names a page that waits for it, a ``lost_notice`` to the page's decide
    task."""

    def __init__(self, ctx: Context, kind: str) -> None:
        self.ctx, self.kind = ctx, kind

    def outs(self, r: Any, exc: Exception, name: str | None) -> list[Out]:
        where = f"{r.topic}[{r.partition}]@{r.offset}"
        log.warning("unreadable record at %s (%s): sent to the dead-letter topic", where, exc)
        self.ctx.tally.dead[(self.kind, "unreadable")] += 1
        out = [dead_letter(name, None, f"unreadable record at {where}: {exc}")]
        if name:
            out.append(lost_notice(name, self.ctx.partitions))
        return out

    def on_order(self, r: Any, exc: WireError, sink: Any) -> None:
        """``OrderStep``'s ``on_bad``: an edge is keyed by its page's key."""
        name = None
        if r.key and len(r.key) > 8:
            with contextlib.suppress(UnicodeDecodeError):
                name = key_from_bytes(r.key)[1]
        self.ctx.sender.send(sink, self.outs(r, exc, name))


def page_name(r: Record) -> str | None:
    """The page a record of the probes or pages topic is for: its key (a page id; a mark
    has none)."""
    try:
        return (r.key.decode("utf-8") or None) if r.key else None
    except UnicodeDecodeError:
        return None


class AnalyseStep:
    """``analyse-j``: raw pages to analysed pages (to their host's partition) or
    rejections; its mark: the greatest fetch time read, sent whenever it changes and,
    while the task is drained, again every ``mark_interval`` seconds (a drained mark's
    time vouches for what reached the downstream partitions before it; sent on every tick
    it would make a transaction a tick of every idle task)."""

    def __init__(self, j: int, ctx: Context) -> None:
        self.j, self.ctx = j, ctx
        self.high: int | None = None
        self.loaded = False
        self.sent: Mark | None = None
        self.last_drained = -math.inf
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
        ctx.tally.records[ANALYSE] += len(records)
        outs: list[Out] = []
        for a in results:
            if isinstance(a, Rejected):
                ctx.tally.dead[(ANALYSE, str(a.reason))] += 1
                key = (a.page_id or "").encode()
                outs.append(Out("rejects", None, key, orjson.dumps(a.to_json())))
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
        drained = caught_up and now - self.last_drained >= self.ctx.mark_interval
        if drained:
            self.last_drained = now
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
        self.unreadable = Unreadable(ctx, PART)
        #: The stages' counts as last added to the worker's tally.
        self.tallied: dict[str, Counter[str]] = {}

    def _stages(self, kv: Any) -> tuple[HostsTask, BucketsTask, DecideTask]:
        if self.stages is None:
            c, i, n = self.ctx, self.i, self.ctx.partitions
            kw: dict[str, Any] = {"wait": c.order_wait, "clock": c.clock}
            hosts = HostsTask(
                Prefixed(kv, b"h"), c.cfg, i, n, sources=c.raw_partitions, skew=c.raw_skew, **kw
            )
            buckets = BucketsTask(Prefixed(kv, b"b"), c.cfg, i, n, **kw)
            decide = DecideTask(Prefixed(kv, b"d"), c.cfg, i, n, **kw)
            self.stages = (hosts, buckets, decide)
        return self.stages

    def on_records(self, records: Sequence[Record], kv: Any, out: Sink) -> None:
        hosts, buckets, decide = self._stages(kv)
        topics, send = self.ctx.topics, self.ctx.sender.send
        self.ctx.tally.records[PART] += len(records)
        for r in records:
            stage: HostsTask | BucketsTask | DecideTask = decide
            if r.topic == topics.hosts:
                stage = hosts
            elif r.topic == topics.probes:
                stage = buckets
            try:
                if r.value is None:
                    raise WireError("a record without a value")
                outs = stage.step(r.value, r.timestamp / 1000)
            except WireError as exc:  # raised before the stage changed anything
                outs = self.unreadable.outs(r, exc, None if stage is hosts else page_name(r))
            send(out, outs)
        self._tally()

    def _tally(self) -> None:
        assert self.stages is not None
        hosts, buckets, decide = self.stages
        for name, counts in (("hosts", hosts.counts), ("buckets", buckets.counts),
                             ("decide", decide.counts)):  # fmt: skip
            self.ctx.tally.add(name, counts, self.tallied.setdefault(name, Counter()))

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
        self._tally()


class CountedOrderStep(OrderStep):
    """The order task's step, its records counted in the worker's tally."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        super().__init__(
            ctx.cfg,
            ctx.partitions,
            ctx.topics.pages,
            ctx.partitions,
            wait=ctx.order_wait,
            clock=ctx.clock,
            on_bad=Unreadable(ctx, ORDER_TASK).on_order,
        )
        #: The order task's counts as last added to the worker's tally.
        self.tallied: Counter[str] = Counter()

    def on_records(self, records: Sequence[Any], kv: Any, out: Any) -> None:
        self.ctx.tally.records[ORDER_TASK] += len(records)
        super().on_records(records, kv, out)
        self._tally()

    def on_tick(self, now: float, kv: Any, out: Any, caught_up: bool) -> None:
        super().on_tick(now, kv, out, caught_up)
        self._tally()

    def _tally(self) -> None:
        if self.task is not None:
            self.ctx.tally.add("order", Counter(late=self.task.late), self.tallied)


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
        raw_skew: float = 0.0,
        sandbox: Any = None,
        clock: Callable[[], float] = time.time,
        counts: Mapping[str, int] | None = None,
    ) -> None:
        """``raw_skew``: ``NEARDUP_RAW_SKEW_MS``, in seconds. ``counts``: each topic's
        partitions as the brokers have them (default: as the worker makes them)."""
        self.cfg, self.topics = cfg, topics
        self.partitions, self.raw_partitions = partitions, raw_partitions
        self.order_wait, self.mark_interval = order_wait, mark_interval
        self.raw_skew = raw_skew
        self.sandbox, self.clock = sandbox, clock
        self.tally = Tally()
        have = dict(topics.partitions(partitions, raw_partitions))
        have.update(counts or {})
        self.sender = Sender(topics, lambda t: have[t])

    def step(self, task: Task) -> AnalyseStep | PartStep | OrderStep:
        """The step object of ``task`` (the runtime's ``StepFactory``)."""
        if task.group == ORDER_TASK:
            return CountedOrderStep(self)
        i = int(task.name.rsplit("-", 1)[1])  # analyse-j, part-i
        return AnalyseStep(i, self) if task.group == ANALYSE else PartStep(i, self)
