"""The Kafka worker against a real local broker, on the dev pages. Prints figures; asserts
nothing.

    .venv/bin/python bench/worker.py [--bootstrap HOST:PORT] [--limit N] [--partitions 4]
        [--topology routed|sequential|partitioned] [--recovery-pages 100000] [--rounds 1] [--pin]
        [--passes 1] [--retention-days 0]

Without ``--bootstrap`` (or KAFKA_BOOTSTRAP_SERVERS) it starts scripts/kafka-local.sh on
free loopback ports and stops it at the end. It measures, in one run:

* ``neardup dedup``'s engine over the same pages, in this process, with its state in memory
  and in RocksDB (``--state``, like the worker's): pages/s and CPU a page;
* throughput of 1 worker and of 2 workers (separate processes): the raw topic is filled
  first, then the rate is taken over the window after every worker is ready, so that
  start-up is left out; with ``--rounds N`` the engine, 1 worker and 2 workers run in
  turn N times, and the medians are printed. ``--passes P`` puts the pages through P
  times (each pass under new ids, two days later), engine and workers alike, so that the
  pipeline's filling at the start and draining at the end, the same few seconds for one
  worker and for two, weigh less in the rate (with ``--retention-days 1`` no pass finds
  the ones before it, so each is decided nearly like the first). With ``--pin`` and the
  broker's pid known, one worker also runs with the broker on its core: one worker alone
  otherwise has the broker's CPU on the other core for free, two share both cores with
  it;
* end-to-end latency (produce to decision read back) at half the 1-worker capacity;
* recovery: one worker indexes ``--recovery-pages`` pages (the dev pages again and again
  under new ids), is SIGKILLed mid-stream and restarted on its state directory; the time
  until it is ready again and until its next decision.

With ``--topology partitioned`` the figures are those of bench/worker_partitioned.py
instead: CPU a page of 1, 2 and 4 workers (``--workers``) against ``neardup dedup
--state``, latency and recovery with 2 workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines

# bench/faults.py, memory.py, scale.py and scale_sequencer.py take these from here
from bench.worker_common import (
    CpuMeter,
    Rate,
    Run,
    broker_on,
    broker_pid,
    copies,
    create_topic,
    engine_rate,
    local_broker,
    own_cpu,
    pin_tree,
)
from neardup.contract import derive_page_id
from tests.integration.helpers import message_key, produce, tree_cpu, wait_for

__all__ = ["Run", "copies", "create_topic", "local_broker", "own_cpu"]


def throughput(
    bootstrap: str,
    tmp: Path,
    lines: list[bytes],
    n_workers: int,
    *,
    parts: int,
    topology: str,
    pin: bool = False,
    broker_pid: int | None = None,
    broker_core: int | None = None,
    retention_days: int = 0,
    standby_replicas: int = 1,
) -> Rate:
    """Pages/s of ``n_workers`` workers on the clock, and their CPU a page (see ``Rate``).
    ``pin``: worker i (with its sandbox child) on core i only. ``broker_core``: the broker
    on that core only while the workers run (it produces the pages on every core).
    ``retention_days``: the workers' ``NEARDUP_RETENTION_DAYS`` (0: the default);
    ``standby_replicas``: their ``NEARDUP_STANDBY_REPLICAS`` (the worker's default, 1:
    each of two workers keeps a replica of the other's tables)."""
    env = {"NEARDUP_STANDBY_REPLICAS": str(standby_replicas)}
    if retention_days:
        env["NEARDUP_RETENTION_DAYS"] = str(retention_days)
    run = Run(bootstrap, tmp, parts, topology, worker_env=env)
    try:
        produce(bootstrap, run.names.raw, lines)
        with broker_on(broker_pid, broker_core):
            return _throughput(run, lines, n_workers, pin, broker_pid)
    except AssertionError:
        for w in run.workers:
            print(f"--- {w.log}\n{w.tail(30)}", file=sys.stderr)
        raise
    finally:
        run.close()


def _throughput(
    run: Run, lines: list[bytes], n_workers: int, pin: bool, broker_pid: int | None
) -> Rate:
    """``throughput``'s measurement, the raw topic filled."""
    workers = [run.worker(i).start() for i in range(n_workers)]
    for i, w in enumerate(workers if pin else []):
        if w.proc:  # pinned before it starts its threads and its sandbox, mostly
            pin_tree(w.proc.pid, i % (os.cpu_count() or 1))
    # the window starts when every worker has joined (or a page is out already: the first
    # worker's group formed without the others, and their joining rebalances it in the
    # window; a broker of the bench's own gives a new group 3 s to gather, as Kafka's
    # default does, and the tests' broker none)
    joined = [False]

    def started() -> bool:
        joined[0] = all(w.get("/readyz") == 200 for w in workers)
        return joined[0] or run.outputs() > 0

    wait_for(started, 300, "the workers to join")
    joined_late = not joined[0]
    for i, w in enumerate(workers if pin else []):
        if w.proc:  # and again, for whatever started in between
            pin_tree(w.proc.pid, i % (os.cpu_count() or 1))
    t0, done0 = time.time(), run.answered()
    meter = CpuMeter([w.proc.pid for w in workers if w.proc])
    b0 = tree_cpu(broker_pid) if broker_pid else 0.0
    # distinct pages: copies sent again after a rebalance must not make up for a page lost
    wait_for(lambda: run.answered() >= len(lines), 3600, "every page out")
    cpu, own = meter.stop()
    broker = tree_cpu(broker_pid) - b0 if broker_pid else None
    times = run.collector.times[run.names.decisions] + run.collector.times[run.names.rejects]
    pages = len(lines) - done0
    n = max(pages, 1)
    return Rate(
        pages / max(max(times) - t0, 1e-9),
        cpu / n,
        own / n,
        None if broker is None else broker / n,
        joined_late,
    )


def latency(
    bootstrap: str, tmp: Path, lines: list[bytes], rate: float, *, parts: int, topology: str
) -> tuple[float, float, int]:
    """p50 and p99 seconds from produce to the decision being read, at ``rate`` pages/s."""
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    run = Run(bootstrap, tmp, parts, topology)
    sent: dict[str, float] = {}
    try:
        w = run.worker(0).start()
        wait_for(lambda: w.get("/readyz") == 200, 300, "worker ready")

        async def paced() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=32 << 20)
            await producer.start()
            try:
                start = time.time()
                for i, line in enumerate(lines):
                    delay = start + i / rate - time.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    msg = json.loads(line)
                    # a fresh fetch time: the stream is live
                    msg["fetched_at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + (
                        f".{int(time.time() * 1000) % 1000:03d}Z"
                    )
                    value = json.dumps(msg, ensure_ascii=False).encode()
                    page_id = msg.get("page_id") or derive_page_id(msg["url"])
                    sent[page_id] = time.time()
                    await producer.send(run.names.raw, value, key=message_key(value))
                await producer.flush()
            finally:
                await producer.stop()

        asyncio.run(paced())
        wait_for(lambda: run.answered() >= len(lines), 600, "every page out")
        got = zip(
            run.collector.messages[run.names.decisions],
            run.collector.times[run.names.decisions],
            strict=True,
        )
        lat = sorted(t - sent[d["page_id"]] for d, t in got if d["page_id"] in sent)
        q = statistics.quantiles(lat, n=100)
        return q[49], q[98], len(lat)
    finally:
        run.close()


def recovery(
    bootstrap: str, tmp: Path, lines: list[bytes], pages: int, *, parts: int, topology: str
) -> tuple[float, float, float]:
    """Seconds from SIGKILL to ready, and to the next decision; and the indexing rate."""
    # The raw topic keeps what is consumed for a short while only, and pages are produced
    # a chunk at a time as the worker keeps up: the backlog, and the disk, stay bounded.
    raw_configs = {"retention.ms": str(10 * 60 * 1000), "segment.bytes": str(128 << 20)}
    run = Run(bootstrap, tmp, parts, topology, raw_configs)
    chunk = 4000
    try:
        w = run.worker(0).start()
        t0 = time.time()
        for start in range(0, pages, chunk):
            caught_up = lambda s=start: run.outputs() >= s - chunk  # noqa: E731
            wait_for(caught_up, 24 * 3600, "the worker to catch up")
            produce(bootstrap, run.names.raw, copies(lines, start, min(start + chunk, pages)))
        wait_for(lambda: run.outputs() >= pages, 24 * 3600, f"{pages} pages indexed")
        rate = pages / (time.time() - t0)
        produce(bootstrap, run.names.raw, copies(lines, pages, pages + 400))
        wait_for(lambda: run.outputs() >= pages + 100, 600, "the stream going on")
        w.kill()
        killed = time.time()
        before = run.outputs()
        again = run.worker(0).start()
        wait_for(lambda: again.get("/readyz") == 200, 3600, "ready after the restart")
        ready = time.time() - killed
        wait_for(lambda: run.outputs() > before, 3600, "a decision after the restart")
        return ready, time.time() - killed, rate
    finally:
        run.close()


def throughput_rounds(
    bootstrap: str, tmp: Path, lines: list[bytes], rounds: int, *, pin: bool, kw: dict[str, Any]
) -> float:
    """The engine (state in memory, then in RocksDB), 1 worker and 2 workers, one after
    the other, ``rounds`` times; prints each round and, for more than one, the medians and
    the medians of the per-round ratios. Returns the median pages/s of 1 worker.

    "Per core" compares CPU a page. The worker keeps its state in RocksDB, so the engine
    with its state in RocksDB (``neardup dedup --state``) is the like-for-like figure;
    the engine with its state in memory (``neardup dedup`` without ``--state``) is the
    harder one, and is printed too."""
    rows: list[dict[str, float]] = []
    for r in range(1, rounds + 1):
        head = f"round {r}: " if rounds > 1 else ""
        days = kw.get("retention_days", 0)
        mem = engine_rate(lines, pin, retention_days=days)
        print(f"{head}engine, memory state:   {mem.pages_s:7.1f} pages/s, {mem.split()}")
        rocks = engine_rate(lines, pin, tmp / f"engine-{r}", retention_days=days)
        print(f"{head}engine, RocksDB state:  {rocks.pages_s:7.1f} pages/s, {rocks.split()}")
        one = throughput(bootstrap, tmp / f"t1-{r}", lines, 1, pin=pin, **kw)
        print(
            f"{head}worker x1:              {one.pages_s:7.1f} pages/s, {one.split()}; per "
            f"core {rocks.cpu / one.cpu:.0%} of the engine with RocksDB state, "
            f"{mem.cpu / one.cpu:.0%} with memory state"
        )
        # One worker on core 0 leaves the broker the other core; two workers share both
        # cores with it. One worker with the broker on its own core as well compares
        # like with like: the ratio is then the workers' scaling, whatever the broker's
        # CPU.
        shared = None
        if pin and kw.get("broker_pid"):
            shared = throughput(bootstrap, tmp / f"t1s-{r}", lines, 1, pin=pin, broker_core=0, **kw)
            print(
                f"{head}worker x1, broker on its core: {shared.pages_s:7.1f} pages/s, "
                f"{shared.split()}"
            )
        two = throughput(bootstrap, tmp / f"t2-{r}", lines, 2, pin=pin, **kw)
        # With the broker on the same cores, two workers can make at most the cores
        # divided by the CPU a page of the workers and of the broker together.
        cores = len(os.sched_getaffinity(0))
        ceiling = cores / (two.cpu + two.broker_cpu) if two.broker_cpu is not None else None
        bound = (
            ""
            if ceiling is None
            else f"; {cores} cores shared with the broker allow at most {ceiling:.1f} pages/s, "
            f"x{ceiling / one.pages_s:.2f}"
        )
        print(
            f"{head}worker x2:              {two.pages_s:7.1f} pages/s, {two.split()}; "
            f"x{two.pages_s / one.pages_s:.2f} one worker{bound}"
            + (
                ""
                if shared is None
                else f"; x{two.pages_s / shared.pages_s:.2f} one worker with the broker on its core"
            ),
            flush=True,
        )
        rows.append(
            {
                "mem": mem.pages_s,
                "mem_cpu": mem.cpu,
                "rocks": rocks.pages_s,
                "rocks_cpu": rocks.cpu,
                "one": one.pages_s,
                "one_cpu": one.cpu,
                "one_own": one.own_cpu,
                "two": two.pages_s,
                "per_core": rocks.cpu / one.cpu,
                "per_core_mem": mem.cpu / one.cpu,
                "scaling": two.pages_s / one.pages_s,
                "bound": ceiling / one.pages_s if ceiling is not None else float("nan"),
                "shared": shared.pages_s if shared is not None else float("nan"),
                "scaling_shared": (
                    two.pages_s / shared.pages_s if shared is not None else float("nan")
                ),
            }
        )
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    if rounds > 1:
        print(
            f"medians of {rounds} rounds: engine {med['rocks']:.1f} pages/s with RocksDB state "
            f"({med['rocks_cpu'] * 1000:.1f} ms CPU a page), {med['mem']:.1f} with memory "
            f"state ({med['mem_cpu'] * 1000:.1f} ms); worker x1 {med['one']:.1f} pages/s "
            f"({med['one_cpu'] * 1000:.1f} ms CPU a page, {med['one_own'] * 1000:.1f} in the "
            f"process), x2 {med['two']:.1f} pages/s; per-round ratios: per core "
            f"{med['per_core']:.0%} of the engine with RocksDB state "
            f"({med['per_core_mem']:.0%} with memory state), x{med['scaling']:.2f} for two "
            f"workers (at most x{med['bound']:.2f} with the broker's CPU on the same cores)"
            + (
                ""
                if math.isnan(rows[0]["shared"])  # not measured
                else f"; one worker with the broker on its core {med['shared']:.1f} pages/s, "
                f"x{med['scaling_shared']:.2f} for two workers against it"
            )
        )
    return med["one"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--limit", type=int, default=0, help="use the first N pages only")
    ap.add_argument(
        "--passes",
        type=int,
        default=1,
        help="throughput over the pages this many times (each pass under new ids, two days "
        "after the one before), so that the pipeline's filling and draining weigh less",
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--topology", choices=["routed", "sequential", "partitioned"], default="routed")
    ap.add_argument("--recovery-pages", type=int, default=100_000)
    ap.add_argument("--keep", action="store_true", help="keep the workers' logs and state")
    ap.add_argument(
        "--retention-days",
        type=int,
        default=0,
        help="throughput's engine and workers keep index entries this many days (the "
        "engine's retention_days, NEARDUP_RETENTION_DAYS); 1 with --passes: the passes are 2 "
        "days apart and the dev pages span 12 hours, so no pass finds copies in the ones "
        "before it, and each is decided nearly like the first",
    )
    ap.add_argument(
        "--standby-replicas",
        type=int,
        default=1,
        help="throughput's NEARDUP_STANDBY_REPLICAS (the worker's default, 1: each of two "
        "workers keeps a replica of the other's tables, as a deployment of two does)",
    )
    ap.add_argument(
        "--rate", type=float, default=50.0, help="latency's input rate when throughput is skipped"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="throughput rounds (engine, x1, x2), with medians"
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="throughput with one core per process: the engine and 1 worker on core 0, "
        "2 workers on cores 0 and 1 (each with its sandbox child; the broker unpinned)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="--topology partitioned: the worker counts whose CPU a page is measured",
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["throughput", "latency", "recovery"])
    ap.add_argument(
        "--broker-dir",
        type=Path,
        default=None,
        help="with --bootstrap: scripts/kafka-local.sh's run dir (NEARDUP_KAFKA_DIR), whose "
        "kafka.pid gives the broker's CPU a page (a broker of the bench's own: always)",
    )
    args = ap.parse_args()
    if args.passes < 1:
        ap.error("--passes must be 1 or more")

    lines = [ln.rstrip(b"\n") for ln in raw_lines(args.data / "pages.jsonl.gz")]
    if args.limit:
        lines = lines[: args.limit]
    stream = lines + list(copies(lines, len(lines), args.passes * len(lines)))
    broker = None if args.bootstrap else local_broker()
    bootstrap = broker.bootstrap if broker is not None else args.bootstrap
    tmp = Path(tempfile.mkdtemp(prefix="neardup-bench-"))
    try:
        print(
            f"{len(lines)} dev pages ({args.passes} pass{'es' if args.passes > 1 else ''} in "
            f"throughput), broker {bootstrap}, "
            f"{args.partitions} partitions, "
            f"topology {args.topology}, {args.standby_replicas} standby replicas, "
            f"{os.cpu_count()} cores"
        )
        if args.topology == "partitioned":  # its own set of figures, bench/worker_partitioned.py
            from bench.worker_partitioned import report

            report(bootstrap, tmp, lines, stream, args)
            return
        kw: dict[str, Any] = {"parts": args.partitions, "topology": args.topology}
        run_dir = broker.run_dir if broker is not None else args.broker_dir
        jvm = broker_pid(run_dir) if run_dir is not None else None
        one = 0.0
        if "throughput" not in args.skip:
            one = throughput_rounds(
                bootstrap,
                tmp,
                stream,
                args.rounds,
                pin=args.pin,
                kw={
                    **kw,
                    "broker_pid": jvm,
                    "retention_days": args.retention_days,
                    "standby_replicas": args.standby_replicas,
                },
            )
        if "latency" not in args.skip:
            rate = one / 2 if one else args.rate
            p50, p99, n = latency(
                bootstrap, tmp / "lat", lines[: max(200, int(rate * 60))], rate, **kw
            )
            print(
                f"end-to-end latency at {rate:.0f} pages/s (1 worker, {n} pages): "
                f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
            )
        if "recovery" not in args.skip:
            ready, first, rate = recovery(bootstrap, tmp / "rec", lines, args.recovery_pages, **kw)
            print(
                f"recovery after SIGKILL with {args.recovery_pages} pages indexed "
                f"(indexed at {rate:.0f} pages/s): ready after {ready:.1f} s, "
                f"next decision after {first:.1f} s"
            )
    finally:
        if args.keep:
            print(f"worker logs and state kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if broker is not None:
            broker.run("stop", check=False)


if __name__ == "__main__":
    main()
