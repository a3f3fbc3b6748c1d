"""The worker against a real broker: equivalence with ``neardup dedup``, a SIGKILL and a
restart, a rebalance, dead letters and the HTTP endpoint.

Every test has topics and an app id of its own, and waits on conditions with deadlines.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from neardup.contract import validate
from tests.integration.helpers import all_out as _all_out
from tests.integration.helpers import (
    check_after_fault,
    end_offsets,
    reference,
    stream,
    tables_match_changelogs,
    wait_for,
)
from tests.integration.helpers import check_against as _check_against

pytestmark = pytest.mark.integration

#: Seconds a run may take before a test gives up (this 2-core machine decides the
#: whole stream in well under a minute).
DEADLINE = 240.0


@pytest.mark.parametrize("topology", ["routed", "sequential", "partitioned"])
@pytest.mark.parametrize(("workers", "partitions"), [(1, 1), (3, 6)])
def test_decisions_and_clusters_equal_neardup_dedup(
    deploy: Any, tmp_path: Path, workers: int, partitions: int, topology: str
) -> None:
    values = stream()
    ref = reference(values, tmp_path)
    d = deploy(partitions, topology)
    d.produce(values)
    for i in range(workers):
        d.worker(i).start()
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided or dead-lettered")
    _check_against(ref, d)


@pytest.mark.parametrize("topology", ["routed", "sequential", "partitioned"])
def test_sigkill_mid_stream_then_restart_loses_nothing_and_decides_nothing_twice(
    deploy: Any, tmp_path: Path, topology: str
) -> None:
    values = stream(range(1, 11))
    ref = reference(values, tmp_path)
    d = deploy(2, topology)
    # the second half comes after the kill: a worker fast enough to decide the whole
    # stream between two looks at the decisions would otherwise be killed too late (the
    # stream is in decision order, so no page of the second half comes late)
    half = len(values) // 2
    d.produce(values[:half])
    first = d.worker(0).start()
    d.wait(lambda: len(d.decided()) >= len(ref.decisions) // 4, DEADLINE, "a quarter decided")
    first.kill()
    before = len(d.decided())
    assert before < len({x["page_id"] for x in ref.decisions}), "killed too late"
    d.produce(values[half:])
    again = d.worker(0).start()  # the same state directory, left behind by a killed worker
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided after the restart")
    check_after_fault(values, ref, d)
    log = again.log.read_text(errors="replace")
    if topology == "partitioned":
        # no repair to make: each task resumes from its last committed transaction
        assert re.search(r"task \S+ open at \{.*: [1-9]", log), "no task resumed mid-stream"
    else:
        assert "did not stop cleanly" in log


def test_a_second_worker_joining_takes_partitions_and_changes_no_decision(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4)
    d.produce(values)
    first = d.worker(0)
    first.env["NEARDUP_STANDBY_REPLICAS"] = "1"  # the state moves to a worker with a replica
    first.start()
    d.wait(lambda: len(d.decided()) >= 10, DEADLINE, "the first decisions")
    second = d.worker(1)
    second.env["NEARDUP_STANDBY_REPLICAS"] = "1"
    second.start()
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided")
    _check_against(ref, d)
    wait_for(lambda: second.get("/readyz") == 200, 60, "the second worker ready")
    assert "neardup_pages_total" in _metrics(second)
    # the rebalance gave it some of the raw partitions
    log = second.log.read_text(errors="replace")
    assigned = log.split("Setting newly assigned partitions")[-1]
    assert f"| {d.names.raw}" in assigned

    # each raw partition's lag is reported by the worker that holds it, and only by it: a
    # partition the first worker gave up leaves its gauge (summed over pods, it counted twice)
    def lag_partitions(w: Any) -> set[str]:
        return set(re.findall(r'^neardup_consumer_lag\{partition="(\d+)"\}', _metrics(w), re.M))

    def split() -> bool:
        mine, theirs = lag_partitions(first), lag_partitions(second)
        return bool(mine and theirs) and not mine & theirs and mine | theirs == {"0", "1", "2", "3"}

    d.wait(split, DEADLINE, "the raw partitions' lag reported once each, by their holders")
    # and the worker that runs the sequencer holds fewer of them (neardup.kafka.assign): with
    # the default weight, 4 raw partitions and 2 workers, 1 and 3
    assert sorted(len(lag_partitions(w)) for w in (first, second)) == [1, 3]
    logs = "".join(w.log.read_text(errors="replace") for w in (first, second))
    assert "raw partitions moved off the sequencer's worker" in logs


def test_a_second_partitioned_worker_joining_takes_tasks_and_changes_no_decision(
    deploy: Any, tmp_path: Path
) -> None:
    """The partitioned worker has no standbys and no sequencer: the group deals whole tasks
    (``neardup.kafka.assignor``), and the joining worker opens its share from their
    changelogs and the committed offsets."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4, "partitioned")
    d.produce(values)
    first = d.worker(0).start()
    d.wait(lambda: len(d.decided()) >= 10, DEADLINE, "the first decisions")
    second = d.worker(1).start()
    opened = re.compile(r"task (\S+) open at")

    def took() -> set[str]:
        return set(opened.findall(second.log.read_text(errors="replace")))

    d.wait(lambda: bool(took()), DEADLINE, "the second worker to open tasks")
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided")
    _check_against(ref, d)
    # a share of the 9 tasks (4 analyse, 4 part, the order task), the first worker the rest
    assert 0 < len(took()) < 9, took()
    for w in (first, second):
        wait_for(lambda w=w: w.get("/readyz") == 200, 60, "both workers ready")


def test_standby_replicas_hold_exactly_what_the_changelogs_hold(
    deploy: Any, tmp_path: Path
) -> None:
    """Two workers, each with a standby replica of the other's table partitions, written in
    bulk from the changelog records it fetches (``neardup.kafka.faustfix.bulk_standbys``):
    the same decisions as ``neardup dedup``, and, once stopped, every table partition
    database either keeps, active or standby, equal to its changelog."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4)
    workers = [d.worker(i, {"NEARDUP_STANDBY_REPLICAS": "1"}).start() for i in range(2)]
    for w in workers:
        wait_for(lambda w=w: w.get("/readyz") == 200, 120, "both workers ready")
    d.produce(values)
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided")
    _check_against(ref, d)
    for w in workers:
        assert _counter(w, "neardup_standby_records_total") > 0, w.tail()
    # the index tables are written to the end once every page is decided (the state table
    # is not: the sequencer stores each raw partition's progress at every drain mark)
    changelogs = {f"{d.names.app_id}-{t}-changelog": n for t, n in TABLES.items() if t != "state"}
    ends = end_offsets(d.bootstrap, changelogs)
    d.wait(lambda: _settled(d, changelogs, ends), 60, "the index changelogs written to the end")
    for w in workers:
        w.stop()
    offsets = _check_tables_against_changelogs(d, workers)
    # and both copies of each index partition, standby and active, caught up with it
    behind = {
        db: (at, ends[key])
        for db, (key, at) in offsets.items()
        if key in ends and at != ends[key] - 1
    }
    assert not behind, f"databases behind their changelogs' ends: {behind}"


#: The worker's tables and their partitions (``deploy(4)``).
TABLES = {"state": 1, "buckets": 4, "sketches": 4}


def _settled(d: Any, changelogs: dict[str, int], ends: dict[tuple[str, int], int]) -> bool:
    """The changelogs' ends unchanged for 2 s (``ends`` updated in place)."""
    time.sleep(2)
    now = end_offsets(d.bootstrap, changelogs)
    same = now == ends
    ends.update(now)
    return same


def _counter(w: Any, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", _metrics(w), re.M)
    return float(found.group(1)) if found else 0.0


def _check_tables_against_changelogs(
    d: Any, workers: list[Any]
) -> dict[Path, tuple[tuple[str, int], int]]:
    """``tables_match_changelogs``, and both workers keep one of each table partition (one
    of them a standby replica). Returns each database's changelog partition and offset."""
    offsets = tables_match_changelogs(d, workers)
    held = Counter((topic.split("-")[-2], p) for (topic, p), _ in offsets.values())
    assert held.keys() == {(t, p) for t, n in TABLES.items() for p in range(n)}, held
    assert set(held.values()) == {2}, held
    return offsets


def _metrics(w: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/metrics", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.parametrize("topology", ["routed", "partitioned"])
def test_bad_messages_go_to_the_dead_letter_topic_and_the_endpoint_answers(
    deploy: Any, topology: str
) -> None:
    pdf = json.dumps(
        {
            "url": "https://files.example.cn/report.pdf",
            "fetched_at": "2026-03-01T08:30:00Z",
            "content_type": "application/pdf",
            "body_b64": "JVBERi0xLjQKJcfsj6IKNSAwIG9iago8PC9MZW5ndGggNiAwIFI+PgpzdHJlYW0K",
        }
    ).encode()
    bad_b64 = json.dumps(
        {
            "url": "https://bad.example.cn/b64",
            "fetched_at": "2026-03-01T08:31:00Z",
            "content_type": "text/html; charset=gbk",
            "body_b64": "this is not base64!",
        }
    ).encode()
    d = deploy(2, topology)
    d.produce([b'{"url": "https://broken.example.cn/x", "fetched_at": ', bad_b64, pdf])
    w = d.worker(0).start()
    d.wait(lambda: len(d.rejects()) >= 3, DEADLINE, "three dead letters")
    by_reason = {r["reason"]: r for r in d.rejects()}
    assert set(by_reason) == {"bad_json", "bad_base64", "not_html"}
    assert by_reason["bad_json"]["url"] == "https://broken.example.cn/x"
    assert by_reason["not_html"]["page_id"]
    for r in d.rejects():
        assert validate("rejected", r) == []
    assert not d.decisions()
    if topology != "partitioned":  # the Faust worker's log lines
        log = w.log.read_text(errors="replace")
        assert f"topic={d.names.raw} partition=" in log and "offset=" in log
        assert "event loop: uvloop.Loop" in log  # NEARDUP_EVENT_LOOP's default

    wait_for(lambda: w.get("/readyz") == 200, 60, "the worker ready")
    assert w.get("/healthz") == 200
    assert w.get("/nothing-here") == 404
    req = urllib.request.Request(f"http://127.0.0.1:{w.port}/healthz", method="POST")
    try:
        urllib.request.urlopen(req, timeout=5)
        status = 200
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == 405
    metrics = _metrics(w)
    if topology == "partitioned":
        # what it committed to the outputs (neardup.kafka.endpoint); it keeps no counts by
        # reason, stage latencies or RocksDB gauges
        assert 'neardup_published_total{topic="rejects"} 3.0' in metrics, metrics
        assert 'neardup_published_total{topic="decisions"} 0.0' in metrics, metrics
        return
    assert 'neardup_rejects_total{reason="bad_json"} 1.0' in metrics
    assert "neardup_stage_latency_seconds_bucket" in metrics
    # the tables' RocksDB databases share one cache of NEARDUP_ROCKSDB_MEMORY_MB (256)
    gauges = dict(
        line.split(" ", 1) for line in metrics.splitlines() if line.startswith("neardup_rocksdb_")
    )
    assert float(gauges["neardup_rocksdb_memory_limit_bytes"]) == 256 << 20
    assert 0 < float(gauges["neardup_rocksdb_memory_bytes"]) <= 256 << 20


def test_a_crawler_writing_in_transactions_has_every_page_decided_and_its_markers_passed(
    deploy: Any, tmp_path: Path
) -> None:
    """A transactional producer leaves a commit marker after each transaction, at an
    offset with no message. The worker asks the broker which offsets those are
    (``neardup.kafka.absent``) and commits past them, the last one included: the raw
    partitions drain (lag 0), and every page is decided as ``neardup dedup`` decides it."""
    values = stream(range(1, 4))
    ref = reference(values, tmp_path)
    d = deploy(2)
    d.produce(values, transaction=5)
    w = d.worker(0).start()
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided or dead-lettered")
    _check_against(ref, d)

    def drained() -> bool:
        text = w.fetch("/metrics")[1]
        lags = re.findall(r'^neardup_consumer_lag\{partition="\d+"\} (\S+)$', text, re.M)
        absent = re.search(r"^neardup_absent_offset_runs_total (\S+)$", text, re.M)
        return len(lags) == 2 and all(float(x) == 0 for x in lags) and absent is not None

    d.wait(drained, DEADLINE, "both raw partitions drained, their last markers passed")
    text = w.fetch("/metrics")[1]
    runs = re.search(r"^neardup_absent_offset_runs_total (\S+)$", text, re.M)
    assert runs is not None and float(runs.group(1)) >= 2  # at least one a partition
