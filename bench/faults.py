"""The worker under faults, on the dev pages, against a broker of its own. Prints figures;
asserts nothing (the integration tests in tests/integration/test_faults.py do).

    .venv/bin/python bench/faults.py [--pages 600] [--kills 10] [--seed N]
        [--rebuild-pages 100000] [--load-minutes 5] [--load-pages N] [--quota-kib 256]

It starts scripts/kafka-local.sh on free loopback ports (it stops and starts that broker)
and measures, in one run:

* SIGKILL: one worker killed ``--kills`` times at seeded random points while it decides
  ``--pages`` dev pages, restarted each time on its state directory: pages in against
  decisions plus rejects out, and from each kill to ready and to the next decision;
* broker restart: the broker stopped (``stop --keep``) and started while the worker runs:
  pages in and out, and from the stop to the next decision;
* state rebuild: a worker indexes ``--rebuild-pages`` pages (the dev pages again and again
  under new ids, as ``bench/worker.py``'s recovery does), stops, loses its state
  directory and starts again: the time to rebuild from the changelog topics, then pages
  in and out with the rest of the stream;
* slow downstream: the whole dev set (or ``--load-pages`` of its copies, enough to keep the
  worker busy for the whole run) waiting in the raw topic while the broker throttles every
  producer to ``--quota-kib`` KiB/s (a client quota, ``producer_byte_rate``), for
  ``--load-minutes``: the resident memory of the worker process tree and of the worker's
  own process, sampled every second; the bytes the worker wrote to the broker a page (its
  internal topics and outputs: the rate the quota allows, against the rate measured).

Each scenario also checks its decisions and clusters against ``neardup dedup`` on the same
pages and prints whether they agree.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines
from bench.memory import rss
from bench.worker import copies
from neardup.cli import main as neardup
from tests.integration import helpers
from tests.integration.helpers import (
    Deployment,
    LocalBroker,
    Reference,
    all_out,
    check_against,
    reference,
    tree_rss,
)


def in_order(lines: list[bytes]) -> list[bytes]:
    """The dev pages in (fetched_at, page_id) order, the order the worker decides in."""
    from tests.integration.helpers import _sort_key

    return sorted(lines, key=_sort_key)


def outcome(values: Sized, ref: Reference, d: Deployment) -> str:
    """Pages in against distinct decisions plus rejects out, and the reference check."""
    decided = d.decided()
    rejected = {(r["page_id"], r["url"]) for r in d.rejects()}
    copies_out = len(d.decisions()) - len(decided)
    try:
        check_against(ref, d)
        same = "same decisions and clusters as neardup dedup"
    except AssertionError as exc:
        same = f"DIFFERS from neardup dedup: {str(exc)[:200]}"
    return (
        f"{len(values)} pages in, {len(decided)} decisions + {len(rejected)} rejects out "
        f"({copies_out} identical copies); {same}"
    )


def settle(d: Deployment, ref: Reference, timeout: float) -> None:
    """Wait until every page is out; on a timeout, say so (the counts tell what is missing)."""
    try:
        d.wait(lambda: all_out(ref, d), timeout, "every page out")
    except AssertionError as exc:
        print(f"  NOT EVERY PAGE OUT: {exc}")


def sigkills(broker: LocalBroker, tmp: Path, values: list[bytes], kills: int, seed: int) -> None:
    rng = random.Random(seed)
    ref = reference(values, tmp)
    d = Deployment(broker.bootstrap, tmp / "kill", 2)
    try:
        d.produce(values)
        ready_s, next_s = [], []
        w = d.worker(0)
        w.env["NEARDUP_GROUP_INSTANCE_ID"] = "w0"
        w.start()
        done = 0
        for k in range(kills):
            step = rng.randint(1, max(2, len(values) // (kills * 2)))
            target = min(len(d.decided()) + step, len(ref.decisions) - 1)
            try:
                d.wait(lambda t=target: len(d.decided()) >= t, 180, f"decision {target}")
            except AssertionError as exc:
                print(f"  stopped killing after {k} kills: {exc}")
                break
            time.sleep(rng.uniform(0.0, 1.0))
            w.kill()
            done += 1
            killed, before = time.monotonic(), len(d.decisions())
            w = d.worker(0)
            w.env["NEARDUP_GROUP_INSTANCE_ID"] = "w0"
            w.start()
            d.wait(lambda w=w: w.get("/readyz") == 200, 900, "ready after the kill")
            ready_s.append(time.monotonic() - killed)
            d.wait(lambda b=before: len(d.decisions()) > b or all_out(ref, d), 180, "a decision")
            next_s.append(time.monotonic() - killed)
        settle(d, ref, 300)
        print(f"SIGKILL x{done} (seed {seed}): {outcome(values, ref, d)}")
        print(
            f"  kill to ready: median {statistics.median(ready_s):.1f} s "
            f"(min {min(ready_s):.1f}, max {max(ready_s):.1f}); kill to next decision: "
            f"median {statistics.median(next_s):.1f} s (max {max(next_s):.1f})"
        )
    finally:
        d.close()


def broker_restart(broker: LocalBroker, tmp: Path, values: list[bytes]) -> None:
    ref = reference(values, tmp)
    d = Deployment(broker.bootstrap, tmp / "broker", 2)
    try:
        d.produce(values)
        d.worker(0).start()
        d.wait(lambda: len(d.decided()) >= len(values) // 4, 900, "a quarter decided")
        t0 = time.monotonic()
        broker.run("stop", "--keep")
        stopped = time.monotonic()
        at = len(d.decided())
        broker.run("start")
        up = time.monotonic()
        d.wait(lambda: len(d.decided()) > at or all_out(ref, d), 900, "a decision after")
        back = time.monotonic()
        settle(d, ref, 300)
        print(f"broker restart: {outcome(values, ref, d)}")
        print(
            f"  broker stop {stopped - t0:.1f} s, down {up - stopped:.1f} s (start to ready); "
            f"next decision {back - up:.1f} s after the broker was ready, "
            f"{back - t0:.1f} s after the stop began"
        )
    finally:
        d.close()


def reference_streamed(values: Iterable[bytes], tmp: Path) -> Reference:
    """``neardup dedup`` over ``values``, written to a gzip file one at a time (100,000
    copies of the dev pages are ~16 GB: kept in memory, they took the machine's)."""
    stream = tmp / "stream.jsonl.gz"
    tmp.mkdir(parents=True, exist_ok=True)
    with gzip.open(stream, "wb", compresslevel=1) as fh:
        for v in values:
            fh.write(v + b"\n")
    out, clusters, rejects = tmp / "ref-decisions.jsonl", tmp / "ref-clusters.jsonl", tmp / "r"
    args = ["dedup", str(stream), "--out", str(out), "--clusters", str(clusters)]
    neardup([*args, "--rejects", str(rejects), "-q"])

    def read(p: Path) -> list[dict[str, Any]]:
        with p.open(encoding="utf-8") as fh:
            return [json.loads(x) for x in fh]

    return Reference(
        read(out), {c["page_id"]: c["cluster_id"] for c in read(clusters)}, read(rejects)
    )


def rebuild(broker: LocalBroker, tmp: Path, lines: list[bytes], pages: int) -> None:
    total = pages + 200
    values = range(total)  # (their count: the pages themselves are made as they go)
    t0 = time.monotonic()
    ref = reference_streamed(copies(lines, 0, total), tmp)
    print(f"  (reference over {total} pages: {time.monotonic() - t0:.0f} s)")
    d = Deployment(broker.bootstrap, tmp / "rebuild", 2)
    try:
        d.produce(copies(lines, 0, pages))
        w = d.worker(0).start()
        t0 = time.monotonic()
        d.wait(lambda: len(d.decided()) + len(d.rejects()) >= pages, 24 * 3600, "indexed")
        rate = pages / (time.monotonic() - t0)
        w.stop()
        shutil.rmtree(d.tmp / "worker0")
        d.produce(copies(lines, pages, total))
        t0 = time.monotonic()
        again = d.worker(0).start()
        d.wait(lambda: again.get("/readyz") == 200, 24 * 3600, "rebuilt")
        ready = time.monotonic() - t0
        settle(d, ref, 600)
        done = time.monotonic() - t0
        print(f"state deleted with {pages} pages indexed: {outcome(values, ref, d)}")
        print(
            f"  indexed at {rate:.0f} pages/s; rebuilt from the changelog in {ready:.1f} s, "
            f"the remaining {len(values) - pages} pages decided {done:.1f} s after the start"
        )
        if pages < 100_000:
            print(
                f"  EXTRAPOLATED, not measured: at the same records per page, 100,000 pages "
                f"would take about {ready * 100_000 / pages:.0f} s to rebuild (linear in the "
                "changelog records; measured here with fewer pages)"
            )
    finally:
        d.close()


def written(broker: LocalBroker, prefix: str) -> int:
    """Bytes on the broker's disk in the topics of the run ``prefix``, its raw topic left
    out: what the worker wrote (one replica, no compaction in a run this short)."""
    return sum(
        f.stat().st_size
        for part in (broker.run_dir / "data").iterdir()
        if part.name.startswith((f"{prefix}-", f"{prefix}.")) and ".raw-" not in part.name
        for f in part.iterdir()
        if f.suffix == ".log"
    )


def slow_downstream(
    broker: LocalBroker, tmp: Path, values: list[bytes], minutes: float, quota_kib: int
) -> None:
    d = Deployment(broker.bootstrap, tmp / "slow", 2)
    quota = ["--entity-type", "clients", "--entity-default"]
    # (seconds, tree RSS, the worker process's own RSS, pages out)
    samples: list[tuple[float, int, int, int]] = []
    try:
        d.produce(values)  # the backlog, before the quota (it throttles every client)
        broker.config("--alter", *quota, "--add-config", f"producer_byte_rate={quota_kib << 10}")
        w = d.worker(0).start()
        assert w.proc is not None
        t0 = time.monotonic()
        end = t0 + minutes * 60
        out = 0
        while time.monotonic() < end and out < len(values):
            out = len(d.decided()) + len(d.rejects())
            samples.append((time.monotonic() - t0, tree_rss(w.proc.pid), rss(w.proc.pid), out))
            assert w.alive(), w.tail()
            time.sleep(1.0)
        out = len(d.decided()) + len(d.rejects())
        elapsed = time.monotonic() - t0
        same = "not every page out: not compared with neardup dedup"
        if out >= len(values):
            same = outcome(values, reference(values, tmp), d)
        wrote = written(broker, d.names.prefix)
    finally:
        broker.config("--alter", *quota, "--delete-config", "producer_byte_rate")
        d.close()
    mib = [r / 2**20 for _, r, _, _ in samples]
    minute = [r for (t, *_), r in zip(samples, mib, strict=True) if t <= 60]
    later = [r for (t, *_), r in zip(samples, mib, strict=True) if t > 60]
    print(
        f"slow downstream ({quota_kib} KiB/s for every producer, {elapsed / 60:.1f} min): "
        f"{len(values)} pages waiting, {out} out ({out / elapsed:.2f} pages/s); {same}"
    )
    per = wrote / max(out, 1) / 1024
    print(
        f"  the worker wrote {per:.1f} KiB a page to the broker: {out * per / elapsed:.0f} "
        f"KiB/s, the quota allowing {quota_kib / per:.2f} pages/s"
    )
    print(
        f"  worker tree RSS: peak {max(mib):.0f} MiB; peak in the first minute "
        f"{max(minute):.0f} MiB, after it {max(later) if later else float('nan'):.0f} MiB; "
        f"last {mib[-1]:.0f} MiB"
    )
    # six windows (of 10 minutes in an hour's run): the peaks of the tree and of the
    # worker's own process (the rest is its sandbox children), and the pages out by then
    span = max(minutes * 10, 1.0)
    windows: dict[int, tuple[float, float, int]] = {}
    for (t, _, own, n), r in zip(samples, mib, strict=True):
        tree0, own0, _ = windows.get(int(t // span), (0.0, 0.0, 0))
        windows[int(t // span)] = (max(tree0, r), max(own0, own / 2**20), n)
    print(
        f"  by {span / 60:g} minutes, peak RSS of the tree / of the worker's own process "
        "(MiB), pages out: "
        + "; ".join(f"{tree:.0f} / {own:.0f}, {n}" for tree, own, n in windows.values())
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=600)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rebuild-pages", type=int, default=100_000)
    ap.add_argument("--load-minutes", type=float, default=5.0)
    ap.add_argument("--load-pages", type=int, default=0, help="default: the dev set once")
    ap.add_argument("--quota-kib", type=int, default=256)
    ap.add_argument("--checkout", type=Path, default=None, help="run this checkout's worker")
    ap.add_argument(
        "--only",
        nargs="*",
        default=["kill", "broker", "rebuild", "slow"],
        choices=["kill", "broker", "rebuild", "slow"],
    )
    args = ap.parse_args()
    if args.checkout is not None:
        # the worker runs ``python -m neardup.kafka`` in ``helpers.ROOT``, which puts that
        # directory first on its path: the other checkout's package is the one imported
        helpers.ROOT = args.checkout.resolve()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)

    lines = [ln.rstrip(b"\n") for ln in raw_lines(args.data / "pages.jsonl.gz")]
    tmp = Path(tempfile.mkdtemp(prefix="neardup-faults-"))
    broker = LocalBroker(tmp / "kafka")
    broker.run("start")
    try:
        print(f"{len(lines)} dev pages, broker {broker.bootstrap}")
        subset = in_order(lines)[: args.pages]
        scenarios: dict[str, Any] = {
            "kill": lambda: sigkills(broker, tmp / "k", subset, args.kills, seed),
            "broker": lambda: broker_restart(broker, tmp / "b", subset),
            "rebuild": lambda: rebuild(broker, tmp / "r", lines, args.rebuild_pages),
            "slow": lambda: slow_downstream(
                broker,
                tmp / "s",
                list(copies(lines, 0, args.load_pages)) if args.load_pages else lines,
                args.load_minutes,
                args.quota_kib,
            ),
        }
        for name in args.only:
            (tmp / name[0]).mkdir(exist_ok=True)
            t0 = time.monotonic()
            scenarios[name]()
            print(f"  ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        broker.run("stop", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
