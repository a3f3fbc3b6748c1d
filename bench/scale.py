"""The ordered step's ceiling: the order task alone, on one broker. Prints figures; asserts
nothing.

    .venv/bin/python bench/scale.py [--bootstrap HOST:PORT] [--pages 600000] [--limit N]
        [--tick 1000] [--sources 8] [--max-records 5000] [--all-edges]

Without ``--bootstrap`` (or KAFKA_BOOTSTRAP_SERVERS) it starts scripts/kafka-local.sh on free
loopback ports and stops it at the end. The dev pages are analysed once, then decided once
by the engine in key order, recording each page's cluster-step input (verified matches and
shares, before bridges). The stream is replayed under new ids (``page_id#r``), each pass
``span + 2 days`` later, so that no copy matches another pass, until ``--pages`` pages.

* **Order task:** its real input goes to a 1-partition order topic: an ``Edge`` for each page
  with a match, and every ``--tick`` pages a ``Mark`` from each of ``--sources`` fake decide
  tasks up to the next page's key (a unique page costs the order task only its share of
  the marks). A child process then runs ``neardup.flow.order.OrderTask`` in a transactional
  consume-transform-produce loop: read_committed, verdicts to the pages topic and the
  store's writes to a changelog with ``create_batch``/``send_batch``, the input offsets
  with ``send_offsets_to_transaction``, commit, then the overlay to RocksDB. Timed from
  the first record consumed to the last verdict committed; CPU from the child's rusage
  over the same window.

The last line is ``ordered step: N pages/s, X ms CPU a page``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, analysed_pages
from neardup.config import EngineConfig
from neardup.engine import Analysed, page_pid
from neardup.flow.codec import encode
from neardup.flow.messages import (
    Edge,
    EdgeMatch,
    Key,
    Mark,
)

DAY_MS = 86_400_000
END: Key = (1 << 62, "")
CFG = EngineConfig(extract_timeout_s=0)


@dataclass(frozen=True, slots=True)
class Page:
    """A dev page as the order task sees it: its key, and its cluster-step input (no
    matches: a unique page, which sends no edge)."""

    pid: int
    order: int
    page_id: str
    matches: tuple[EdgeMatch, ...]
    covered: tuple[tuple[int, float], ...]


def prepare(data: Path, limit: int) -> tuple[list[Analysed], list[Page]]:
    """The dev pages analysed, in key order, and what ``neardup dedup``'s engine gave each
    page's cluster step."""
    import neardup.engine as engine_mod
    from neardup.engine import Engine
    from neardup.steps import cluster_step
    from neardup.store import MemoryKV

    pages = analysed_pages(data, limit or 1 << 30, CFG)
    pages.sort(key=lambda a: (a.order, a.page.page_id))
    ids = {a.pid: a.page.page_id for a in pages}
    seen: dict[int, tuple[tuple[EdgeMatch, ...], tuple[tuple[int, float], ...]]] = {}

    def spy(me: Any, verified: Any, covered: Any, view: Any, cfg: Any) -> Any:
        ms = tuple(
            EdgeMatch(m.pid, m.order, ids[m.pid], str(m.kind), m.distance, m.similarity,
                      m.share, m.by_simhash)
            for m in verified
        )  # fmt: skip
        seen[me.pid] = (ms, tuple(covered.items()))
        return cluster_step(me, verified, covered, view, cfg)

    engine = Engine(MemoryKV(), CFG)
    with mock.patch.object(engine_mod, "cluster_step", spy):
        for a in pages:
            engine.decide_analysed(a)
            engine.kv.commit()
    out = [Page(a.pid, a.order, a.page.page_id, *seen.get(a.pid, ((), ()))) for a in pages]
    return pages, out


def replayed(base: list[Page], total: int, all_edges: bool) -> Iterator[Page]:
    """``total`` pages: ``base`` again and again under new ids (``page_id#r``), each pass
    ``span + 2 days`` after the one before. ``all_edges``: a page without a match gets
    one, to the page before it (the worst case: every page crosses the order task)."""
    if all_edges:
        base = [
            p if p.matches or not i else Page(p.pid, p.order, p.page_id, (
                EdgeMatch(q.pid, q.order, q.page_id, "duplicate", 1, 0.95, 1.0, True),), ())
            for i, (p, q) in enumerate(zip(base, [base[0], *base], strict=False))
        ]  # fmt: skip
    span = base[-1].order - base[0].order + 2 * DAY_MS
    ids = {p.pid: p.page_id for p in base}
    for r in range((total + len(base) - 1) // len(base)):
        new = {pid: (page_pid(f"{i}#{r}") if r else pid, f"{i}#{r}" if r else i)
               for pid, i in ids.items()}  # fmt: skip
        shift = r * span
        for p in base[: total - r * len(base)]:
            ms = tuple(
                EdgeMatch(new[m.pid][0], m.order + shift, new[m.pid][1], m.kind, m.distance,
                          m.similarity, m.share, m.by_simhash)
                for m in p.matches
            )  # fmt: skip
            covered = tuple((new[c][0], s) for c, s in p.covered)
            yield Page(new[p.pid][0], p.order + shift, new[p.pid][1], ms, covered)


def order_input(pages: Iterable[Page], tick: int, sources: int) -> Iterator[bytes]:
    """The order topic's records: each page's edge (if it has a match), and every ``tick``
    pages a mark from every source up to the next page's key."""
    batch: list[Page] = []

    def flush(upto: Key) -> Iterator[bytes]:
        for p in batch:
            if p.matches:
                yield encode(Edge((p.order, p.page_id), p.pid, p.matches, p.covered))
        for s in range(sources):
            yield encode(Mark(s, upto, None))
        batch.clear()

    for p in pages:
        if len(batch) >= tick:
            yield from flush((p.order, p.page_id))
        batch.append(p)
    yield from flush(END)


async def produce(bootstrap: str, topic: str, values: Iterable[bytes], partition: int = 0) -> int:
    """Write ``values`` to one partition in batches; returns how many."""
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 << 20,
                                max_batch_size=1 << 20, linger_ms=20)  # fmt: skip
    await producer.start()
    n, futures = 0, []
    try:
        batch = producer.create_batch()
        for v in values:
            if batch.append(key=None, value=v, timestamp=None) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                batch.append(key=None, value=v, timestamp=None)
            n += 1
        futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return n


# -- the order task, in a child process ------------------------------------------------------


class _TimedStep:
    """``OrderStep`` under the runtime, noting when the first record came and the CPU used
    until then."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.first: tuple[float, float] | None = None

    def on_records(self, records: Any, kv: Any, out: Any) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), _cpu())
        self.step.on_records(records, kv, out)

    def on_tick(self, now: float, kv: Any, out: Any, caught_up: bool) -> None:
        self.step.on_tick(now, kv, out, caught_up)


def _peak_rss_mb() -> float:
    """This process's peak resident memory (``ru_maxrss`` would be the parent's, which
    survives the exec)."""
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def order_child(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The order task under the worker's runtime (``neardup.kafka.runtime``) until it has
    committed the order topic's last record (``opts["end"]``): its figures."""
    from aiokafka import TopicPartition

    from neardup.flow.order import OrderStep
    from neardup.kafka.assignor import Task
    from neardup.kafka.delivery import Config
    from neardup.kafka.runtime import Runtime

    tp = TopicPartition(opts["topic"], 0)
    task = Task("order", (tp,), TopicPartition(opts["changelog"], 0), "order")
    steps: list[_TimedStep] = []

    def factory(_: Task) -> _TimedStep:
        step = OrderStep(CFG, opts["sources"], opts["pages"], opts["partitions"])
        steps.append(_TimedStep(step))
        return steps[-1]

    cfg = Config(opts["bootstrap"], opts["app"], (opts["topic"],), opts["state"],
                 max_records=opts["max_records"])  # fmt: skip
    rt = Runtime(cfg, lambda _: [task], factory)
    await rt.start()
    running = asyncio.create_task(rt.run())
    try:
        while (r := rt.tasks.get("order")) is None or r.committed.get(tp, 0) < opts["end"]:
            if running.done():
                running.result()  # its error
                raise RuntimeError("the runtime stopped")
            await asyncio.sleep(0.005)
        t1, cpu1 = time.perf_counter(), _cpu()
    finally:
        rt.stop()
        await running
        await rt.close()
    first = next(s.first for s in steps if s.first is not None)
    return {
        "verdicts": sum(s.step.sent for s in steps), "steps": len(steps),
        "commits": len(rt.commit_seconds), "seconds": t1 - first[0], "cpu": cpu1 - first[1],
        "max_rss_mb": _peak_rss_mb(),
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class OrderFigures:
    pages: int
    edges: int
    records: int
    result: dict[str, Any]


def run_order(
    bootstrap: str, tmp: Path, base: list[Page], args: argparse.Namespace
) -> OrderFigures:
    """The order topic filled, then the order task run in a child process."""
    from bench.worker import create_topic

    app = f"scale-{os.getpid()}-{int(time.time())}"
    topic, pages_topic, changelog = f"{app}-order", f"{app}-pages", f"{app}-order-changelog"
    create_topic(bootstrap, topic, 1, {"max.message.bytes": str(16 << 20)})
    create_topic(bootstrap, pages_topic, args.sources, {})
    create_topic(bootstrap, changelog, 1, {"cleanup.policy": "compact"})
    counts = {"pages": 0, "edges": 0}

    def counted() -> Iterator[Page]:
        for p in replayed(base, args.pages, args.all_edges):
            counts["pages"] += 1
            counts["edges"] += bool(p.matches)
            yield p

    t0 = time.perf_counter()
    n = asyncio.run(produce(bootstrap, topic, order_input(counted(), args.tick, args.sources)))
    print(f"order topic: {n} records ({counts['edges']} edges, {counts['pages']} pages) written "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    opts = {
        "bootstrap": bootstrap, "topic": topic, "pages": pages_topic, "changelog": changelog,
        "app": app, "partitions": args.sources, "sources": args.sources,
        "end": n, "max_records": args.max_records, "state": str(tmp / "order"),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(opts)],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the order task failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return OrderFigures(counts["pages"], counts["edges"], n, result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--limit", type=int, default=0, help="use the first N dev pages only")
    ap.add_argument("--pages", type=int, default=600_000, help="pages through the order task")
    ap.add_argument("--tick", type=int, default=1000, help="pages between two marks a source")
    ap.add_argument("--sources", type=int, default=8, help="decide tasks (and pages partitions)")
    ap.add_argument("--max-records", type=int, default=5000, help="the runtime's fetch size")
    ap.add_argument("--all-edges", action="store_true", help="every page with an edge")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(order_child(json.loads(args.child)))))
        return
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    _, base = prepare(args.data, args.limit)
    share = sum(bool(p.matches) for p in base) / len(base)
    print(f"{len(base)} dev pages analysed and decided in {time.perf_counter() - t0:.0f} s; "
          f"{share:.1%} have a match (edge pages)", flush=True)  # fmt: skip
    from bench.worker import local_broker

    broker = None
    for attempt in range(0 if args.bootstrap else 3):
        try:  # its free ports may be taken by another job before it binds them
            broker = local_broker()
            break
        except AssertionError as exc:
            print(f"the broker did not start ({str(exc)[-200:]!r}): trying other ports")
            if attempt == 2:
                raise
    bootstrap = broker.bootstrap if broker is not None else args.bootstrap
    tmp = Path(tempfile.mkdtemp(prefix="neardup-scale-"))
    try:
        order = run_order(bootstrap, tmp, base, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if broker is not None:
            broker.run("stop", check=False)
    r = order.result
    secs, cpu = r["seconds"], r["cpu"]
    if r["verdicts"] != order.edges:
        print(f"the order task sent {r['verdicts']} verdicts for {order.edges} edges")
    print(f"order task: {order.edges} edge pages of {order.pages} ({order.records} records, "
          f"{r['commits']} commits) in {secs:.1f} s: {order.edges / secs:,.0f} edge pages/s, "
          f"{order.pages / secs:,.0f} pages/s counting the unique pages the marks cover; "
          f"{cpu / order.edges * 1000:.4f} ms CPU an edge page, "
          f"{cpu / order.pages * 1000:.4f} ms a page ({order.pages / cpu:,.0f} pages per "
          f"CPU-second); max RSS {r['max_rss_mb']:.0f} MiB",
          flush=True)  # fmt: skip
    print(f"load average (1 min): {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"ordered step: {order.pages / secs:.0f} pages/s, {cpu / order.pages * 1000:.4f} ms "
          "CPU a page")  # fmt: skip


if __name__ == "__main__":
    main()
