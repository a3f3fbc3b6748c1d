"""Static group membership (NEARDUP_GROUP_INSTANCE_ID) on a real broker: a worker SIGKILLed
and started again with its id gets its tasks back without a rebalance of the other
worker, and two live workers on one id do not take it from each other forever: the one
replaced stops, in one line."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import (
    Deployment,
    WorkerProcess,
    all_out,
    check_against,
    reference,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration

#: Long enough that a worker started again comes back within it, whatever the load.
SESSION_MS = 60_000
KINDS = ("analyse", "part", "order")


def _tasks(w: WorkerProcess) -> dict[str, int]:
    """The tasks the worker runs, by kind (``neardup_tasks_open``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for kind in KINDS:
        found = re.search(rf'^neardup_tasks_open{{kind="{kind}"}} (\S+)$', text, re.M)
        out[kind] = int(float(found.group(1))) if found else 0
    return out


def _opened(w: WorkerProcess, since: int) -> list[str]:
    """The tasks the worker opened (its "task X open at" lines) after byte ``since`` of
    its log: each rebalance closes and opens again every task of a worker it touches."""
    with w.log.open("rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    return re.findall(r"neardup\.kafka: task (\S+) open at", text)


def _settled(d: Deployment, workers: list[WorkerProcess]) -> bool:
    """Every worker ready, each with a share of the tasks, all tasks open."""
    if any(w.get("/readyz") != 200 for w in workers):
        return False
    counts = [_tasks(w) for w in workers]
    total = sum(sum(c.values()) for c in counts)
    return all(sum(c.values()) for c in counts) and total == 2 * d.partitions + 1


def _static(iid: str) -> dict[str, str]:
    return {"NEARDUP_GROUP_INSTANCE_ID": iid, "NEARDUP_SESSION_TIMEOUT_MS": str(SESSION_MS)}


def test_a_worker_killed_and_started_again_with_its_id_gets_its_tasks_back_alone(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream()
    ref = reference(values, tmp_path)
    half = len(values) // 2
    d = deploy(2)
    d.produce(values[:half])
    # the worker killed joins first, so it leads the group: the coordinator must give a
    # leader that comes back its place without asking it to deal the tasks again
    killed = d.worker(1, _static("w1")).start()
    d.wait(lambda: killed.get("/readyz") == 200, 180, "the first worker ready")
    survivor = d.worker(0, _static("w0")).start()
    d.wait(lambda: _settled(d, [survivor, killed]), 180, "both workers running their tasks")
    d.wait(lambda: len(d.decided()) > half // 4, 180, "some pages decided")
    held = _tasks(killed)
    kept = _tasks(survivor)
    mark = survivor.log.stat().st_size

    killed.kill()
    t0 = time.monotonic()
    back = d.worker(1, _static("w1")).start()
    d.wait(lambda: back.get("/readyz") == 200, SESSION_MS / 1000, "the worker back and ready")
    print(f"static member: SIGKILL to ready again {time.monotonic() - t0:.1f} s")
    # the group gave it what it had, and the other worker was not rebalanced
    assert _tasks(back) == held
    assert _tasks(survivor) == kept
    assert _opened(survivor, mark) == []

    d.produce(values[half:])
    d.wait(lambda: all_out(ref, d), 240, "every page decided or dead-lettered")
    check_against(ref, d)
    assert _opened(survivor, mark) == [], "the other worker was rebalanced after all"
    assert survivor.alive() and back.alive()


def test_a_second_worker_on_the_same_id_stops_one_of_them_in_one_line(
    deploy: Any, tmp_path: Path
) -> None:
    """The newer process takes the id at its join; the one it replaced stops, status 1,
    rather than take the id back (which aiokafka's rejoin would, every heartbeat)."""
    values = stream()
    ref = reference(values, tmp_path)
    half = len(values) // 2
    d = deploy(2)
    d.produce(values[:half])
    first = d.worker(0, _static("dup")).start()
    d.wait(lambda: first.get("/readyz") == 200, 180, "the first worker ready")
    second = d.worker(1, _static("dup"))
    second.start()
    wait_for(lambda: not first.alive() or not second.alive(), 120, "one of the two stopped")
    stopped, running = (first, second) if not first.alive() else (second, first)
    stopped.ended = True  # stopped on purpose: d.wait must not fail on it
    assert stopped.proc is not None and stopped.proc.returncode == 1
    log = stopped.log.read_text(errors="replace")
    said = [line for line in log.splitlines() if "CRITICAL" in line]
    assert len(said) == 1, log[-3000:]
    assert "NEARDUP_GROUP_INSTANCE_ID=dup" in said[0] and "an id of its own" in said[0]
    # nothing else said of the stop: no traceback of it, no consumer left unclosed
    tail = log[log.index(said[0]) :]
    assert "InstanceFencedError" not in tail.replace(said[0], "") and "Unclosed" not in tail

    # the other keeps the id, runs every task, and decides every page as neardup dedup
    d.produce(values[half:])
    d.wait(lambda: all_out(ref, d), 240, "every page decided or dead-lettered")
    check_against(ref, d)
    assert running.alive() and sum(_tasks(running).values()) == 2 * d.partitions + 1
