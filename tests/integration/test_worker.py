"""The worker against a real broker: equivalence with ``neardup dedup``, a SIGKILL and a
restart, a rebalance, dead letters and the HTTP endpoint.

Every test has topics and an app id of its own, and waits on conditions with deadlines.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from neardup.contract import validate
from tests.integration.helpers import all_out as _all_out
from tests.integration.helpers import (
    check_after_fault,
    end_offsets,
    reference,
    stores_match_changelogs,
    stream,
    wait_for,
)
from tests.integration.helpers import check_against as _check_against

pytestmark = pytest.mark.integration

#: Seconds a run may take before a test gives up (this 2-core machine decides the
#: whole stream in well under a minute).
DEADLINE = 240.0


@pytest.mark.parametrize(("workers", "partitions"), [(1, 1), (3, 6), (4, 8)])
def test_decisions_and_clusters_equal_neardup_dedup(
    deploy: Any, tmp_path: Path, workers: int, partitions: int
) -> None:
    values = stream()
    ref = reference(values, tmp_path)
    d = deploy(partitions)
    d.produce(values)
    started = [d.worker(i).start() for i in range(workers)]
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided or dead-lettered")
    _check_against(ref, d)
    # every worker is dealt a share of the tasks (N analyse, N part, the order task)
    opened = re.compile(r"task (\S+) open at")

    def shares() -> list[set[str]]:
        return [set(opened.findall(w.log.read_text(errors="replace"))) for w in started]

    d.wait(lambda: all(shares()), 60, "every worker to open tasks")
    everything = {"order", *(f"{k}-{i}" for k in ("analyse", "part") for i in range(partitions))}
    assert set().union(*shares()) == everything


def test_sigkill_mid_stream_then_restart_loses_nothing_and_decides_nothing_twice(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream(range(1, 11))
    ref = reference(values, tmp_path)
    d = deploy(2)
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
    # no repair to make: each task resumes from its last committed transaction
    assert re.search(r"task \S+ open at \{.*: [1-9]", log), "no task resumed mid-stream"


def test_a_second_worker_joining_takes_tasks_and_changes_no_decision(
    deploy: Any, tmp_path: Path
) -> None:
    """The group deals whole tasks (``neardup.kafka.assignor``), and the joining worker
    opens its share from their changelogs and the committed offsets."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4)
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


def test_task_stores_hold_exactly_what_their_changelogs_hold(deploy: Any, tmp_path: Path) -> None:
    """Two workers share the tasks; once both are stopped, every task store either keeps
    holds exactly the committed records of its changelog partition below the offset stored
    in it (``neardup.kafka.taskstate``: a store is never ahead of its changelog, and
    aborted records never reach it), and each changelog partition has a store caught up
    with its end."""
    values = stream(range(1, 9))
    ref = reference(values, tmp_path)
    d = deploy(4)
    workers = [d.worker(i).start() for i in range(2)]
    for w in workers:
        wait_for(lambda w=w: w.get("/readyz") == 200, 120, "both workers ready")
    d.produce(values)
    d.wait(lambda: _all_out(ref, d), DEADLINE, "every page decided")
    _check_against(ref, d)
    for w in workers:
        w.stop()
        assert w.proc is not None and w.proc.returncode == 0, w.tail()
    offsets = stores_match_changelogs(d.bootstrap, workers)
    app = d.names.app_id
    changelogs = {f"{app}-analyse-changelog": 4, f"{app}-part-changelog": 4}
    changelogs[f"{app}-order-changelog"] = 1
    ends = end_offsets(d.bootstrap, changelogs)
    reached: dict[tuple[str, int], int] = {}
    for key, at in offsets.values():
        reached[key] = max(at, reached.get(key, 0))
    # the end is past the last transaction's commit marker, which holds no record
    behind = {key: (reached.get(key), end) for key, end in ends.items() if end > 0}
    behind = {k: v for k, v in behind.items() if v[0] is None or v[0] < v[1] - 1}
    assert not behind, f"changelog partitions no store caught up with: {behind}"
    assert all(end > 0 for (topic, _), end in ends.items() if "part" in topic), ends


def _metrics(w: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_bad_messages_go_to_the_dead_letter_topic_and_the_endpoint_answers(deploy: Any) -> None:
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
    d = deploy(2)
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
    # what it committed to the outputs (neardup.kafka.endpoint)
    assert 'neardup_published_total{topic="rejects"} 3.0' in metrics, metrics
    assert 'neardup_published_total{topic="decisions"} 0.0' in metrics, metrics
