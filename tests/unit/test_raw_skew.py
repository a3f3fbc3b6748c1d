"""A drained mark of an analyse task vouches, at the hosts stage, for the pages that
reached it ``NEARDUP_RAW_SKEW_MS`` or more before the mark was made: a page written to
one raw partition a little after a page with a later fetch time on another (a producer
sends each partition's batches in turn) is still taken in key order."""

from __future__ import annotations

import math

import pytest

from neardup.config import EngineConfig
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.tasks import AnalyseStep, Context, PartStep
from neardup.kafka.topology import Topics
from neardup.store import MemoryKV
from tests.corpus import ARTICLES, line, raw_page

CFG = EngineConfig(extract_timeout_s=0)
TOPICS = Topics("raw", "decisions", "merges", "rejects", "app-hosts", "app-probes",
                "app-pages", "app-order", "a-cl", "p-cl", "o-cl")  # fmt: skip


def _raw(story: str, minute: int) -> bytes:
    url = f"https://news.example.cn/{story}.html"
    msg = raw_page(url, ARTICLES[story], story, fetched_at=f"2026-03-01T00:{minute:02d}:00Z")
    return line(msg).encode()


def _sent(sink: Sink, topic: str) -> list[bytes]:
    return [v for (t, _), kvs in sink.pending.items() for _, v in kvs
            if t == topic and v is not None]  # fmt: skip


class _Analyse:
    """Analyse task ``j``: what it sends to the hosts topic."""

    def __init__(self, j: int, ctx: Context) -> None:
        self.step, self.kv = AnalyseStep(j, ctx), MemoryKV()

    def read(self, value: bytes) -> list[bytes]:
        sink = Sink()
        self.step.on_records([Record("raw", self.step.j, 0, b"k", value, 0)], self.kv, sink)
        return _sent(sink, TOPICS.hosts)

    def tick(self, now: float) -> list[bytes]:
        sink = Sink()
        self.step.on_tick(now, self.kv, sink, caught_up=True)  # all of its partition read
        return _sent(sink, TOPICS.hosts)


@pytest.mark.parametrize(("skew", "late"), [(2.0, 0), (0.0, 1)])
def test_a_page_written_after_a_later_page_of_another_partition_comes_in_key_order(
    skew: float, late: int
) -> None:
    """B (raw partition 1) is analysed and reaches the hosts partition at 10; analyse-0,
    whose partition is empty, says at 11 that it has read all of it; then A, fetched
    before B, is written to raw partition 0 and reaches the hosts partition at 12. With
    a skew of 2 s, analyse-0's mark of 11 does not vouch for B, and A goes first. With
    none, B goes at 11 and A comes late."""
    ctx = Context(CFG, TOPICS, 1, 2, order_wait=math.inf, mark_interval=0.0, raw_skew=skew)
    analyse = [_Analyse(0, ctx), _Analyse(1, ctx)]
    part, kv = PartStep(0, ctx), MemoryKV()
    went: list[m.Key] = []

    def arrive(values: list[bytes], at: float) -> None:
        sink = Sink()
        records = [Record(TOPICS.hosts, 0, 0, b"h", v, int(at * 1000)) for v in values]
        part.on_records(records, kv, sink)
        part.on_tick(at, kv, sink, caught_up=True)
        for v in _sent(sink, TOPICS.pages):
            msg = codec.decode(v)
            if isinstance(msg, m.ToDecide):
                went.append(msg.key)

    a, b = _raw("rail", 1), _raw("library", 2)
    arrive(analyse[1].read(b) + analyse[1].tick(10.0), 10.0)
    arrive(analyse[0].tick(11.0), 11.0)
    arrive(analyse[0].read(a) + analyse[0].tick(12.0), 12.0)
    for now in (13.0, 14.0, 15.0):  # both go quiet: their drained marks come on
        arrive(analyse[0].tick(now) + analyse[1].tick(now), now)
    hosts = part.stages[0] if part.stages else None
    assert hosts is not None and len(went) == 2 and hosts.counts["late"] == late
    assert (went == sorted(went)) == (late == 0)
    assert ctx.tally.stages[("hosts", "late")] == late  # counted in /metrics too
