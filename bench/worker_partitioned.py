"""``bench/worker.py``: the whole-deployment figures of the
partitioned worker, side by side in one run.

* CPU a page of the whole deployment (every worker process and its sandbox children, not
  the broker) with 1, 2 and 4 workers, and of ``neardup dedup --state``'s engine over the
  same pages; the ratios 4 workers / 1 worker and 1 worker / dedup; the projected capacity
  for 8, 32 and 128 cores;
* latency, produce to decision read back (read_committed), with 2 workers at about half
  of their measured capacity: p50 and p99;
* recovery: one of 2 workers SIGKILLed with pages flowing at that rate; for each decisions
  partition, how long it went on being decided and when it was decided again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from bench.worker_common import CpuMeter, Rate, Run, copies, engine_rate
from neardup.contract import derive_page_id
from tests.integration.helpers import message_key, produce, wait_for

#: The order task's pages per CPU-second, docs/benchmarks.md, section Scale (bench/scale.py).
ORDER_CEILING = 25_178.0
#: Pages decided before a measurement window opens: the workers' start-up is left out.
WARM = 20


def tasks_open(run: Run) -> bool:
    """Every worker of ``run`` has opened a task (it joined the group and got a share)."""
    return all(
        w.log.exists() and " open at " in w.log.read_text(errors="replace") for w in run.workers
    )


def check_workers(run: Run) -> None:
    """Fail, with the log's tail, if a worker died or logged an error."""
    for w in run.workers:
        if w.proc is not None and not w.alive() and not w.ended:
            raise AssertionError(f"worker {w.log.name} died:\n{w.tail(40)}")
        text = w.log.read_text(errors="replace") if w.log.exists() else ""
        # aiokafka logs a retried fetch as an ERROR (a leader not elected yet at the start)
        bad = [ln for ln in text.splitlines() if " ERROR neardup" in ln or "Traceback" in ln]
        if bad:
            raise AssertionError(f"worker {w.log.name} logged errors:\n" + "\n".join(bad[:20]))


def watched(run: Run, condition: object, timeout: float, what: str) -> None:
    """``wait_for`` that fails at once when a worker dies or logs an error."""

    def check() -> bool:
        check_workers(run)
        return bool(condition())  # type: ignore[operator]

    wait_for(check, timeout, what, interval=0.5)


def cpu_a_page(bootstrap: str, tmp: Path, stream: list[bytes], workers: int, parts: int) -> Rate:
    """Pages/s and CPU a page of ``workers`` partitioned workers over ``stream``. The
    workers start on an empty raw topic and decide the first ``WARM`` pages; the window
    then opens, the rest of the stream is produced, and it closes when every page is out:
    start-up (and the sandbox's) is left out, the drain at the end is in."""
    run = Run(bootstrap, tmp, parts)
    try:
        procs = [run.worker(i).start() for i in range(workers)]
        watched(run, lambda: tasks_open(run), 600, "the workers to open their tasks")
        produce(bootstrap, run.names.raw, stream[:WARM])
        watched(run, lambda: run.answered() >= WARM, 600, "the first pages out")
        t0, done0 = time.time(), run.answered()
        meter = CpuMeter([w.proc.pid for w in procs if w.proc])
        produce(bootstrap, run.names.raw, stream[WARM:])
        watched(run, lambda: run.answered() >= len(stream), 3600, "every page out")
        cpu, own = meter.stop()
        times = run.collector.times[run.names.decisions] + run.collector.times[run.names.rejects]
        n = max(len(stream) - done0, 1)
        return Rate(n / max(max(times) - t0, 1e-9), cpu / n, own / n)
    except AssertionError:
        for w in run.workers:
            print(f"--- {w.log}\n{w.tail(40)}", file=sys.stderr)
        raise
    finally:
        run.close()


class Decisions:
    """The decisions topic read from the start, read_committed, in a thread: each page's
    first decision's partition and the time it was read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[str, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
            metadata_max_age_ms=1000,
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                now = time.time()
                for tp, records in batch.items():
                    for r in records:
                        self.seen.setdefault(json.loads(r.value)["page_id"], (tp.partition, now))
        finally:
            await consumer.stop()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def live(lines: Iterable[bytes]) -> Iterable[tuple[str, bytes]]:
    """(page_id, value) of each line with a fresh fetch time: the stream is live."""
    for line in lines:
        msg = json.loads(line)
        now = time.time()
        msg["fetched_at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + (
            f".{int(now * 1000) % 1000:03d}Z"
        )
        yield msg.get("page_id") or derive_page_id(msg["url"]), json.dumps(msg).encode()


def paced(
    bootstrap: str, topic: str, lines: list[bytes], rate: float, sent: dict[str, float]
) -> None:
    """Produce ``lines`` at ``rate`` pages/s, noting when each page was sent."""
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=32 << 20)
        await producer.start()
        try:
            start = time.time()
            for i, (page_id, value) in enumerate(live(lines)):
                delay = start + i / rate - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent[page_id] = time.time()
                await producer.send(topic, value, key=message_key(value))
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


def started(bootstrap: str, tmp: Path, parts: int, workers: int, warm: list[bytes]) -> Run:
    """A run with ``workers`` workers that have their tasks and decided ``warm``."""
    run = Run(bootstrap, tmp, parts)
    for i in range(workers):
        run.worker(i).start()
    watched(run, lambda: tasks_open(run), 600, "the workers to open their tasks")
    produce(bootstrap, run.names.raw, (v for _, v in live(warm)))
    watched(run, lambda: run.answered() >= len(warm), 600, "the warm-up pages out")
    return run


def latency(
    bootstrap: str, tmp: Path, lines: list[bytes], rate: float, *, parts: int, workers: int
) -> tuple[float, float, int]:
    """p50 and p99 seconds from produce to the decision read, at ``rate`` pages/s."""
    run = started(bootstrap, tmp, parts, workers, list(copies(lines, 0, WARM)))
    try:
        got = Decisions(bootstrap, run.names.decisions)
        sent: dict[str, float] = {}
        feed = lines[: max(200, int(rate * 60))]
        paced(bootstrap, run.names.raw, feed, rate, sent)
        watched(run, lambda: all(p in got.seen for p in sent), 600, "every paced page decided")
        got.close()
        lat = sorted(got.seen[p][1] - t for p, t in sent.items())
        q = statistics.quantiles(lat, n=100)
        return q[49], q[98], len(lat)
    finally:
        run.close()


def recovery(
    bootstrap: str, tmp: Path, lines: list[bytes], rate: float, *, parts: int, seconds: float = 60
) -> dict[int, tuple[float, float]]:
    """One of 2 workers SIGKILLed ``seconds / 3`` into a stream at ``rate`` pages/s; for each
    decisions partition: seconds from the kill to the start and to the end of its longest
    pause in decisions after the kill (start 0: nothing was decided between the kill and
    the pause)."""
    run = started(bootstrap, tmp, parts, 2, list(copies(lines, 0, WARM)))
    try:
        got = Decisions(bootstrap, run.names.decisions)
        sent: dict[str, float] = {}
        n = int(rate * seconds)
        feed = list(copies(lines, 2 * len(lines), 2 * len(lines) + n))
        producer = threading.Thread(
            target=paced, args=(bootstrap, run.names.raw, feed, rate, sent), daemon=True
        )
        producer.start()
        wait_for(lambda: len(sent) >= n // 3, 600, "a third of the stream sent")
        run.workers[1].kill()
        killed = time.time()
        producer.join()
        survivor = run.workers[:1]
        run.workers[:] = survivor  # the killed one is no longer watched
        watched(run, lambda: all(p in got.seen for p in sent), 900, "every page decided")
        got.close()
        by_part: dict[int, list[float]] = {}
        for part, t in got.seen.values():
            by_part.setdefault(part, []).append(t)
        out = {}
        for part, ts in sorted(by_part.items()):
            after = [killed, *sorted(t for t in ts if t > killed)]
            gap = max(itertools.pairwise(after), key=lambda ab: ab[1] - ab[0])
            out[part] = (gap[0] - killed, gap[1] - killed)
        return out
    finally:
        run.close()


def report(
    bootstrap: str, tmp: Path, lines: list[bytes], stream: list[bytes], args: object
) -> None:
    """Every figure of the module docstring, printed as measured."""
    parts: int = args.partitions  # type: ignore[attr-defined]
    skip: list[str] = args.skip  # type: ignore[attr-defined]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the start: {load}", flush=True)
    two_rate = 0.0
    if "throughput" not in skip:
        rates = {}
        dedup = engine_rate(stream, state=tmp / "engine")
        print(f"neardup dedup --state:   {dedup.pages_s:7.1f} pages/s, {dedup.split()}", flush=True)
        counts: list[int] = args.workers  # type: ignore[attr-defined]
        for k in counts:
            rates[k] = cpu_a_page(bootstrap, tmp / f"p{k}", stream, k, parts)
            print(
                f"partitioned x{k}:        {rates[k].pages_s:7.1f} pages/s, {rates[k].split()}",
                flush=True,
            )
        one, most = rates[min(counts)].cpu, rates[max(counts)].cpu
        print(
            f"CPU a page: {max(counts)} workers / {min(counts)} {most / one:.2f} (target for 4 "
            f"/ 1 <= 1.15: {'met' if most / one <= 1.15 else 'MISSED'}); {min(counts)} worker / "
            f"dedup --state {one / dedup.cpu:.2f} (target <= 1.3: "
            f"{'met' if one / dedup.cpu <= 1.3 else 'MISSED'})"
        )
        for cores in (8, 32, 128):
            per = cores / rates[min(counts)].cpu
            print(
                f"projected capacity on {cores} cores: {min(ORDER_CEILING, per):,.0f} pages/s "
                f"(workers {per:,.0f} at {min(counts)} worker's CPU a page; the order step "
                f"{ORDER_CEILING:,.0f})"
            )
        two_rate = rates[2].pages_s if 2 in rates else 0.0
    rate = two_rate / 2 if two_rate else args.rate  # type: ignore[attr-defined]
    if "latency" not in skip:
        p50, p99, n = latency(bootstrap, tmp / "lat", lines, rate, parts=parts, workers=2)
        print(
            f"latency, produce to decision read (read_committed), 2 workers at {rate:.1f} "
            f"pages/s, {n} pages: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms",
            flush=True,
        )
    if "recovery" not in skip:
        parts_seen = recovery(bootstrap, tmp / "rec", lines, rate, parts=parts)
        print(
            f"recovery, 1 of 2 workers SIGKILLed at {rate:.1f} pages/s; per decisions partition, "
            "seconds from the kill to its longest pause's start and end:"
        )
        for part, (stop, again) in parts_seen.items():
            print(f"  partition {part}: decided until +{stop:.1f} s, again from +{again:.1f} s")
        print(
            "every partition decided again "
            f"{max(a for _, a in parts_seen.values()):.1f} s after the kill"
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end: {load}")
