"""The Kafka worker against a real local broker, on the dev pages. Prints figures; asserts
nothing.

    .venv/bin/python bench/worker.py [--bootstrap HOST:PORT] [--limit N] [--partitions 4]
        [--passes 1] [--workers 1 2 4] [--skip throughput latency recovery]
        [--rate 50] [--retention-days 0] [--recovery-pages 0]

Without ``--bootstrap`` (or KAFKA_BOOTSTRAP_SERVERS) it starts scripts/kafka-local.sh on
free loopback ports and stops it at the end. The figures are bench/worker_partitioned.py's:
CPU a page of the whole deployment with 1, 2 and 4 workers (``--workers``) against
``neardup dedup --state`` in the same run, latency at half the capacity of 2 workers, and
one of 2 workers SIGKILLed with pages flowing. With ``--recovery-pages N``, also: one
worker indexes N pages (the dev pages again and again under new ids), is SIGKILLed
mid-stream and started again on its state directory; the time until it is ready and
until its next decision.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines

# bench/faults.py, memory.py and scale.py take these from here
from bench.worker_common import Run, copies, create_topic, local_broker, own_cpu
from tests.integration.helpers import WorkerProcess, produce, wait_for

__all__ = ["Run", "copies", "create_topic", "local_broker", "own_cpu"]


def restart(bootstrap: str, tmp: Path, lines: list[bytes], pages: int, *, parts: int) -> str:
    """One worker indexes ``pages`` pages, is SIGKILLed with pages flowing and started
    again on its state: seconds from the kill to ready and to its next decision."""
    # The raw topic keeps what is consumed for a short while only, and pages are produced
    # a chunk at a time as the worker keeps up: the backlog, and the disk, stay bounded.
    raw_configs = {"retention.ms": str(10 * 60 * 1000), "segment.bytes": str(128 << 20)}
    run = Run(bootstrap, tmp, parts, raw_configs)
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
        ready, first = kill_and_restart(run, w, lines, pages)
    finally:
        run.close()
    return (
        f"restart after SIGKILL with {pages} pages indexed (indexed at {rate:.0f} pages/s): "
        f"ready after {ready:.1f} s, next decision after {first:.1f} s"
    )


def kill_and_restart(
    run: Run, w: WorkerProcess, lines: list[bytes], pages: int
) -> tuple[float, float]:
    """SIGKILL worker ``w`` of ``run`` (its ``pages`` pages decided) with 400 more pages
    flowing, and start it again on its state directory: seconds from the kill to ready
    and to its next decision. The restarted worker, and this process's threads (which
    read the decisions), run at the default priority: a bench that indexed its pages
    under ``nice`` times the recovery itself as a worker runs."""
    unnice()
    produce(run.bootstrap, run.names.raw, copies(lines, pages, pages + 400))
    wait_for(lambda: run.outputs() >= pages + 100, 600, "the stream going on")
    w.kill()
    killed = time.time()
    before = run.outputs()
    again = run.worker(0).start()
    wait_for(lambda: again.get("/readyz") == 200, 3600, "ready after the restart")
    ready = time.time() - killed
    wait_for(lambda: run.outputs() > before, 3600, "a decision after the restart")
    return ready, time.time() - killed


def unnice() -> None:
    """Every thread of this process at nice 0 (processes it starts from now on inherit
    it); needs the privilege to lower a nice value, else leaves it as it is."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)


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
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="the worker counts whose CPU a page is measured",
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["throughput", "latency", "recovery"])
    ap.add_argument(
        "--rate", type=float, default=50.0, help="latency's input rate when throughput is skipped"
    )
    ap.add_argument(
        "--recovery-pages",
        type=int,
        default=0,
        help="also restart one worker SIGKILLed with this many pages indexed (0: not measured)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the workers' logs and state")
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
            f"throughput), broker {bootstrap}, {args.partitions} partitions, "
            f"{os.cpu_count()} cores",
            flush=True,
        )
        from bench.worker_partitioned import report

        report(bootstrap, tmp, lines, stream, args)
        if args.recovery_pages:
            print(restart(bootstrap, tmp / "restart", lines, args.recovery_pages,
                          parts=args.partitions))  # fmt: skip
    finally:
        if args.keep:
            print(f"worker logs and state kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if broker is not None:
            broker.run("stop", check=False)


if __name__ == "__main__":
    main()
