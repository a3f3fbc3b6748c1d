"""Faults against a real broker: SIGKILLs at random points, a broker restart, a worker
joining and leaving, a deleted state directory, a full disk, a refused changelog batch
and a slow downstream.

Each test checks that every input page gets exactly one decision or one rejection (copies
of a decision, at least once, are identical), and that the decisions and final clusters
are those of ``neardup dedup`` over the same stream. The random kill points are seeded:
the seed is printed, and ``NEARDUP_FAULT_SEED`` replays a run.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neardup.kafka import freshness
from tests.integration.helpers import (
    LocalBroker,
    accounted,
    all_out,
    check_after_fault,
    check_against,
    reference,
    stream,
    tables_match_changelogs,
    tree_rss,
    wait_for,
)

pytestmark = pytest.mark.integration

DEADLINE = 240.0


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path_factory.mktemp("kafka") / "run")
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop", check=False)


def _seed() -> int:
    seed = int(os.environ.get("NEARDUP_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"fault seed: {seed} (NEARDUP_FAULT_SEED={seed} replays it)")
    return seed


@pytest.mark.parametrize("topology", ["routed", "partitioned"])
def test_ten_sigkills_at_random_points(deploy: Any, tmp_path: Path, topology: str) -> None:
    rng = random.Random(_seed())
    values = stream(range(1, 11))
    ref = reference(values, tmp_path)
    d = deploy(2, topology)
    # the stream arrives in 11 parts, one before each start, so each kill finds work
    parts = [values[i * len(values) // 11 : (i + 1) * len(values) // 11] for i in range(11)]
    points = []
    for kill in range(10):
        d.produce(parts[kill])
        w = d.worker(0)
        w.env["NEARDUP_GROUP_INSTANCE_ID"] = "w0"  # the restarted worker rejoins at once
        w.start()
        before = len(d.decided())
        if rng.random() < 0.4:  # anywhere from start-up and recovery to work
            delay = rng.uniform(0.5, 8.0)
            point = f"{delay:.2f} s after start"
            time.sleep(delay)
        else:  # while deciding
            extra = rng.uniform(0.0, 1.5)
            d.wait(lambda b=before: len(d.decided()) > b, DEADLINE, f"decisions ({kill})")
            time.sleep(extra)
            point = f"after decision {before + 1}, +{extra:.2f} s"
        assert w.alive(), f"the worker died by itself before kill {kill + 1}:\n{w.tail()}"
        w.kill()
        points.append(point)
        print(f"kill {kill + 1}: {point}, {len(d.decided())} decided")
    d.produce(parts[10])
    last = d.worker(0)
    last.env["NEARDUP_GROUP_INSTANCE_ID"] = "w0"
    last.start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after 10 kills")
    pages, out = check_after_fault(values, ref, d)
    print(f"10 SIGKILLs: {pages} pages in, {out} decisions + rejects out")


@pytest.mark.parametrize("topology", ["routed", "partitioned"])
def test_broker_stopped_and_restarted_while_the_worker_runs(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker, topology: str
) -> None:
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2, topology, bootstrap=own_broker.bootstrap)
    d.produce(values)
    w = d.worker(0).start()
    d.wait(lambda: len(d.decided()) >= len(ref.decisions) // 4, DEADLINE, "a quarter decided")
    cluster = own_broker.cluster_id()
    own_broker.run("stop", "--keep")
    down = time.monotonic()
    assert (own_broker.run_dir / "data" / "meta.properties").exists()
    assert w.alive(), f"the worker died when the broker stopped:\n{w.tail()}"
    started = own_broker.run("start")
    assert "reusing formatted storage" in started.stderr
    assert own_broker.cluster_id() == cluster  # the same data, not a fresh format
    at = len(d.decided())
    d.wait(lambda: len(d.decided()) > at or all_out(ref, d), DEADLINE, "a decision after")
    print(f"broker down to the next decision: {time.monotonic() - down:.1f} s")
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the broker restart")
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    print(f"broker restart: {pages} pages in, {out} decisions + rejects out")


def test_a_worker_told_to_stop_while_the_broker_is_away_exits_by_its_deadline(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    """Faust's shutdown waits for the broker without end: SIGTERM with the broker stopped
    used to leave the worker running (and logging) until SIGKILL. It now exits 1 at
    NEARDUP_STOP_GRACE_S, saying why, and the next start loses nothing."""
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
    d.produce(values)
    w = d.worker(0)
    w.env["NEARDUP_STOP_GRACE_S"] = "5"
    w.start()
    d.wait(lambda: len(d.decided()) >= len(ref.decisions) // 4, DEADLINE, "a quarter decided")
    own_broker.run("stop", "--keep")
    try:
        assert w.proc is not None
        told = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        code = w.proc.wait(timeout=60)
        took = time.monotonic() - told
        print(f"SIGTERM with the broker away: exit {code} after {took:.1f} s")
        assert code == 1 and took < 30, (code, took)
        assert "stopping on SIGTERM: not stopped in time" in w.tail(200)
    finally:
        w.ended = True
        own_broker.run("start")
    d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the restart")
    check_against(ref, d)


@pytest.mark.parametrize("topology", ["routed", "partitioned"])
@pytest.mark.parametrize("leave", ["stop", "kill"])
def test_a_second_worker_joins_then_leaves_under_load(
    deploy: Any, tmp_path: Path, leave: str, topology: str
) -> None:
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4, topology)
    # the load: the stream arrives in 12 parts, 2.5 s apart, through the join and the leave
    parts = [values[i * len(values) // 12 : (i + 1) * len(values) // 12] for i in range(12)]
    stop = threading.Event()

    def crawl() -> None:
        for part in parts:
            d.produce(part)
            if stop.wait(2.5):
                return

    crawler = threading.Thread(target=crawl, daemon=True)
    d.worker(0).start()
    crawler.start()
    try:
        d.wait(lambda: len(d.decided()) >= 10, DEADLINE, "the first decisions")
        second = d.worker(1).start()

        def joined() -> bool:
            log = second.log.read_text(errors="replace")
            if topology == "partitioned":  # the group deals whole tasks
                return re.search(r"task \S+ open at", log) is not None
            return f"| {d.names.raw}" in log.split("Setting newly assigned partitions", 1)[-1]

        d.wait(joined, DEADLINE, "the second worker to take raw partitions")
        at = len(d.decided())
        d.wait(lambda: len(d.decided()) > at, DEADLINE, "decisions with two workers")
        assert crawler.is_alive(), "the stream was all in before the second worker left"
        second.stop() if leave == "stop" else second.kill()
        at = len(d.decided())
    finally:
        crawler.join(timeout=60)
        stop.set()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the leave")
    pages, out = check_after_fault(values, ref, d)
    print(f"join, then {leave}: {pages} pages in, {out} decisions + rejects out ({at} at leave)")


@pytest.mark.parametrize("topology", ["routed", "partitioned"])
def test_a_deleted_state_directory_is_rebuilt_from_the_changelog(
    deploy: Any, tmp_path: Path, topology: str
) -> None:
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2, topology)
    half = len(values) // 2
    d.produce(values[:half])
    first = d.worker(0).start()
    d.wait(lambda: len(d.decided()) + len(d.rejects()) >= half, DEADLINE, "the first half")
    first.stop()
    assert first.proc is not None and first.proc.returncode == 0
    shutil.rmtree(d.tmp / "worker0")
    d.produce(values[half:])  # the second half must be matched against the first
    again = d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the state was lost")
    if topology == "partitioned":
        # every task's store rebuilt from its changelog (neardup.kafka.taskstate), which
        # the second half's decisions, matched against the first, depend on
        pages, out = check_after_fault(values, ref, d)
        print(f"state deleted: {pages} pages in, {out} decisions + rejects out")
        return
    log = again.log.read_text(errors="replace").split("[^Worker]: Starting")[-1]
    assert "Restoring state from changelog topics" in log
    pages, out = check_after_fault(values, ref, d)
    print(f"state deleted: {pages} pages in, {out} decisions + rejects out")
    # the restore wrote most records in bulk (neardup.kafka.faustfix), and every table
    # holds what its changelog holds
    restored = re.search(
        r"^neardup_restored_records_total (\S+)$", again.fetch("/metrics")[1], re.M
    )
    assert restored is not None and float(restored.group(1)) > 0, again.tail()
    again.stop()
    tables_match_changelogs(d, [again])


def test_tables_last_caught_up_too_long_ago_are_restored_whole(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    """A worker stopped cleanly and started again after longer than its changelogs keep
    deletions (read from the broker: 2 hours here, set on the state changelog) does not
    catch up from its old offsets, which would miss deletions; its tables are restored
    whole, and every page comes out as ``neardup dedup`` decides it."""
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
    half = len(values) // 2
    d.produce(values[:half])
    first = d.worker(0).start()
    d.wait(lambda: len(d.decided()) + len(d.rejects()) >= half, DEADLINE, "the first half")
    dbs = sorted((d.tmp / "worker0").rglob("*.db"))
    assert dbs
    # stamped as caught up once the restore is done, then every minute
    wait_for(lambda: all((db / freshness.STAMP).exists() for db in dbs), 30, "the tables stamped")
    first.stop()
    assert first.proc is not None and first.proc.returncode == 0
    changelog = ["--entity-type", "topics", "--entity-name", f"{d.names.app_id}-state-changelog"]
    own_broker.config("--alter", *changelog, "--add-config", "delete.retention.ms=7200000")
    for db in dbs:  # 90 minutes ago: past half of 2 hours, well within half of a day
        freshness.stamp(db, time.time() - 90 * 60)
    d.produce(values[half:])  # the second half must be matched against the first
    again = d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the restore")
    log = again.log.read_text(errors="replace")
    assert "the changelogs keep deletions for 2.0 hours" in log, again.tail()
    removed = log.count("removed, and restored from the changelog whole")
    assert removed == len(dbs), again.tail()
    pages, out = check_after_fault(values, ref, d)
    print(f"tables too old: {removed} removed, {pages} pages in, {out} out")


def test_partitions_back_after_too_long_elsewhere_are_restored_whole(
    deploy: Any, tmp_path: Path
) -> None:
    """A running worker gets back table partitions another worker held for longer than
    the changelogs keep deletions (as if: their stamps aged while the first worker neither
    held nor stamped them; no standbys). It removes its old databases of them, restores
    them whole, and every page comes out as ``neardup dedup`` decides it."""
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2)
    env = {"NEARDUP_STANDBY_REPLICAS": "0"}
    third = len(values) // 3
    out = lambda: len(d.decided()) + len(d.rejects())  # noqa: E731
    d.produce(values[:third])
    first = d.worker(0, env).start()
    d.wait(lambda: out() >= third, DEADLINE, "the first third")
    second = d.worker(1, env).start()
    d.wait(lambda: second.get("/readyz") == 200, DEADLINE, "the second worker ready")
    d.produce(values[third : 2 * third])
    d.wait(lambda: out() >= 2 * third, DEADLINE, "the second third, on two workers")
    moved = sorted(db.name for db in (d.tmp / "worker1").rglob("*.db"))
    mine = {db.name: db for db in (d.tmp / "worker0").rglob("*.db")}
    aged = [mine[name] for name in moved if name in mine]
    assert aged, (moved, sorted(mine))
    for db in aged:  # the first worker holds them no more, so it does not stamp them
        freshness.stamp(db, time.time() - freshness.MAX_AGE_S - 3600)
    second.stop()
    d.produce(values[2 * third :])
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the leave")
    log = first.log.read_text(errors="replace")
    removed = sorted(
        name for name in mine if f"table {name} was last caught up" in log and name in moved
    )
    assert removed == sorted(db.name for db in aged), first.tail()
    assert first.alive()
    pages, outputs = check_after_fault(values, ref, d)
    print(f"back after too long: {len(removed)} of {len(mine)} tables restored whole, "
          f"{pages} pages in, {outputs} out")  # fmt: skip


def test_a_full_disk_stops_the_worker_clearly_and_loses_nothing(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2)
    d.produce(values)
    full = d.worker(0)
    full.log = d.tmp / "worker0-full.log"  # a fresh log: the limit applies to it too
    # RLIMIT_FSIZE: a write past 1 MiB fails as on a full disk. Over this stream the state
    # table's write-ahead log reaches ~1.7 MiB and every other file stays under 0.25 MiB,
    # so the limit is met midway, and never at start-up.
    full.fsize = 1 << 20
    full.start()
    wait_for(lambda: not full.alive(), DEADLINE, "the worker to stop on the full disk")
    assert full.proc is not None
    code = full.proc.returncode
    log = full.log.read_text(errors="replace")
    assert code not in (0, -signal.SIGXFSZ), f"exit {code}:\n{full.tail()}"
    assert "[CRITICAL] fatal: cannot write the worker's state" in log, full.tail()
    full.ended = True
    again = d.worker(0).start()  # the cause fixed: no limit
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the disk was freed")
    check_against(ref, d)
    assert "did not stop cleanly" in again.log.read_text(errors="replace")
    pages, out = accounted(values, ref, d)
    print(f"disk full (exit {code}): {pages} pages in, {out} decisions + rejects out")


def test_a_changelog_batch_the_broker_refuses_stops_the_worker_and_loses_nothing(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    """A batch of changelog records the broker will not take (here: over the topic's
    max.message.bytes; in life, a broker gone for longer than the producer waits) stops
    the worker before it commits past the steps whose state it held; the next start
    undoes the local writes the changelog lacks instead of discarding the tables, and
    every page comes out as ``neardup dedup`` decides it."""
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
    half = len(values) // 2
    d.produce(values[:half])
    w = d.worker(0).start()
    d.wait(lambda: len(d.decided()) >= half // 2, DEADLINE, "the first pages decided")
    changelog = ["--entity-type", "topics", "--entity-name", f"{d.names.app_id}-state-changelog"]
    own_broker.config("--alter", *changelog, "--add-config", "max.message.bytes=100")
    try:
        d.produce(values[half:])
        wait_for(lambda: not w.alive(), DEADLINE, "the worker to stop on the refused batch")
    finally:
        own_broker.config("--alter", *changelog, "--delete-config", "max.message.bytes")
    assert w.proc is not None
    log = w.log.read_text(errors="replace")
    assert "changelog records did not reach the broker" in log, w.tail()
    w.ended = True
    again = d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the restart")
    check_against(ref, d)
    restart = again.log.read_text(errors="replace")
    assert "were not known to be in the changelog; they were undone" in restart, again.tail()
    assert "discarding them" not in restart
    pages, out = accounted(values, ref, d)
    print(f"refused changelog batch (exit {w.proc.returncode}): {pages} in, {out} out")


def test_a_slow_downstream_applies_backpressure(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
    d.produce(values)  # before the quota, which applies to every client of this broker
    quota = 128 * 1024
    own_broker.config(
        "--alter",
        "--entity-type",
        "clients",
        "--entity-default",
        "--add-config",
        f"producer_byte_rate={quota}",
    )
    samples: list[int] = []
    stop = threading.Event()
    try:
        # a small backlog limit, so that this short run pauses reading raw pages
        w = d.worker(0, env={"NEARDUP_MAX_BACKLOG": "2"}).start()
        assert w.proc is not None
        pid = w.proc.pid

        def sample() -> None:
            while not stop.is_set():
                samples.append(tree_rss(pid))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        d.wait(lambda: all_out(ref, d), DEADLINE * 2, "every page decided, throttled")
        elapsed = time.monotonic() - t0
        # and it reads raw pages again once the sequencer has caught up
        resumed = re.compile(r"^neardup_raw_paused 0\.0$", re.M)
        d.wait(lambda: bool(resumed.search(w.fetch("/metrics")[1])), DEADLINE, "resumed")
        metrics = w.fetch("/metrics")[1]
    finally:
        stop.set()
        own_broker.config(
            "--alter",
            "--entity-type",
            "clients",
            "--entity-default",
            "--delete-config",
            "producer_byte_rate",
        )
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    third = max(1, len(samples) // 3)
    early, late = max(samples[:third]), max(samples[-third:])
    pauses = re.search(r"^neardup_raw_pauses_total (\S+)$", metrics, re.M)
    print(
        f"slow downstream ({quota // 1024} KiB/s): {pages} pages in, {out} out in "
        f"{elapsed:.0f} s; peak RSS {max(samples) / 2**20:.0f} MiB "
        f"(first third {early / 2**20:.0f}, last third {late / 2**20:.0f}); raw "
        f"partitions paused {pauses.group(1) if pauses else '?'} times"
    )
    # the quota really held the worker back: its state writes alone exceed it for a while
    assert elapsed > 10, "the quota did not slow the worker: not a slow downstream"
    # no growth with the backlog: the last third of the run holds no more than the first
    assert late < early + 128 * 2**20, "memory grew while the outputs were throttled"
    # the worker held raw pages back while the sequencer was behind, and let them in again
    assert pauses is not None and float(pauses.group(1)) >= 1, metrics


def test_a_state_store_that_cannot_be_opened_stops_the_worker_clearly(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 3))
    ref = reference(values, tmp_path)
    d = deploy(1)
    half, three_quarters = len(values) // 2, 3 * len(values) // 4
    d.produce(values[:half])
    first = d.worker(0).start()
    d.wait(lambda: len(d.decided()) + len(d.rejects()) >= half, DEADLINE, "the first half")
    first.stop()
    d.produce(values[half:three_quarters])

    # a second worker on the same state directory is refused, and touches nothing
    twin = d.worker(0).start()
    rival = d.worker(0)
    rival.log = d.tmp / "rival.log"
    wait_for(lambda: twin.get("/healthz") == 200, DEADLINE, "the first worker up")
    rival.start()
    wait_for(lambda: not rival.alive(), DEADLINE, "the second worker to give up")
    assert rival.proc is not None and rival.proc.returncode != 0
    rival.ended = True
    assert "is in use by another worker" in rival.log.read_text(errors="replace")
    assert twin.alive(), twin.tail()
    # stopped when idle, so that it keeps its local tables whole (a worker stopped in the
    # middle of a step leaves writes for the next start to undo)
    d.wait(lambda: len(d.decided()) + len(d.rejects()) >= three_quarters, DEADLINE, "3/4")
    twin.stop()
    assert "table writes not in the changelog" not in twin.log.read_text(errors="replace")
    d.produce(values[three_quarters:])

    # another process holds RocksDB's LOCK on a table: the worker stops, saying so
    lock = next((d.tmp / "worker0").rglob("state-0.db")) / "LOCK"
    with lock.open("r+") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = d.worker(0)
        locked.log = d.tmp / "locked.log"
        locked.start()
        wait_for(lambda: not locked.alive(), DEADLINE, "the worker to stop on the lock")
        locked.ended = True
    assert locked.proc is not None and locked.proc.returncode != 0
    log = locked.log.read_text(errors="replace")
    assert "fatal: a RocksDB table under" in log and "state-0.db/LOCK" in log, locked.tail()

    d.worker(0).start()  # the lock released
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the lock went")
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    print(f"store locked (exit {locked.proc.returncode}): {pages} pages in, {out} out")
