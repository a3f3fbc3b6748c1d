"""SIGKILLs timed on what the topics show, not on a clock: a worker killed with one of its
transactions open, and the owners of the ordered step and of a bucket partition killed
between a probe and its answer. Nothing lost, nothing decided twice or differently, and
a read_committed reader never sees what an aborted transaction wrote."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from neardup.flow.codec import decode
from neardup.flow.messages import (
    Answer,
    Probe,
)
from tests.integration.helpers import (
    Deployment,
    WorkerProcess,
    accounted,
    all_out,
    check_after_fault,
    check_against,
    reference,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration

DEADLINE = 240.0


def _partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    """The partitions ``topic`` has (an output topic a reader asked for before the worker
    made it may have the broker's default count)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def run() -> list[TopicPartition]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        return [TopicPartition(topic, p["partition"]) for p in described["partitions"]]

    return asyncio.run(run())


class _Ends:
    """Each partition of ``tps``: its high watermark and last stable offset, asked of the
    broker by two readers kept open (a transaction open on a partition holds the second
    back)."""

    def __init__(self, bootstrap: str, tps: list[TopicPartition]) -> None:
        self.tps = tps
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def start() -> list[AIOKafkaConsumer]:
            out = []
            for isolation in ("read_uncommitted", "read_committed"):
                c = AIOKafkaConsumer(
                    bootstrap_servers=bootstrap, isolation_level=isolation, metadata_max_age_ms=1000
                )
                await c.start()
                c.assign(tps)  # so that its metadata covers them
                out.append(c)
            return out

        self.readers = self._run(start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def __call__(self) -> tuple[dict[Any, int], dict[Any, int]]:
        async def ask() -> tuple[dict[Any, int], dict[Any, int]]:
            high = await self.readers[0].end_offsets(self.tps)
            stable = await self.readers[1].end_offsets(self.tps)
            return dict(high), dict(stable)

        return self._run(ask())  # type: ignore[no-any-return]

    def close(self) -> None:
        async def stop() -> None:
            for c in self.readers:
                await c.stop()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def _until_open(ends: _Ends, done: Callable[[], bool], w: WorkerProcess) -> bool:
    """Ask ``ends`` back to back until a transaction is open on one of its partitions
    (True) or ``done`` holds (False): a transaction is open for tens of milliseconds."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, "no transaction seen open on the decisions"
        assert w.alive(), w.tail()
        high, stable = ends()
        if any(stable[tp] < high[tp] for tp in ends.tps):
            return True
    return False


def _count(bootstrap: str, tps: list[TopicPartition], isolation: str) -> int:
    """The records in ``tps`` a reader with ``isolation`` reads, from the beginning."""

    async def run() -> int:
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False
        )
        await c.start()
        try:
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            ends = await c.end_offsets(tps)
            n = 0
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                n += sum(len(rs) for rs in (await c.getmany(timeout_ms=500)).values())
            return n
        finally:
            await c.stop()

    return asyncio.run(run())


def test_a_reader_never_sees_what_a_worker_killed_mid_transaction_wrote(
    deploy: Any, tmp_path: Path
) -> None:
    """SIGKILL while one of the worker's transactions holds decisions (a read_uncommitted
    reader sees them, a read_committed one not yet): the transaction is aborted, the
    restarted worker decides those pages again, and the read_committed collector reads
    each decision once, as ``neardup dedup`` makes it."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(2)
    first = d.worker(0).start()
    d.wait(lambda: first.get("/readyz") == 200, DEADLINE, "the worker ready, its topics made")
    first.stop()
    tps = _partitions(d.bootstrap, d.names.decisions)
    ends = _Ends(d.bootstrap, tps)
    crawl = _Crawl(d, values, 12)  # decisions all along, in many transactions
    killed_open = False
    try:
        for attempt in range(10):
            w = d.worker(0).start()
            if not _until_open(ends, lambda: all_out(ref, d), w):
                break
            w.kill()
            high, stable = ends()  # no other producer: it stays open till a restart
            if any(stable[tp] < high[tp] for tp in tps):
                killed_open = True
                print(f"killed with a transaction open (attempt {attempt + 1}): {high} {stable}")
                break
    finally:
        ends.close()
        crawl.stop()
    d.produce(crawl.left())
    assert killed_open, "the worker never killed with a transaction open on the decisions"
    d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the restart")
    check_after_fault(values, ref, d)
    # exactly once: no page's decision read twice, though the aborted transaction's
    # decisions are in the log, where only a read_uncommitted reader sees them
    assert len(d.decisions()) == len(d.decided())
    committed = _count(d.bootstrap, tps, "read_committed")
    assert committed == len(d.decisions())
    assert _count(d.bootstrap, tps, "read_uncommitted") > committed


class _Probes:
    """Reads the probes and pages topics (read_committed) in a thread of its own: the
    probes whose answers are not committed yet, and where each answer was read."""

    def __init__(self, bootstrap: str, app: str, partitions: int) -> None:
        self.bootstrap, self.probes, self.pages = bootstrap, f"{app}-probes", f"{app}-pages"
        self.partitions = partitions
        #: (key, pid, keys) of each probe read whose answer is not: its probes partition.
        self.waiting: dict[tuple[Any, ...], int] = {}
        #: (key, pid, keys) of each answer read: its pages partition and offset.
        self.answered: dict[tuple[Any, ...], tuple[int, int]] = {}
        #: Whether, at the last look, every committed answer had been read.
        self.caught_up = False
        #: Looks taken so far (a look that began after a moment counts from the next one).
        self.looks = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        c = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await c.start()
        try:
            pages = [TopicPartition(self.pages, p) for p in range(self.partitions)]
            tps = [TopicPartition(self.probes, p) for p in range(self.partitions)] + pages
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            while not self._stop.is_set():
                batch = await c.getmany(timeout_ms=50)
                with self.lock:
                    for tp, records in batch.items():
                        for r in records:
                            self._read(tp, r)
                    stable = [c.last_stable_offset(tp) for tp in pages]
                    at = [await c.position(tp) for tp in pages]
                    self.caught_up = all(
                        s is not None and a >= s for s, a in zip(stable, at, strict=True)
                    )
                    self.looks += 1
        finally:
            await c.stop()

    def _read(self, tp: TopicPartition, r: Any) -> None:
        msg = decode(r.value)
        if isinstance(msg, Probe):
            ident = (msg.key, msg.pid, msg.keys)
            if ident not in self.answered:
                self.waiting[ident] = tp.partition
        elif isinstance(msg, Answer):
            ident = (msg.key, msg.pid, msg.keys)
            self.waiting.pop(ident, None)
            self.answered[ident] = (tp.partition, r.offset)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


_OPENED = re.compile(r"^(\S+ \S+) INFO neardup\.kafka: task (\S+) open at", re.M)


def _owners(workers: list[WorkerProcess]) -> dict[str, WorkerProcess]:
    """Each task's owner: the worker that opened it last (a rebalance closes every task
    and opens it again where it is dealt)."""
    latest: dict[str, tuple[str, WorkerProcess]] = {}
    for w in workers:
        for when, task in _OPENED.findall(w.log.read_text(errors="replace")):
            if task not in latest or when > latest[task][0]:
                latest[task] = (when, w)
    return {task: w for task, (_, w) in latest.items()}


class _Crawl:
    """``values`` produced in ``parts`` parts, a second apart, in a thread of its own."""

    def __init__(self, d: Deployment, values: list[bytes], parts: int) -> None:
        n = len(values)
        self.parts = [values[i * n // parts : (i + 1) * n // parts] for i in range(parts)]
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(d,), daemon=True)
        self._thread.start()

    def _run(self, d: Deployment) -> None:
        for part in self.parts:
            d.produce(part)
            self.sent += 1
            if self._stop.wait(1.0):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def left(self) -> list[bytes]:
        """What it did not produce (once stopped)."""
        return [v for part in self.parts[self.sent :] for v in part]


def _kill_between(workers: list[WorkerProcess], probes: _Probes, chosen: dict[str, Any]) -> bool:
    """If a probe is committed and its answer is not, on a bucket partition whose owner
    does not run the ordered step: SIGKILL both owners, say which in ``chosen``, True.

    Both owners are stopped (SIGSTOP) first and the answers read again to the end, so
    that the answer cannot be committed between the last look and the kill; if it came
    meanwhile, they go on (SIGCONT) and another probe is chosen later."""
    owners = _owners(workers)
    order = owners["order"]
    with probes.lock:
        if not probes.caught_up:
            return False
        found = [(i, owners[f"part-{b}"]) for i, b in probes.waiting.items()]
    found = [(i, w) for i, w in found if w is not order]
    if not found:
        return False
    ident, bucket = found[0]
    pair = (order, bucket)
    for w in pair:
        w.proc.send_signal(signal.SIGSTOP)
    with probes.lock:
        since = probes.looks
    # two whole looks after the stop: a commit sent just before it is read too
    wait_for(lambda: probes.looks >= since + 2 and probes.caught_up, 60, "answers read")
    with probes.lock:
        unanswered = ident in probes.waiting
    if not unanswered:
        for w in pair:
            w.proc.send_signal(signal.SIGCONT)
        return False
    for w in pair:
        w.kill()
    chosen.update(ident=ident, order=order, bucket=bucket)
    return True


_LATE = re.compile(r'^neardup_late_items_total\{stage="(\w+)"\} (\S+)$', re.M)


def _late(workers: list[WorkerProcess]) -> dict[str, Any]:
    """Each live worker's late items by stage (``neardup_late_items_total``), those that
    counted any; and the warnings of late items in every worker's log, a killed one's
    too."""
    out: dict[str, Any] = {}
    for w in workers:
        status, body = w.fetch("/metrics")
        counts = {stage: int(float(n)) for stage, n in _LATE.findall(body) if float(n)}
        if status == 200 and counts:
            out[w.log.name] = counts
    logs = {w.log for w in workers}
    logged = sum(p.read_text(errors="replace").count("(late): taken at once") for p in logs)
    if logged:
        out["warnings in the logs"] = logged
    return out


def test_the_order_step_and_a_bucket_owner_killed_between_a_probe_and_its_answer(
    deploy: Any, tmp_path: Path
) -> None:
    """Three workers on four partitions. While a probe is committed and its answer is not
    (read_committed, every answer committed so far read), the worker that runs the
    ordered step and the one that runs that probe's bucket partition are SIGKILLed, then
    started again. The answer comes after the kill, and every page is decided once, as
    ``neardup dedup`` decides it."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    n = 4
    d: Deployment = deploy(n)
    workers = [d.worker(i).start() for i in range(3)]
    for w in workers:
        d.wait(lambda w=w: w.get("/readyz") == 200, DEADLINE, "every worker ready")
    d.wait(lambda: len(_owners(workers)) == 2 * n + 1, DEADLINE, "every task open")
    probes = _Probes(d.bootstrap, d.names.app_id, n)
    crawl = _Crawl(d, values, 12)
    chosen: dict[str, Any] = {}
    try:
        d.wait(lambda: _kill_between(workers, probes, chosen), DEADLINE, "a probe unanswered")
    finally:
        crawl.stop()
    ident, killed = chosen["ident"], (chosen["order"], chosen["bucket"])
    survivors = [w for w in workers if w not in killed]
    print(f"killed {[w.log.name for w in killed]} waiting on probe {ident[:2]}")
    ends = _Ends(d.bootstrap, [TopicPartition(f"{d.names.app_id}-pages", p) for p in range(n)])
    try:
        high, _ = ends()
    finally:
        ends.close()
    assert all(w.alive() for w in survivors)
    d.produce(crawl.left())
    for w in killed:  # the same state directories
        i = workers.index(w)
        workers[i] = d.worker(i).start()
    try:
        d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the kills")
        wait_for(lambda: ident in probes.answered, 60, "the probe's answer")
    finally:
        probes.close()
    # nothing lost, nothing decided twice, nothing conflicting
    accounted(values, ref, d)
    assert len(d.decisions()) == len(d.decided()), "a decision read twice"
    # the answer was committed after the kill: by the bucket partition's next owner
    partition, offset = probes.answered[ident]
    assert offset >= high[TopicPartition(d.names.app_id + "-pages", partition)], (
        "the probe's answer was committed before the kill"
    )
    try:
        check_against(ref, d)
    except AssertionError as exc:
        # whether a page came after a later key had gone on, and where: a producer out of
        # step past NEARDUP_RAW_SKEW_MS, or a fault in the marks
        late = _late(workers)
        raise AssertionError(f"{exc}\nlate items after the kills: {late or 'none'}") from None
