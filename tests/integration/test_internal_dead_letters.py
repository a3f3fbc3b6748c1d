"""Garbage on the partitioned worker's internal topics, against a real broker: each record
goes to the dead-letter topic with where it was, the worker keeps running, and every page
is still decided as ``neardup dedup`` decides it."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import (
    Deployment,
    Reference,
    all_out,
    fold,
    list_topics,
    reference,
    stable,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration


def _write(bootstrap: str, records: list[tuple[str, int, bytes | None, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for topic, partition, key, value in records:
                await producer.send_and_wait(topic, value, key=key, partition=partition)
        finally:
            await producer.stop()

    asyncio.run(run())


def _decided_as_dedup_decides(ref: Reference, d: Deployment) -> None:
    """Each page decided once, as the reference decides it, with its clusters."""
    by_page: dict[str, dict[str, Any]] = {}
    for dec in d.decisions():
        assert by_page.setdefault(dec["page_id"], dec) == dec, f"two decisions: {dec}"
    assert {stable(x) for x in by_page.values()} == {stable(x) for x in ref.decisions}
    assert fold(by_page.values(), d.merges()) == ref.clusters


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics:\n{text}"
    return float(found.group(1))


def test_garbage_on_every_internal_topic_is_dead_lettered_and_nothing_stalls(
    deploy: Any, tmp_path: Path
) -> None:
    values = stream()
    ref = reference(values, tmp_path)
    d = deploy(2)
    first = len(values) // 3
    d.produce(values[:first])
    w = d.worker(0).start()
    app = d.names.app_id
    internal = {f"{app}-hosts", f"{app}-probes", f"{app}-pages", f"{app}-order"}
    d.wait(lambda: internal <= list_topics(d.bootstrap), 120, "the internal topics made")
    d.wait(lambda: len(d.decisions()) > 0, 240, "the first pages decided")

    garbage = [
        (f"{app}-hosts", 0, b"news.example.cn", b"\x02\x01cut short"),  # a PageIn
        (f"{app}-hosts", 1, b"", b"not a message at all"),  # a mark, say
        (f"{app}-probes", 1, b"ghost-page", b"\x03\x01\xff"),  # a probe of a page
        (f"{app}-pages", 0, b"", b"\x01\x09\x00"),  # another version's message
        (f"{app}-order", 0, b"", b"\x00"),
    ]
    _write(d.bootstrap, garbage)
    d.produce(values[first:])
    d.wait(lambda: all_out(ref, d), 300, "every page decided or dead-lettered")
    d.wait(
        lambda: len(d.rejects()) >= len(ref.rejects) + len(garbage),
        120,
        "a dead letter for every garbage record",
    )
    _decided_as_dedup_decides(ref, d)
    unreadable = [r for r in d.rejects() if r["detail"].startswith("unreadable record at")]
    assert sorted(r["detail"].split(" ")[3].split("@")[0] for r in unreadable) == sorted(
        f"{topic}[{partition}]" for topic, partition, _, _ in garbage
    )
    assert {r["reason"] for r in unreadable} == {"internal"}
    others = sorted(r["reason"] for r in d.rejects() if r not in unreadable)
    assert others == sorted(r["reason"] for r in ref.rejects)
    assert w.alive()

    status, text = w.fetch("/metrics")
    assert status == 200
    # (a replayed step counts again: at least)
    assert _metric(text, 'neardup_dead_letters_total{kind="part",reason="unreadable"}') >= 4
    assert _metric(text, 'neardup_dead_letters_total{kind="order",reason="unreadable"}') >= 1
    decided = sum(
        _metric(text, f'neardup_pages_decided_total{{decision="{k}"}}')
        for k in ("unique", "duplicate", "contained", "contains")
    )
    assert decided >= len({x["page_id"] for x in ref.decisions})
    assert _metric(text, 'neardup_watermark_held{kind="part",stage="hosts"}') == 0

    # SIGUSR1: each task's watermarks in the log
    size = w.log.stat().st_size
    assert w.proc is not None
    w.proc.send_signal(signal.SIGUSR1)

    def answered() -> bool:
        with w.log.open("rb") as fh:
            fh.seek(size)
            return b"task state: order order: 0 held" in fh.read()

    wait_for(answered, 30, "the task state in the log")
