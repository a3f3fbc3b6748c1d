"""The partitioned worker's ``/metrics``: per kind of task and stage, read from the tasks'
step objects and the worker's tally; and the task state ``SIGUSR1`` logs."""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from neardup.analysis import Analysed
from neardup.config import EngineConfig
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.endpoint import Endpoint
from neardup.kafka.tasks import Context, CountedOrderStep, PartStep
from neardup.kafka.taskview import log_tasks
from neardup.kafka.topology import Topics
from neardup.store import MemoryKV
from tests.corpus import analysed_page

CFG = EngineConfig(extract_timeout_s=0)
TOPICS = Topics("raw", "decisions", "merges", "rejects", "app-hosts", "app-probes",
                "app-pages", "app-order", "a-cl", "p-cl", "o-cl")  # fmt: skip
MINUTE = 60_000


class Store(MemoryKV):
    def estimated_keys(self) -> int:
        return len(self.data)


def _page(story: str, minute: int) -> Analysed:
    a: Analysed = analysed_page(story, minute, CFG)
    return a


def _runner(name: str, group: str, step: Any, store: Store) -> Any:
    return SimpleNamespace(step=step, task=SimpleNamespace(group=group, name=name),
                           kv=SimpleNamespace(store=store))  # fmt: skip


@pytest.fixture
def worker() -> Any:
    """A worker with a part task that holds two pages (one analyse task of two has
    marked), a page already decided, and an order task; a few dead letters."""
    ctx = Context(CFG, TOPICS, 1, 2, order_wait=math.inf, mark_interval=1.0, clock=lambda: 100.0)
    part, order = PartStep(0, ctx), CountedOrderStep(ctx)
    part_kv, order_kv = Store(), Store()
    rail, library, museum = _page("rail", 1), _page("library", 2), _page("museum", 12)

    def rec(topic: str, msg: Any, offset: int) -> Record:
        return Record(topic, 0, offset, b"k", codec.encode(msg), 90_000)

    records = [rec("app-hosts", m.PageIn((a.order, a.page.page_id), a), i)
               for i, a in enumerate((rail, library, museum))]  # fmt: skip
    records += [
        rec("app-hosts", m.Mark(0, (museum.order + 1, ""), None), 3),
        rec("app-hosts", m.Mark(1, (rail.order + 1, ""), None), 4),
        Record("app-pages", 0, 5, b"x", b"\x00garbage", 90_000),
    ]
    sink = Sink()
    part.on_records(records, part_kv, sink)
    for _ in range(3):  # rail goes on to be decided: what the task sends itself, read back
        part.on_tick(101.0, part_kv, sink, True)
        sent, sink = sink, Sink()
        for (topic, _), kvs in sent.pending.items():
            if topic in ("app-probes", "app-pages"):
                part.on_records([Record(topic, 0, 10, k, v, 95_000) for k, v in kvs], part_kv,
                                sink)  # fmt: skip
    order.on_records([Record("app-order", 0, 0, b"", b"\x09\x01", 90_000)], order_kv, Sink())
    ctx.tally.dead[("analyse", "no_text")] += 2
    rt = SimpleNamespace(
        tasks={"part-0": _runner("part-0", "part", part, part_kv),
               "order": _runner("order", "order", order, order_kv)},
        waiting={}, paused={"part-1": 3.0}, records=7, published=Counter(),
        commit_seconds=deque(),
    )  # fmt: skip
    return rt, ctx, (rail, library, museum)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_count_each_stage_its_waiting_items_and_dead_letters(worker: Any) -> None:
    rt, ctx, (rail, _, museum) = worker
    text = Endpoint(rt, TOPICS, ctx.tally).render().decode()
    got = _samples(text)
    assert all(name.startswith("neardup_") for name, _ in got)

    def one(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert one("neardup_stage_records_total", kind="part") > 6
    assert one("neardup_stage_records_total", kind="order") == 1
    # library and museum wait for the second analyse task's mark
    assert one("neardup_watermark_held", kind="part", stage="hosts") == 2
    assert one("neardup_watermark_lag_seconds", kind="part", stage="hosts") == pytest.approx(
        (museum.order - rail.order - 1) / 1000
    )
    assert one("neardup_watermark_held", kind="part", stage="decide") == 0
    assert one("neardup_watermark_held", kind="order", stage="order") == 0
    assert one("neardup_pages_decided_total", decision="unique") == 1
    assert one("neardup_pages_decided_total", decision="duplicate") == 0
    assert one("neardup_dead_letters_total", kind="part", reason="unreadable") == 1
    assert one("neardup_dead_letters_total", kind="order", reason="unreadable") == 1
    assert one("neardup_dead_letters_total", kind="analyse", reason="no_text") == 2
    assert one("neardup_decide_pending") == 0
    assert one("neardup_store_keys", kind="part") == len(rt.tasks["part-0"].kv.store.data)
    assert one("neardup_retention_expired_total", stage="buckets") == 0


def test_sigusr1_logs_what_each_watermark_holds_and_what_holds_it(
    worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rt, _, (_, library, museum) = worker
    with caplog.at_level(logging.INFO, logger="neardup.kafka"):
        log_tasks(rt)
    lines = [r.getMessage() for r in caplog.records]
    assert "paused after a failure: ['part-1']" in lines[0]
    (hosts,) = [x for x in lines if x.startswith("task state: part-0 hosts")]
    assert "2 held" in hosts and f"oldest ({library.order}, '{library.page.page_id}')" in hosts
    assert f"newest ({museum.order}," in hosts and "held back by [1]" in hosts
    assert len([x for x in lines if x.startswith("task state:")]) == 4


def test_a_page_that_comes_after_a_later_key_went_on_is_counted_late(
    worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """rail went on; a page fetched before it that comes now is taken at once, counted in
    ``neardup_late_items_total`` and in the SIGUSR1 line of its watermark."""
    rt, ctx, _ = worker
    early = _page("harvest", 0)
    value = codec.encode(m.PageIn((early.order, early.page.page_id), early))
    part = rt.tasks["part-0"]
    before = _samples(Endpoint(rt, TOPICS, ctx.tally).render().decode())
    assert before[("neardup_late_items_total", (("stage", "hosts"),))] == 0
    part.step.on_records([Record("app-hosts", 0, 20, b"k", value, 99_000)], part.kv.store, Sink())
    got = _samples(Endpoint(rt, TOPICS, ctx.tally).render().decode())
    assert got[("neardup_late_items_total", (("stage", "hosts"),))] == 1
    for stage in ("buckets", "decide", "order"):
        assert got[("neardup_late_items_total", (("stage", stage),))] == 0
    with caplog.at_level(logging.INFO, logger="neardup.kafka"):
        log_tasks(rt)
    (hosts,) = [r.getMessage() for r in caplog.records if "part-0 hosts" in r.getMessage()]
    assert hosts.endswith("; 1 late")
