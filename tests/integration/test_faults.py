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

from tests.integration.helpers import (
    LocalBroker,
    accounted,
    all_out,
    check_after_fault,
    check_against,
    reference,
    stores_match_changelogs,
    stream,
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


def test_ten_sigkills_at_random_points(deploy: Any, tmp_path: Path) -> None:
    rng = random.Random(_seed())
    values = stream(range(1, 11))
    ref = reference(values, tmp_path)
    d = deploy(2)
    # the stream arrives in 11 parts, one before each start, so each kill finds work
    parts = [values[i * len(values) // 11 : (i + 1) * len(values) // 11] for i in range(11)]
    points = []
    for kill in range(10):
        d.produce(parts[kill])
        w = d.worker(0).start()
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
    d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after 10 kills")
    pages, out = check_after_fault(values, ref, d)
    print(f"10 SIGKILLs: {pages} pages in, {out} decisions + rejects out")


def test_broker_stopped_and_restarted_while_the_worker_runs(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
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
    """A shutdown waits for the broker (each task's last commit): SIGTERM with the broker
    stopped ends the worker with exit 1 at NEARDUP_STOP_GRACE_S, saying why, and the next
    start loses nothing."""
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


@pytest.mark.parametrize("leave", ["stop", "kill"])
def test_a_second_worker_joins_then_leaves_under_load(
    deploy: Any, tmp_path: Path, leave: str
) -> None:
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4)
    # the load: the stream arrives in 12 parts, a second apart, a third of them before the
    # join, a third after it and a third after the leave (whenever those come)
    parts = [values[i * len(values) // 12 : (i + 1) * len(values) // 12] for i in range(12)]
    phases = [threading.Event() for _ in range(3)]
    phases[0].set()

    def crawl() -> None:
        for i, part in enumerate(parts):
            phases[i // 4].wait(DEADLINE)
            d.produce(part)
            time.sleep(1.0)  # pacing the load, not waiting for anything

    crawler = threading.Thread(target=crawl, daemon=True)
    d.worker(0).start()
    crawler.start()
    try:
        d.wait(lambda: len(d.decided()) >= 10, DEADLINE, "the first decisions")
        second = d.worker(1).start()

        def joined() -> bool:  # the group deals whole tasks
            return (
                re.search(r"task \S+ open at", second.log.read_text(errors="replace")) is not None
            )

        d.wait(joined, DEADLINE, "the second worker to take tasks")
        phases[1].set()
        at = len(d.decided())
        d.wait(lambda: len(d.decided()) > at, DEADLINE, "decisions with two workers")
        second.stop() if leave == "stop" else second.kill()
        at = len(d.decided())
    finally:
        for phase in phases:
            phase.set()
        crawler.join(timeout=60)
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the leave")
    pages, out = check_after_fault(values, ref, d)
    print(f"join, then {leave}: {pages} pages in, {out} decisions + rejects out ({at} at leave)")


def test_a_deleted_state_directory_is_rebuilt_from_the_changelog(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 7))
    ref = reference(values, tmp_path)
    d = deploy(2)
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
    # every task's store rebuilt from its changelog (neardup.kafka.taskstate), which the
    # second half's decisions, matched against the first, depend on
    pages, out = check_after_fault(values, ref, d)
    print(f"state deleted: {pages} pages in, {out} decisions + rejects out")
    again.stop()
    stores_match_changelogs(d.bootstrap, [again])


def test_a_full_disk_stops_the_worker_clearly_and_loses_nothing(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2)
    d.produce(values)
    full = d.worker(0)
    full.log = d.tmp / "worker0-full.log"  # a fresh log: the limit applies to it too
    # RLIMIT_FSIZE: a write past the limit fails as on a full disk. Over this stream a part
    # task's write-ahead log outgrows it, and no file reaches it at start-up.
    full.fsize = FULL_DISK_BYTES
    full.start()
    wait_for(lambda: not full.alive(), DEADLINE, "the worker to stop on the full disk")
    assert full.proc is not None
    code = full.proc.returncode
    log = full.log.read_text(errors="replace")
    assert code not in (0, -signal.SIGXFSZ), f"exit {code}:\n{full.tail()}"
    fatal = [x for x in log.splitlines() if "CRITICAL" in x]
    assert len(fatal) == 1, full.tail()
    assert "fatal:" in fatal[0] and str(d.tmp / "worker0") in fatal[0], fatal[0]
    after = log.split(fatal[0], 1)[1]
    assert "Traceback" not in after and "ERROR" not in after, after  # said once, and done
    full.ended = True
    d.worker(0).start()  # the cause fixed: no limit
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the disk was freed")
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    print(f"disk full (exit {code}): {pages} pages in, {out} decisions + rejects out")


#: RLIMIT_FSIZE of the full-disk test's worker.
FULL_DISK_BYTES = 1 << 20


def test_a_changelog_batch_the_broker_refuses_is_retried_and_loses_nothing(
    deploy: Any, tmp_path: Path, own_broker: LocalBroker
) -> None:
    """A batch of changelog records the broker will not take (here: over the topic's
    max.message.bytes; in life, a record too large for it) aborts the task's transaction:
    nothing of it reaches a read_committed reader or the task's store. The task gets a
    new producer and tries again, saying so, until the broker takes the batch; every
    page then comes out once, as ``neardup dedup`` decides it, without a restart."""
    values = stream(range(1, 5))
    ref = reference(values, tmp_path)
    d = deploy(2, bootstrap=own_broker.bootstrap)
    half = len(values) // 2
    d.produce(values[:half])
    w = d.worker(0).start()
    d.wait(lambda: len(d.decided()) >= half // 4, DEADLINE, "the first pages decided")
    topic = f"{d.names.app_id}-part-changelog"
    changelog = ["--entity-type", "topics", "--entity-name", topic]
    own_broker.config("--alter", *changelog, "--add-config", "max.message.bytes=100")
    try:
        d.produce(values[half:])
        said = re.compile(r"task part-\d+: its producer failed")
        d.wait(lambda: bool(said.search(w.log.read_text(errors="replace"))), DEADLINE, "refused")
        refused = len(d.decided())
    finally:
        own_broker.config("--alter", *changelog, "--delete-config", "max.message.bytes")
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided once the broker took them")
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    assert w.alive(), w.tail()
    print(f"refused changelog batch: {refused} decided then, {pages} in, {out} out")


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
        w = d.worker(0).start()
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
    print(
        f"slow downstream ({quota // 1024} KiB/s): {pages} pages in, {out} out in "
        f"{elapsed:.0f} s; peak RSS {max(samples) / 2**20:.0f} MiB "
        f"(first third {early / 2**20:.0f}, last third {late / 2**20:.0f})"
    )
    # the quota really held the worker back: its internal records alone exceed it a while
    assert elapsed > 10, "the quota did not slow the worker: not a slow downstream"
    # no growth with the backlog: a task's step waits for its commit, whose outputs the
    # quota holds back, so the raw pages wait in Kafka and the last third of the run
    # holds no more than the first
    assert late < early + 128 * 2**20, "memory grew while the outputs were throttled"


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

    # a second worker on the same state directory is refused in one line, and touches
    # nothing
    twin = d.worker(0).start()
    rival = d.worker(0)
    rival.log = d.tmp / "rival.log"
    wait_for(lambda: twin.get("/healthz") == 200, DEADLINE, "the first worker up")
    rival.start()
    wait_for(lambda: not rival.alive(), DEADLINE, "the second worker to give up")
    assert rival.proc is not None and rival.proc.returncode != 0
    rival.ended = True
    said = rival.log.read_text(errors="replace").strip().splitlines()
    assert len(said) == 1 and "is in use by another worker" in said[0], said
    assert twin.alive(), twin.tail()
    d.wait(lambda: len(d.decided()) + len(d.rejects()) >= three_quarters, DEADLINE, "3/4")
    twin.stop()
    assert twin.proc is not None and twin.proc.returncode == 0, twin.tail()
    d.produce(values[three_quarters:])

    # another process holds RocksDB's LOCK on a task's store: the worker stops, saying so
    lock = d.tmp / "worker0" / "part-0" / "LOCK"
    with lock.open("r+") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = d.worker(0)
        locked.log = d.tmp / "locked.log"
        locked.start()
        wait_for(lambda: not locked.alive(), DEADLINE, "the worker to stop on the lock")
        locked.ended = True
    assert locked.proc is not None and locked.proc.returncode != 0
    log = locked.log.read_text(errors="replace")
    fatal = [x for x in log.splitlines() if "CRITICAL" in x]
    assert len(fatal) == 1, locked.tail()
    assert "fatal: a RocksDB store under" in fatal[0] and "part-0/LOCK" in fatal[0], fatal[0]

    d.worker(0).start()  # the lock released
    d.wait(lambda: all_out(ref, d), DEADLINE, "every page decided after the lock went")
    check_against(ref, d)
    pages, out = accounted(values, ref, d)
    print(f"store locked (exit {locked.proc.returncode}): {pages} pages in, {out} out")
