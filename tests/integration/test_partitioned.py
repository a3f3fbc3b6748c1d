"""The partitioned worker's own surface against a real broker: its endpoint answers, and
what it says it published is what a read_committed consumer reads, once each."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import (
    all_out,
    check_against,
    end_offsets,
    reference,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration


def _metric(w: Any, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics:\n{text}"
    return float(found.group(1))


def test_the_endpoint_is_ready_and_counts_what_was_published_exactly_once(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream()
    ref = reference(values, tmp_path)
    d = deploy(2)
    d.produce(values)
    w = d.worker(0).start()
    d.wait(lambda: all_out(ref, d), 240, "every page decided or dead-lettered")
    check_against(ref, d)
    wait_for(lambda: w.get("/readyz") == 200, 60, "the worker ready")
    assert w.get("/healthz") == 200
    # exactly once: each decision committed once, and a read_committed reader reads it once.
    # The worker counts a commit when it sees it end, which a reader may see first
    decisions = 'neardup_published_total{topic="decisions"}'
    rejects = 'neardup_published_total{topic="rejects"}'
    caught_up = lambda: (  # noqa: E731
        _metric(w, decisions) >= len(d.decisions()) and _metric(w, rejects) >= len(d.rejects())
    )
    wait_for(caught_up, 60, "the worker's counts")
    assert _metric(w, decisions) == len(d.decisions()) == len(d.decided())
    assert _metric(w, rejects) == len(d.rejects())
    assert _metric(w, 'neardup_tasks_open{kind="order"}') == 1


def _group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def read() -> dict[tuple[str, int], int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            got = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        return {(tp.topic, tp.partition): meta.offset for tp, meta in got.items()}

    return asyncio.run(read())


def test_a_crawler_writing_in_transactions_has_its_markers_committed_past(
    deploy: Any, tmp_path: Path
) -> None:
    """A transactional producer leaves a commit marker after each transaction, at an
    offset with no record: once a task has read its partition to the end, the offset it
    commits is past the last marker too, so the group's lag on the raw topic reaches 0."""
    values = stream(range(1, 4))
    ref = reference(values, tmp_path)
    d = deploy(2)
    d.produce(values, transaction=5)
    d.worker(0).start()
    d.wait(lambda: all_out(ref, d), 240, "every page decided or dead-lettered")
    check_against(ref, d)
    ends = end_offsets(d.bootstrap, {d.names.raw: 2})

    def drained() -> bool:
        got = _group_offsets(d.bootstrap, d.names.app_id)
        return all(got.get(tp) == end for tp, end in ends.items())

    d.wait(drained, 120, "the raw partitions committed to their ends, markers included")
