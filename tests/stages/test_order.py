"""The order task (``neardup.flow.order``): edges released in key order behind the decide
tasks' marks, and the same clusters as ``neardup dedup``'s engine."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

import neardup.engine as engine_mod
from neardup.cluster import PageKey
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.decide import Kind, Match
from neardup.engine import Engine, Outcome, page_pid
from neardup.flow.codec import decode, encode
from neardup.flow.messages import (
    Edge,
    EdgeMatch,
    Key,
    Mark,
    Verdict,
    WireError,
    partition_of_pid,
)
from neardup.flow.order import OrderStep, OrderTask
from neardup.steps import ClusterResult, ClusterView, cluster_step
from neardup.store import MemoryKV
from tests.corpus import ARTICLES, line, raw_page
from tests.gold import gold_stream

CFG = EngineConfig(extract_timeout_s=0)
END: Key = (1 << 62, "")


def edge(order: int, page_id: str, *matched: tuple[int, str], kind: str = "duplicate") -> Edge:
    """An edge from page (order, page_id) to earlier pages, each a duplicate."""
    ms = tuple(
        EdgeMatch(page_pid(pid_of), o, pid_of, kind, 1, 0.9, 1.0, True) for o, pid_of in matched
    )
    return Edge((order, page_id), page_pid(page_id), ms, ())


def keys(verdicts: list[Verdict]) -> list[Key]:
    return [v.key for v in verdicts]


def test_edges_wait_for_every_source_and_come_out_in_key_order() -> None:
    task = OrderTask(MemoryKV(), CFG, sources=2)
    task.on_edge(edge(30, "c", (1, "a")), arrived=0.0)
    task.on_edge(edge(20, "b", (1, "a")), arrived=0.0)
    task.on_mark(Mark(0, (40, ""), None))
    assert task.release() == []  # source 1 never heard of
    task.on_mark(Mark(1, (25, ""), None))
    assert keys(task.release()) == [(20, "b")]  # (30, "c") is not below source 1's frontier
    task.on_edge(edge(22, "x", (20, "b")), arrived=0.0)
    task.on_mark(Mark(1, (50, ""), None))
    assert keys(task.release()) == [(22, "x"), (30, "c")]
    assert len(task) == 0


def test_a_frontier_is_exclusive_and_ties_go_by_page_id() -> None:
    task = OrderTask(MemoryKV(), CFG, sources=1)
    for page_id in ("q", "b", "k"):
        task.on_edge(edge(10, page_id, (1, "a")), arrived=0.0)
    task.on_mark(Mark(0, (10, "k"), None))
    assert keys(task.release()) == [(10, "b")]  # (10, "k") is not below (10, "k")
    task.on_mark(Mark(0, (11, ""), None))
    assert keys(task.release()) == [(10, "k"), (10, "q")]


def test_a_drained_source_lets_pass_what_arrived_before_its_mark() -> None:
    now = [100.0]
    task = OrderTask(MemoryKV(), CFG, sources=2, wait=60.0, clock=lambda: now[0])
    task.on_mark(Mark(0, (99, ""), None))
    task.on_edge(edge(50, "p", (1, "a")), arrived=100.0)
    task.on_mark(Mark(1, (40, ""), 99.0))  # drained, but before the edge came
    assert task.release() == []
    task.on_mark(Mark(1, (40, ""), 101.0))
    assert keys(task.release()) == [(50, "p")]
    task.on_edge(edge(60, "r", (1, "a")), arrived=102.0)
    task.on_mark(Mark(0, (99, ""), None))
    assert task.release() == []  # source 1's drained mark is older than the edge
    now[0] = 102.0 + 60.0
    assert keys(task.release()) == [(60, "r")]  # waited ``wait``: the old mark is taken


def test_a_late_edge_is_decided_at_once_and_counted() -> None:
    task = OrderTask(MemoryKV(), CFG, sources=1)
    task.on_edge(edge(50, "p", (1, "a")), arrived=0.0)
    task.on_mark(Mark(0, (60, ""), None))
    assert keys(task.release()) == [(50, "p")]
    task.on_edge(edge(40, "o", (1, "a")), arrived=0.0)
    assert keys(task.release()) == [(40, "o")]
    assert task.late == 1


def test_a_restarted_task_resumes_from_its_store() -> None:
    store = MemoryKV()
    task = OrderTask(store, CFG, sources=1)
    task.on_edge(edge(20, "b", (10, "a")), arrived=0.0)
    task.on_edge(edge(40, "d", (30, "c")), arrived=0.0)
    task.on_mark(Mark(0, (25, ""), None))
    assert keys(task.release()) == [(20, "b")]
    task.flush()
    again = OrderTask(store, CFG, sources=1)
    again.load()
    assert len(again) == 1 and again.edges.released == (20, "b")
    again.on_edge(edge(50, "e", (20, "b"), (40, "d")), arrived=0.0)
    again.on_mark(Mark(0, (60, ""), None))
    (d, e) = again.release()
    assert d.root == (page_pid("c"), 30, "c")
    # b joined a (restored from the store), so e merges c's cluster into a's
    assert e.root == (page_pid("a"), 10, "a")
    assert e.merged == ((page_pid("c"), 30, "c"),)


def test_retention_prunes_old_pages_but_not_a_root_that_newer_pages_reach() -> None:
    store = MemoryKV()
    day = 86_400_000
    task = OrderTask(store, EngineConfig(extract_timeout_s=0, retention_days=1), sources=1)
    task.on_edge(edge(1, "b", (0, "a")), arrived=0.0)
    task.on_edge(edge(3, "y", (2, "x")), arrived=0.0)
    task.on_edge(edge(3 * day, "z", (2, "x")), arrived=0.0)
    task.on_mark(Mark(0, END, None))
    assert len(task.release()) == 3
    # a, b and y are older than a day and reached by no newer page; x is z's root
    assert task.prune(3 * day) == 3
    assert task.clusters.find(page_pid("z")) == page_pid("x")
    assert [task.clusters.node(page_pid(p)) for p in "aby"] == [None, None, None]
    assert task.prune(3 * day) == 0


# -- the same clusters as the engine ---------------------------------------------------------


# A story written for this test, in six paragraphs: its halves come first, as two pages
# that do not match each other, then the whole, which contains both and merges them.
FERRY = [
    "连接南北两岸的新渡轮航线本周一正式开通，每天往返十八个班次，单程航行时间约为二十五分钟。",
    "新航线投入的三艘渡轮均采用电力驱动，船上设有自行车停放区和无障碍通道，每艘可载客三百二十人。",
    "港务部门负责人表示，开通新航线是为了缓解跨江大桥早晚高峰的交通压力，预计每天可分流两千多辆汽车。",
    "首班渡轮早上六点从北岸码头出发，不少附近居民专门提前赶来，希望成为第一批乘坐新渡轮的乘客。",
    "一位在南岸工业园区上班的市民说，以前开车过桥常常堵上一个小时，现在骑车到码头再坐船方便多了。",
    "据介绍，两岸码头还将陆续增设候船大厅和公交接驳站点，明年春天计划再增加两条通往江心岛的航线。",
]


def composed_stream() -> list[dict[str, str]]:
    """A gold stream; a shared block and two stories that carry it (the bridge rule: the
    second story must not join the first through the block); two halves of a story, then
    the whole (which merges their clusters)."""
    msgs = [dict(m) for m in gold_stream(2026)[0]]
    block = [ARTICLES["heatwave"][2]]
    for i, (url, paras) in enumerate(
        (
            ("https://a.example.cn/block", block),
            ("https://b.example.com/rail", [*ARTICLES["rail"], *block]),
            ("https://c.example.net/museum", [*ARTICLES["museum"], *block]),
            ("https://d.example.cn/ferry-1", FERRY[:3]),
            ("https://e.example.cn/ferry-2", FERRY[3:]),
            ("https://f.example.cn/ferry", FERRY),
        )
    ):
        msgs.append(raw_page(url, paras, paras[0][:10], fetched_at=f"2026-03-01T05:0{i}:00Z"))
    return msgs


@dataclass
class Seen:
    """One page the engine decided anew: what its cluster step got and gave."""

    key: Key
    pid: int
    verified: list[Match]
    covered: dict[int, float]
    result: ClusterResult
    outcome: Outcome | None = None


def engine_run(monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, list[Seen]]:
    """The engine over the composed stream, each page's cluster step recorded."""
    seen: list[Seen] = []
    engine = Engine(MemoryKV(), CFG)
    real = cluster_step

    def spy(
        me: PageKey,
        verified: list[Match],
        covered: Mapping[int, float],
        view: ClusterView,
        cfg: EngineConfig,
    ) -> ClusterResult:
        result = real(me, verified, covered, view, cfg)
        seen.append(Seen((me.order, me.page_id), me.pid, list(verified), dict(covered), result))
        return result

    monkeypatch.setattr(engine_mod, "cluster_step", spy)
    for msg in sorted(composed_stream(), key=lambda m: m["fetched_at"]):
        before = len(seen)
        out = engine.process(parse_raw(line(msg).encode(), CFG.max_bytes))
        if len(seen) > before and isinstance(out, Outcome):
            seen[-1].outcome = out
    return engine, seen


def as_edge(s: Seen, page_ids: dict[int, str]) -> Edge:
    ms = tuple(
        EdgeMatch(m.pid, m.order, page_ids[m.pid], str(m.kind), m.distance, m.similarity,
                  m.share, m.by_simhash)
        for m in s.verified
    )  # fmt: skip
    return Edge(s.key, s.pid, ms, tuple(s.covered.items()))


def interleaved(seen: list[Seen], page_ids: dict[int, str], sources: int) -> Iterator[Any]:
    """What ``sources`` decide tasks (page by pid) would send, interleaved at random: each
    its edges in key order, each followed by a mark up to its next page's key."""
    queues: list[list[Edge | Mark]] = [[] for _ in range(sources)]
    mine = [[s for s in seen if s.pid % sources == p] for p in range(sources)]
    for p, pages in enumerate(mine):
        for i, s in enumerate(pages):
            if s.verified:
                queues[p].append(as_edge(s, page_ids))
            queues[p].append(Mark(p, pages[i + 1].key if i + 1 < len(pages) else END, None))
    rng = random.Random(38)
    while any(queues):
        q = rng.choice([q for q in queues if q])
        yield q.pop(0)


# a cache of 8 nodes is dropped after nearly every step, so nodes are read back from the
# store; a large one holds every node (and reads nothing) until the restart
@pytest.mark.parametrize("cache", [8, 1_000_000])
def test_the_order_task_clusters_as_the_engine_does(
    monkeypatch: pytest.MonkeyPatch, cache: int
) -> None:
    engine, seen = engine_run(monkeypatch)
    page_ids = {s.pid: s.key[1] for s in seen}
    edges = [s for s in seen if s.verified]
    # the stream exercises what the step decides: merges, and matches the bridge rule drops
    assert sum(bool(s.outcome and s.outcome.merges) for s in edges) >= 1
    assert any(len(s.result.kept) < len(s.verified) for s in edges)
    assert any(m.kind is Kind.CONTAINS for s in edges for m in s.result.kept)

    store = MemoryKV()
    task = OrderTask(store, CFG, sources=3, cache_limit=cache)
    task.load()
    verdicts: dict[Key, Verdict] = {}
    for n, msg in enumerate(interleaved(seen, page_ids, 3)):
        if isinstance(msg, Edge):
            task.on_edge(msg, arrived=0.0)
        else:
            task.on_mark(msg)
        verdicts.update((v.key, v) for v in task.release())
        task.flush()
        if n == len(edges):  # a restart half-way
            task = OrderTask(store, CFG, sources=3, cache_limit=cache)
            task.load()
    assert len(task) == 0 and task.late == 0
    assert list(verdicts) == sorted(verdicts) == [s.key for s in edges]
    for s in edges:
        v, out = verdicts[s.key], s.outcome
        assert out is not None
        assert v.kept == tuple(m.pid for m in s.result.kept), s.key
        assert v.root == (s.result.root.pid, s.result.root.order, s.result.root.page_id)
        assert v.root[2] == out.decision["cluster_id"], s.key
        assert [k[2] for k in v.merged] == [m.from_cluster for m in out.merges], s.key
    for s in seen:  # the final clusters
        root = task.clusters.find(s.pid)
        name = task.clusters.key(root).page_id if task.clusters.node(root) else s.key[1]
        assert name == engine.cluster_of(s.key[1]), s.key


@dataclass(frozen=True)
class Rec:
    value: bytes | None
    timestamp: int = 0


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, int, bytes | None]] = []

    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.records.append((topic, partition, value))


def test_the_step_sends_each_verdict_to_its_pages_partition_and_resumes_from_the_store() -> None:
    store = MemoryKV()
    out = Sent()
    step = OrderStep(CFG, sources=1, pages_topic="app-pages", partitions=4)
    step.on_records([Rec(encode(edge(20, "b", (10, "a")))), Rec(None)], store, out)
    assert out.records == []  # no mark yet
    step.on_records([Rec(encode(Mark(0, (30, ""), None)))], store, out)
    (topic, partition, raw) = out.records[0]
    assert raw is not None
    verdict = decode(raw)
    assert isinstance(verdict, Verdict) and verdict.key == (20, "b")
    assert (topic, partition) == ("app-pages", partition_of_pid(page_pid("b"), 4))
    # a new step object (the runtime's, after an aborted commit) reads the task back
    again = OrderStep(CFG, sources=1, pages_topic="app-pages", partitions=4)
    again.on_records([Rec(encode(edge(40, "c", (20, "b")))), Rec(encode(Mark(0, END, None)))],
                     store, out)  # fmt: skip
    last = decode(out.records[-1][2] or b"")
    assert isinstance(last, Verdict) and last.root == (page_pid("a"), 10, "a")
    with pytest.raises(WireError):
        again.on_records([Rec(encode(verdict))], store, out)


def test_the_step_prunes_under_retention_once_the_stream_has_moved_on_a_day() -> None:
    store, out, day = MemoryKV(), Sent(), 86_400_000
    cfg = EngineConfig(extract_timeout_s=0, retention_days=1)
    step = OrderStep(cfg, sources=1, pages_topic="app-pages", partitions=2)
    step.on_records([Rec(encode(edge(1, "b", (0, "a")))), Rec(encode(Mark(0, (2, ""), None)))],
                    store, out)  # fmt: skip
    assert step.task is not None and step.task.clusters.node(page_pid("a")) is not None
    step.on_records([Rec(encode(edge(3 * day, "z", (3 * day - 1, "x")))),
                     Rec(encode(Mark(0, END, None)))], store, out)  # fmt: skip
    assert sum(isinstance(decode(r[2] or b""), Verdict) for r in out.records) == 2
    assert [step.task.clusters.node(page_pid(p)) is None for p in "abxz"] == [
        True, True, False, False,
    ]  # fmt: skip
