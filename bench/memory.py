"""Resident memory of one worker as its state grows: the dev pages again and again under
new ids (as ``bench/worker.py``'s recovery does), produced a chunk at a time as the
worker keeps up, against a real broker.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/memory.py \
        [--pages 100000] [--every 10000] [--backlog N] [--checkout DIR] [--env NAME=VALUE ...]

Every ``--every`` pages decided it prints the worker process's own resident memory
(VmRSS), the peak of its process tree's (the worker and its sandbox children, sampled
every second; pages they share count more than once), and the tables' RocksDB memory
from ``/metrics`` (``neardup_rocksdb_memory_bytes``, where the build has it). At the end:
the CPU of the process tree a page (children that ended are not counted) and the pages
per second. ``--backlog N`` produces the first N pages before the worker starts, as a
crawler does that wrote on while the workers were down: what the worker holds in memory
while it reads a backlog. ``--checkout`` runs the worker of another checkout (a ``git
worktree`` of an earlier commit, say) for a comparison; run the two one after the other,
more than once, on a quiet machine.

The same worker, its pages indexed, then gives the recovery figures with no seeding of
their own (100,000 pages take most of an hour here): ``--recovery`` SIGKILLs it with pages
flowing and starts it again on its state directory (``bench/worker.py``'s
``--recovery-pages``: seconds to ready and to the next decision); ``--lost-state`` then
stops it, deletes its state directory and starts it again, so that it rebuilds its state
from the changelog topics (``bench/faults.py``'s rebuild, without the comparison with
``neardup dedup``): seconds to ready, to the next decision and to the last of 200 new
pages, and its RSS after the rebuild. Run the bench under ``nice`` to spare a shared
machine: the recovery steps run at nice 0 (given the privilege to lower it). Asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines
from bench.worker import Run, copies, kill_and_restart, own_cpu, unnice
from tests.integration import helpers
from tests.integration.helpers import produce, tree_pids, wait_for

MIB = 1 << 20


def rss(pid: int) -> int:
    """Resident bytes of one process (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rocksdb_bytes(metrics: str) -> int | None:
    found = re.search(r"^neardup_rocksdb_memory_bytes (\S+)$", metrics, re.M)
    return int(float(found.group(1))) if found else None


def disk(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def lost_state(run: Run, worker: helpers.WorkerProcess, lines: list[bytes], pages: int) -> None:
    """Once ``worker`` has answered ``pages`` pages: stop it, delete its state directory,
    produce 200 more pages and start it again; print the seconds to ready (its state
    rebuilt from the changelog topics), to its next decision and to the last new page."""
    unnice()
    wait_for(lambda: run.answered() >= pages, 3600, "every page out before the stop")
    worker.stop()
    state = disk(run.tmp / "w0")
    shutil.rmtree(run.tmp / "w0")
    before = run.answered()
    produce(run.bootstrap, run.names.raw, copies(lines, pages, pages + 200))
    t0 = time.time()
    again = run.worker(0).start()
    wait_for(lambda: again.get("/readyz") == 200, 3600, "ready after losing the state")
    ready = time.time() - t0
    assert again.proc is not None
    wait_for(lambda: run.answered() > before, 3600, "a decision after losing the state")
    first = time.time() - t0
    wait_for(lambda: run.answered() >= before + 200, 3600, "the 200 new pages out")
    done = time.time() - t0
    print(
        f"state directory ({state / MIB:.0f} MiB) deleted with {pages} pages indexed: "
        f"rebuilt and ready after {ready:.1f} s, next decision after {first:.1f} s, the 200 "
        f"new pages out after {done:.1f} s; worker RSS then {rss(again.proc.pid) / MIB:.0f} "
        f"MiB, tree {sum(rss(p) for p in tree_pids(again.proc.pid)) / MIB:.0f} MiB",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--backlog", type=int, default=0, help="pages produced before the start")
    ap.add_argument("--checkout", type=Path, default=None, help="run this checkout's worker")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument(
        "--seed-minutes",
        type=float,
        default=0,
        help="produce no more pages after this many minutes: the figures, and the recovery "
        "steps, are then those of the pages produced by then (0: no limit)",
    )
    ap.add_argument("--recovery", action="store_true", help="then SIGKILL and restart it")
    ap.add_argument(
        "--lost-state", action="store_true", help="then delete its state and start it again"
    )
    args = ap.parse_args()
    if not args.bootstrap:
        raise SystemExit("set KAFKA_BOOTSTRAP_SERVERS (scripts/kafka-local.sh start)")

    lines = [ln.rstrip(b"\n") for ln in raw_lines(args.data / "pages.jsonl.gz")]
    tmp = Path(tempfile.mkdtemp(prefix="neardup-memory-"))
    raw_configs = {"retention.ms": str(10 * 60 * 1000), "segment.bytes": str(128 << 20)}
    run = Run(args.bootstrap, tmp, args.partitions, raw_configs)
    worker = run.worker(0)
    worker.env.update(dict(item.split("=", 1) for item in args.env))
    if args.checkout is not None:
        # the worker runs ``python -m neardup.kafka`` in ``helpers.ROOT``, which puts that
        # directory first on its path: the other checkout's package is the one imported
        helpers.ROOT = args.checkout.resolve()
    commit = subprocess.run(
        [
            "git",
            "-C",
            str(args.checkout or Path(__file__).parent),
            "describe",
            "--always",
            "--dirty",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    produced = min(args.backlog, args.pages)
    for start in range(0, produced, 2000):
        produce(args.bootstrap, run.names.raw, copies(lines, start, min(start + 2000, produced)))
    worker.start()
    assert worker.proc is not None
    pid = worker.proc.pid
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            peak[0] = max(peak[0], sum(rss(p) for p in tree_pids(pid)))

    threading.Thread(target=sample, daemon=True).start()
    print(
        f"worker of {commit}, {args.partitions} partitions, {args.pages} pages "
        f"({produced} waiting at the start), env {args.env}"
    )
    print("pages decided | seconds | worker RSS MiB | tree peak MiB | RocksDB MiB")
    t0 = time.time()
    chunk, shown, pages = 2000, 0, args.pages
    try:
        while shown < pages:
            if (
                args.seed_minutes
                and pages == args.pages
                and time.time() - t0 > 60 * args.seed_minutes
            ):
                pages = produced
                print(f"no more pages produced after {args.seed_minutes:g} minutes: {pages} pages")
            if produced < pages and run.outputs() >= produced - chunk:
                stop = min(produced + chunk, pages)
                produce(args.bootstrap, run.names.raw, copies(lines, produced, stop))
                produced = stop
            n = run.outputs()
            if n >= min(shown + args.every, pages):
                shown = n - n % args.every if n < pages else pages
                rocks = rocksdb_bytes(worker.fetch("/metrics")[1])
                print(
                    f"{n:13d} | {time.time() - t0:7.0f} | {rss(pid) / MIB:14.0f} | "
                    f"{peak[0] / MIB:13.0f} | " + ("-" if rocks is None else f"{rocks / MIB:.0f}"),
                    flush=True,
                )
            time.sleep(0.5)
        wait_for(lambda: run.outputs() >= pages, 600, "every page answered")
        cpu = sum(own_cpu(p) for p in tree_pids(pid))
        took = time.time() - t0
        print(
            f"CPU of the tree {1000 * cpu / pages:.2f} ms a page; "
            f"{pages / took:.1f} pages/s; state directory {disk(tmp / 'w0') / MIB:.0f} MiB",
            flush=True,
        )
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average: {load}", flush=True)
        if args.recovery:
            ready, first = kill_and_restart(run, worker, lines, pages)
            print(
                f"restart after SIGKILL with {pages} pages indexed: ready after {ready:.1f} s, "
                f"next decision after {first:.1f} s",
                flush=True,
            )
            pages += 400
            worker = run.workers[-1]
        if args.lost_state:
            lost_state(run, worker, lines, pages)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average at the end: {load}", flush=True)
    finally:
        done.set()
        run.close()


if __name__ == "__main__":
    main()
