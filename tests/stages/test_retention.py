"""Retention in the partitioned stages: over a stream of many times ``retention_days``,
the simulated topology decides as ``neardup dedup`` does, and no task's store keeps
growing (buckets, page records, order nodes, template counts)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from neardup.analysis import Analysed, analyse, page_pid
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import Engine
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.flow.buckets import BucketsTask, last_day
from neardup.flow.codec import decode
from neardup.flow.decide import DecideTask
from neardup.flow.expiry import DAY_MS, ORDER_SOURCE, DayList
from neardup.flow.messages import (
    PageRecord,
    SketchAsk,
    SketchReply,
    partition_of_pid,
)
from neardup.flow.pending import Stored
from neardup.flow.simulate import RAW, Topology, decisions, merges
from neardup.records import Rejected
from neardup.store import MemoryKV
from tests.corpus import line, raw_page
from tests.fuzz.inputs import article
from tests.stages.test_buckets import entry, probe

CFG = EngineConfig(extract_timeout_s=0, retention_days=2, template_idle_days=2)
MINUTE = 60_000
DAYS = 24


def _analysed(url: str, paras: list[str], title: str, order: int) -> Analysed:
    page = parse_raw(line(raw_page(url, paras, title)), CFG.max_bytes)
    assert not isinstance(page, Rejected), page
    a = analyse(page, CFG)
    assert isinstance(a, Analysed), a
    return replace(a, order=order)


def _copy(a: Analysed, host: str, day: int, slot: int) -> Analysed:
    """``a`` published again under a new id on ``host``, fetched on ``day``."""
    page_id = f"{a.page.page_id}-{host}-{day}"
    page = replace(a.page, page_id=page_id, url=f"https://{host}/{page_id}.html")
    return replace(a, page=page, pid=page_pid(page_id), host=host, order=day * DAY_MS + slot)


def long_stream(rng: random.Random, days: int) -> list[list[Analysed]]:
    """``days`` days of pages, by day: new stories on hosts of the day, copies of stories of each of the last five days (matched within
    ``retention_days``, new again after), an excerpt of yesterday's, and now and then a
    page id of yesterday fetched again.

    Every host lives a day: a host's template counts and the page ids it has seen are
    bounded by ``template_window`` pages and dropped after ``template_idle_days`` idle
    (``neardup.template``: the engine's rule, not retention's), so a host that lasts
    would show that bound instead (its pages alike day after day would also become its
    template)."""
    by_day: list[list[Analysed]] = []
    stories: list[list[tuple[list[str], Analysed]]] = []
    for day in range(1, days + 1):
        today: list[Analysed] = []
        fresh = []
        for k in range(4):
            paras = article(rng, 4)
            url = f"https://d{day}-{k}.news.example/{day}-{k}.html"
            a = _analysed(url, paras, f"第{day}天{k}", day * DAY_MS + k * MINUTE)
            fresh.append((paras, a))
            today.append(a)
        for back, earlier in enumerate(reversed(stories[-5:]), 1):
            _, a = rng.choice(earlier)
            today.append(_copy(a, f"d{day}.mirror{back}.example", day, (10 + back) * MINUTE))
        if stories:
            paras, a = rng.choice(stories[-1])
            url = f"https://d{day}.digest.example/{a.page.page_id}.html"
            excerpt = _analysed(url, paras[:2], "摘要", day * DAY_MS + 20 * MINUTE)
            today.append(excerpt)
        if by_day and rng.random() < 0.5:
            a = rng.choice(by_day[-1])
            today.append(replace(a, order=day * DAY_MS + 30 * MINUTE))
        stories.append(fresh)
        by_day.append(today)
    return by_day


def _stable(d: dict[str, Any], drop: str) -> str:
    return json.dumps({k: v for k, v in d.items() if k != drop}, sort_keys=True)


def _keys(sim: Topology) -> dict[str, int]:
    """Keys in the committed stores, by kind of task."""
    out: dict[str, int] = {}
    for u in sim.units:
        kind = u.name.split()[0]
        out[kind] = out.get(kind, 0) + len(u.store.data)
    return out


def _engine(pages: list[Analysed]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    eng = Engine(MemoryKV(), CFG)
    want, want_merges = [], []
    for a in sorted(pages, key=lambda a: (a.order, a.page.page_id)):
        outcome = eng.decide_analysed(a)
        eng.kv.commit()
        want.append(outcome.decision)
        want_merges += [m.to_json() for m in outcome.merges]
    return want, want_merges


def fed_by_quarters(
    by_day: list[list[Analysed]], cfg: EngineConfig, partitions: int, rng: random.Random
) -> tuple[Topology, list[dict[str, int]]]:
    """The topology fed a quarter of the days at a time, each decided before the next
    comes; the store keys by kind of task after each quarter."""
    pages = [a for day in by_day for a in day]
    sim = Topology(pages, [[] for _ in range(partitions)], cfg, rng, crash=0.05)
    counts, at, quarter = [], 0, len(by_day) // 4
    for q in range(4):
        for day in by_day[q * quarter : (q + 1) * quarter]:
            for _ in day:
                sim.logs[(RAW, rng.randrange(partitions))].append((0.0, str(at).encode()))
                at += 1
        sim.run(lambda out, n=at: len(decisions(out)) >= n)
        counts.append(_keys(sim))
    return sim, counts


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_stream_of_many_retention_periods_decides_alike_with_bounded_stores(
    partitions: int,
) -> None:
    rng = random.Random(partitions)
    by_day = long_stream(rng, DAYS)
    pages = [a for day in by_day for a in day]
    sim, counts = fed_by_quarters(by_day, CFG, partitions, rng)

    want, want_merges = _engine(pages)
    got = [json.loads(v) for v in decisions(sim.published)]
    assert sorted(_stable(d, "decided_at") for d in got) == sorted(
        _stable(d, "decided_at") for d in want
    )
    assert sorted(_stable(json.loads(m), "at") for m in merges(sim.published)) == sorted(
        _stable(m, "at") for m in want_merges
    )
    kinds = {d["decision"] for d in got}
    assert {"unique", "duplicate", "contained"} <= kinds
    # a copy of a story of five days ago is new again: retention let it go
    assert any(d["decision"] == "unique" and ".mirror5." in d["url"] for d in got)
    assert sim.late() == 0

    # the stream goes on three times as long after its first quarter; the stores do not
    # grow with it (``test_without_retention_the_stores_grow`` shows they would)
    print("store keys by kind of task, after each quarter of the stream:", counts)
    first, *_, last = counts
    for kind in ("hosts", "buckets", "decide", "order"):
        assert last[kind] <= 1.3 * first[kind], (kind, counts)


def test_without_retention_the_stores_grow() -> None:
    """The same stream with ``retention_days`` 0: what the test above bounds grows."""
    rng = random.Random(1)
    _, counts = fed_by_quarters(long_stream(rng, DAYS), replace(CFG, retention_days=0), 1, rng)
    print("store keys by kind of task, after each quarter, no retention:", counts)
    first, *_, last = counts
    for kind in ("buckets", "decide", "order"):
        assert last[kind] >= 2.5 * first[kind], (kind, counts)


def test_a_bucket_of_expired_entries_goes_and_a_live_one_stays() -> None:
    kv = MemoryKV()
    task = BucketsTask(kv, CFG, 0, 1)
    old, live = (b"P\x00old",), (b"P\x00live",)
    for p in (probe(1 * DAY_MS, "a", 1, old), probe(1 * DAY_MS + 5, "b", 2, live)):
        task.step(codec.encode(p))
    task.step(codec.encode(m.Mark(0, (1 * DAY_MS + 6, ""), None)))
    assert None not in kv.get_many([old[0], live[0]])
    task.step(codec.encode(m.Mark(0, (2 * DAY_MS, ""), None)))
    task.step(codec.encode(probe(3 * DAY_MS + 10, "c", 3, live)))
    task.step(codec.encode(m.Mark(0, (4 * DAY_MS, ""), None)))
    assert task.sweep() == 0  # day 1 is not wholly 2 days behind the last page (day 3)
    task.step(codec.encode(probe(4 * DAY_MS, "d", 4, (b"P\x00new",))))
    task.step(codec.encode(m.Mark(0, (5 * DAY_MS, ""), None)))
    assert task.sweep() == 1 and kv.get_many(old) == [None]
    assert kv.get_many(live) != [None]  # an entry of day 3 in it: kept whole
    task.step(codec.encode(probe(6 * DAY_MS, "e", 5, (b"P\x00other",))))
    task.step(codec.encode(m.Mark(0, (7 * DAY_MS, ""), None)))
    assert task.sweep() == 1 and kv.get_many(live) == [None]
    assert sorted(k[2:6] for k in kv.data if k.startswith(b"\x01x")) == [
        (4).to_bytes(4, "big"), (6).to_bytes(4, "big")
    ]  # fmt: skip


def test_a_record_goes_once_the_order_tasks_watermark_is_retention_past_its_id() -> None:
    """Kept while a page still to decide may find it; a page id fetched again keeps its
    record longer; an ask for a record gone (only a late page makes one) is answered
    without it, and an ask for a record not there yet waits for it."""
    task = DecideTask(MemoryKV(), CFG, 0, 2)
    asker = next(p for p in range(100) if partition_of_pid(p, 2) == 1)  # replied to, not here
    old, again = page_pid("old"), page_pid("again")
    for name, pid, touched in (("old", old, None), ("again", again, 3 * DAY_MS)):
        rec = PageRecord(name, f"https://x.example/{name}", 1 * DAY_MS, 10, b"\x00" * 8)
        task.store.put_many([(b"R" + pid.to_bytes(8, "big"), Stored(rec, b"{}", touched).pack())])
        task._note(pid, touched or rec.order)

    def horizon(day: int) -> None:
        task.step(codec.encode(m.Mark(ORDER_SOURCE, (day * DAY_MS, ""), None)))
        task.tick()  # (where the sweep runs)

    horizon(3)  # day 1 is not wholly 2 days behind the horizon
    assert task._record(old) is not None and task.counts["expired"] == 0
    horizon(4)
    assert task._record(old) is None and task.counts["expired"] == 1
    assert task._record(again) is not None and task.swept == 2 * DAY_MS
    out: list[Any] = []
    task._serve(SketchAsk((1 * DAY_MS + 5, "late"), asker, (old,)), out)
    reply = decode(out[0].value)
    assert isinstance(reply, SketchReply) and reply.records == ()
    assert task.counts["expired_asks"] == 1
    task._serve(SketchAsk((4 * DAY_MS + 1, "new"), asker, (page_pid("new"),)), out)
    assert len(out) == 1 and (4 * DAY_MS + 1, "new") in task.asks
    horizon(6)
    assert task._record(again) is None and task.counts["expired"] == 2
    assert not [k for k in task.store.data if k[:1] == b"R"]  # type: ignore[attr-defined]


def test_a_day_list_takes_what_is_due_a_step_at_a_time() -> None:
    kv = MemoryKV()
    days = DayList(kv, b"x")
    days.note(3, [b"a", b"b"])
    days.note(5, [b"c"])
    assert days.take(3) == []
    assert days.take(5, limit=1) == [b"a"]
    assert days.take(5) == [b"b"]
    days.note(2, [b"late"])  # a day behind what was taken is still taken
    assert days.take(6) == [b"late", b"c"] and not kv.data


def test_the_order_step_tells_every_decide_task_each_new_day_of_its_watermark() -> None:
    from neardup.flow.order import OrderStep

    sent: list[tuple[str, int, bytes | None]] = []

    class Out:
        def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
            sent.append((topic, partition, value))

    class Rec:
        def __init__(self, value: bytes) -> None:
            self.value, self.timestamp = value, 0

    for cfg, want in ((CFG, 3), (replace(CFG, retention_days=0), 0)):
        sent.clear()
        step = OrderStep(cfg, 1, "app-pages", 3)
        kv = MemoryKV()
        for order in (DAY_MS + 5, DAY_MS + 9, 2 * DAY_MS + 1):  # days 1, 1, 2
            step.on_records([Rec(codec.encode(m.Mark(0, (order, ""), None)))], kv, Out())
        marks = [codec.decode(v or b"") for _, _, v in sent]
        assert len(marks) == 2 * want
        assert {(p, mk) for (_, p, _), mk in zip(sent, marks, strict=True)} == {
            (p, m.Mark(ORDER_SOURCE, (day * DAY_MS, ""), None))
            for p in range(want)
            for day in (1, 2)
        }


def test_a_buckets_newest_day_is_its_last_entrys() -> None:
    assert last_day(None) == -1
    assert last_day(entry(1, 2 * DAY_MS) + entry(2, 3 * DAY_MS + 7)) == 3
