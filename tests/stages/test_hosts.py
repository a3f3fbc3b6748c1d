"""The hosts task: pages in key order through their host's template filter, then probes
to the buckets that own their keys and the page to its decide task; repeats and
template-only pages probe nothing. With the buckets task behind it, it leaves the template
counts and the index exactly as ``neardup dedup`` does."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from neardup.analysis import Analysed, analyse, for_decision
from neardup.config import EngineConfig
from neardup.engine import Engine
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.flow.buckets import PREFIX as BUCKETS_PREFIX
from neardup.flow.buckets import BucketsTask
from neardup.flow.hosts import PREFIX as HOSTS_PREFIX
from neardup.flow.hosts import HostsTask
from neardup.flow.pending import page_record
from neardup.index import KVIndex, Lookup
from neardup.records import RawPage
from neardup.store import MemoryKV

CFG = EngineConfig(extract_timeout_s=0)

# Short news items written for these tests.
INTRO = "城东晨报为您带来本周社区生活的最新消息和实用提示，欢迎读者来信交流。"
STORIES = {
    "park": [
        "河西区今年新建了十二座口袋公园，每座面积不大，却配有座椅、健身器材和儿童滑梯，附近居民散步有了新去处。",
        "区园林部门介绍，口袋公园大多利用街角闲置地块改造而成，种植了银杏、桂花和月季等四十多种植物。",
    ],
    "bus": [
        "从下月起，市区新开通三条夜间公交线路，末班车延长到凌晨一点，方便加班族和夜班工人回家。",
        "公交集团表示，夜间线路途经火车站、中心医院和两个大型居住区，票价与白天线路相同。",
    ],
    "market": [
        "南门菜市场完成升级改造后重新营业，摊位统一更换了不锈钢台面，地面也铺上了防滑砖。",
        "市场管理方在入口处设置了农药残留快速检测室，市民买菜后可以免费送检，半小时就能出结果。",
    ],
    "school": [
        "北湖小学新学期开设了围棋、剪纸和编程三门兴趣课，每周三下午由专业老师授课，学生自愿报名。",
        "校长说，兴趣课不收取任何费用，开课第一周报名人数就超过了四百人，部分课程还增加了班次。",
    ],
    "river": [
        "经过一年的综合治理，穿城而过的清水河水质明显好转，河道两岸新修了六公里长的步行道。",
        "环保部门的监测数据显示，河水主要指标已经稳定达到三类标准，河里又能看到成群的小鱼了。",
    ],
}


def html(paragraphs: Sequence[str], title: str) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f"<html><head><title>{title}</title></head><body><div>{body}</div></body></html>"


def page(page_id: str, host: str, minute: int, paragraphs: Sequence[str]) -> Analysed:
    url = f"https://{host}/news/{page_id}"
    fetched = f"2026-03-01T08:{minute:02d}:00Z"
    a = analyse(RawPage(page_id, url, fetched, "text/html", html(paragraphs, "社区新闻")), CFG)
    assert isinstance(a, Analysed), a
    return replace(a, page=replace(a.page, body=""))  # as it travels


def stream() -> list[Analysed]:
    """Pages in fetch order: one host with a template line (and at last a page that is
    nothing else), copies and excerpts across hosts, page ids seen again, ties."""
    s = STORIES
    edited = [s["park"][0].replace("十二座", "十三座"), s["park"][1]]
    return [
        page("e1", "east.example", 0, [INTRO, *s["park"]]),
        page("w1", "west.example", 0, s["bus"]),
        page("e2", "east.example", 1, [INTRO, *s["market"]]),
        page("s1", "south.example", 1, edited),
        page("e3", "east.example", 2, [INTRO, *s["school"]]),
        page("w2", "west.example", 2, [*s["river"], *s["bus"]]),
        page("e4", "east.example", 3, [INTRO]),  # template-only by now
        page("e1", "east.example", 3, [INTRO, *s["park"]]),  # seen on its host: a repeat
        page("s2", "south.example", 4, s["bus"][:1]),
        page("w1", "west.example", 5, s["bus"]),  # seen again, later
        page("s3", "south.example", 5, s["river"]),
        page("w1", "south.example", 6, s["bus"]),  # an id first seen under another host
    ]


@pytest.fixture(scope="module")
def pages() -> list[Analysed]:
    return stream()


def key(a: Analysed) -> m.Key:
    return (a.order, a.page.page_id)


def run(task: HostsTask | BucketsTask, msgs: Sequence[m.Msg | bytes]) -> list[m.Out]:
    out: list[m.Out] = []
    for msg in msgs:
        out += task.step(msg if isinstance(msg, bytes) else codec.encode(msg))
    return out


def sent(out: Sequence[m.Out], kind: type[Any]) -> list[tuple[int | None, Any]]:
    msgs = [(o.partition, codec.decode(o.value)) for o in out]
    return [(p, x) for p, x in msgs if isinstance(x, kind)]


def test_pages_go_on_in_key_order_ties_by_page_id(pages: list[Analysed]) -> None:
    hosts = HostsTask(MemoryKV(), CFG, 0, 2)
    a, b, c = pages[4], pages[0], pages[1]  # orders 2, 0, 0
    out = run(hosts, [m.PageIn(key(a), a), m.Mark(0, (a.order, ""), None)])
    out += run(hosts, [m.PageIn(key(b), b), m.PageIn(key(c), c)])  # from source 1
    assert sent(out, m.ToDecide) == []  # source 1 has promised nothing
    out = run(hosts, [m.Mark(1, (a.order, ""), None)])
    assert [x.key for _, x in sent(out, m.ToDecide)] == [key(b), key(c)]  # e1 before w1
    out = hosts.tick()
    assert sent(out, m.ToDecide) == []  # (e3, order 2, waits for a later order)
    marks = sent(out, m.Mark)
    assert len(marks) == 4 and {x for _, x in marks} == {m.Mark(0, (a.order, ""), None)}
    assert hosts.tick() == []  # nothing new to say
    out = run(hosts, [m.Mark(0, None, 1.0), m.Mark(1, None, 1.0)])  # both drained
    assert [x.key for _, x in sent(out, m.ToDecide)] == [key(a)]
    marks = sent(hosts.tick(drained=True), m.Mark)
    assert marks and all(x.drained_at is not None for _, x in marks)
    assert [p for p, _ in marks] == [0, 1, 0, 1]  # every probes, then every pages partition


def test_a_drained_mark_is_sent_again_with_its_new_time(pages: list[Analysed]) -> None:
    """Its time vouches for what reached the downstream partitions before it: sent
    again, it lets go what came since. Held pages make a task not drained."""
    now = [10.0]
    hosts = HostsTask(MemoryKV(), CFG, 0, 1, clock=lambda: now[0])
    # its analyse task has not said it is drained: nothing upstream is vouched for
    assert [x.drained_at for _, x in sent(hosts.tick(drained=True), m.Mark)] == [None, None]
    hosts.step(codec.encode(m.Mark(0, None, 20.0)))
    assert [x.drained_at for _, x in sent(hosts.tick(drained=True), m.Mark)] == [10.0, 10.0]
    now[0] = 11.0
    assert [x.drained_at for _, x in sent(hosts.tick(drained=True), m.Mark)] == [11.0, 11.0]
    # the time as of which the runtime saw the task caught up: before it read the end
    assert [x.drained_at for _, x in sent(hosts.tick(True, as_of=10.5), m.Mark)] == [10.5] * 2
    # no later than its source's drained mark: a page written upstream since may be coming
    hosts.step(codec.encode(m.Mark(0, None, 10.2)))
    assert [x.drained_at for _, x in sent(hosts.tick(drained=True), m.Mark)] == [10.2, 10.2]
    a = pages[0]
    hosts.step(codec.encode(m.PageIn(key(a), a)), arrived=11.0)  # held: came after the last mark
    assert [x.drained_at for _, x in sent(hosts.tick(drained=True), m.Mark)] == [None, None]


def test_a_page_goes_to_its_decide_task_and_probes_the_partitions_of_its_buckets(
    pages: list[Analysed],
) -> None:
    n = 4
    hosts = HostsTask(MemoryKV(), CFG, 1, n)
    a = pages[1]
    out = run(hosts, [m.PageIn(key(a), a)] + [m.Mark(s, (99 * 10**12, ""), None) for s in range(n)])
    [(part, todo)] = sent(out, m.ToDecide)
    assert part == m.partition_of_pid(a.pid, n) and not todo.repeat
    assert todo.analysed == for_decision(a) and todo.key == key(a)
    # the record later pages verify against is the decide task's to take from it
    record = m.PageRecord("w1", a.page.url, a.order, a.fps.shingles, a.fps.sketch)
    assert page_record(todo.analysed) == page_record(a) == record
    probes = sent(out, m.Probe)
    assert todo.probes == len(probes) > 1
    sim, postings = KVIndex(MemoryKV(), CFG).keys(a.fps)
    assert sorted(k for _, p in probes for k in p.keys) == sorted(sim + postings)
    for part, p in probes:
        assert {m.partition_of_bucket(k, n) for k in p.keys} == {part}
        assert (p.pid, p.page_partition, p.key) == (a.pid, m.partition_of_pid(a.pid, n), key(a))
        assert p.entry == probes[0][1].entry


def test_repeats_and_template_only_pages_probe_nothing(pages: list[Analysed]) -> None:
    hosts = HostsTask(MemoryKV(), CFG, 0, 1)
    east = [a for a in pages if a.host == "east.example"]  # e1 e2 e3 e4 e1
    out = run(hosts, [m.PageIn(key(a), a) for a in east] + [m.Mark(0, None, math.inf)])
    todos = [x for _, x in sent(out, m.ToDecide)]
    assert [(t.key[1], t.repeat, t.probes > 0) for t in todos] == [
        ("e1", False, True),
        ("e2", False, True),
        ("e3", False, True),
        ("e1", True, False),  # a repeat (the same fetch time as e4: by page id)
        ("e4", False, False),  # template-only
    ]
    assert todos[4].analysed.template_only
    assert len(sent(out, m.Probe)) == sum(t.probes for t in todos)
    assert hosts.counts["repeats"] == 1 and hosts.counts["template_only"] == 1
    # the template line was learned: dropped from the third page's features
    assert todos[2].analysed.fps.strings != east[2].fps.strings
    assert hosts.counts["template_dropped"] > 0


def test_a_late_page_goes_on_at_once_and_is_counted(pages: list[Analysed]) -> None:
    hosts = HostsTask(MemoryKV(), CFG, 0, 1)
    a, b = pages[4], pages[0]  # orders 2, 0
    out = run(hosts, [m.PageIn(key(a), a), m.Mark(0, (a.order + 1, ""), None)])
    assert [x.key for _, x in sent(out, m.ToDecide)] == [key(a)]
    out = run(hosts, [m.PageIn(key(b), b)])
    assert [x.key for _, x in sent(out, m.ToDecide)] == [key(b)]
    assert hosts.counts["late"] == 1


def test_other_messages_do_not_belong_on_a_hosts_partition() -> None:
    hosts = HostsTask(MemoryKV(), CFG, 0, 1)
    with pytest.raises(m.WireError, match="Probe"):
        hosts.step(codec.encode(m.Probe((1, "x"), 1, 0, (), b"")))
    with pytest.raises(m.WireError):
        hosts.step(b"\x01")


# -- hosts and buckets together against the engine ----------------------------------------------


class RecordingEngine(Engine):
    """The engine, noting for each page what the host step made of it and the buckets its
    lookup read."""

    def __init__(self) -> None:
        super().__init__(MemoryKV(), CFG)
        self.filtered: dict[m.Key, Analysed] = {}
        self.looked: dict[m.Key, dict[bytes, bytes | None]] = {}
        self._now: m.Key = (0, "")
        lookup = self.index.lookup

        def recorded(fps: Any, order: int) -> Lookup:
            found = lookup(fps, order)
            self.looked[self._now] = dict(found.buckets)
            return found

        self.index.lookup = recorded  # type: ignore[method-assign]

    def filter_template(self, a: Analysed) -> Analysed:
        self.filtered[key(a)] = filtered = super().filter_template(a)
        return filtered

    def run(self, pages: Sequence[Analysed]) -> None:
        for a in pages:
            self._now = key(a)
            self.decide_analysed(a)
            self.kv.commit()


def _merge(logs: Sequence[Sequence[Any]], rng: random.Random) -> list[Any]:
    """One partition's log from its sources' records: each source's in its order."""
    heads, out = [0] * len(logs), []
    while live := [i for i, log in enumerate(logs) if heads[i] < len(log)]:
        i = rng.choice(live)
        out.append(logs[i][heads[i]])
        heads[i] += 1
    return out


def _feed(make: Any, log: Sequence[bytes], rng: random.Random, store: MemoryKV) -> list[m.Out]:
    """Run a task over ``log``, ending steps (``tick``) and restarting it from its store
    at random; the last step ends drained."""
    task, out = make(store), []
    for raw in log:
        out += task.step(raw)
        if rng.random() < 0.3:
            out += task.tick()
        if rng.random() < 0.1:
            task = make(store)
    return out + (task.tick(drained=True) if isinstance(task, HostsTask) else task.tick())


@pytest.mark.parametrize("seed", range(6))
def test_hosts_and_buckets_count_and_index_as_the_engine_does(
    pages: list[Analysed], seed: int
) -> None:
    rng = random.Random(seed)
    n = 1 + seed % 3
    engine = RecordingEngine()
    engine.run(pages)

    # analyse tasks: each raw partition in fetch order, a mark after each page
    to_hosts: list[list[list[bytes]]] = [[[] for _ in range(n)] for _ in range(n)]
    source = [rng.randrange(n) for _ in pages]
    for i in range(n):
        for a in (a for a, s in zip(pages, source, strict=True) if s == i):
            h = m.partition_of_host(a.host, n)
            to_hosts[h][i].append(codec.encode(m.PageIn(key(a), a)))
            mark = codec.encode(m.Mark(i, (a.order, ""), None))
            for logs in to_hosts:
                logs[i].append(mark)
        for logs in to_hosts:
            logs[i].append(codec.encode(m.Mark(i, None, math.inf)))

    stores = [MemoryKV() for _ in range(n)]
    to_probes: list[list[list[bytes]]] = [[[] for _ in range(n)] for _ in range(n)]
    todos: dict[m.Key, list[m.ToDecide]] = defaultdict(list)
    for h in range(n):
        out = _feed(
            lambda kv, h=h: HostsTask(kv, CFG, h, n), _merge(to_hosts[h], rng), rng, stores[h]
        )
        for o in out:
            msg = codec.decode(o.value)
            if o.topic == m.PROBES:
                assert o.partition is not None
                to_probes[o.partition][h].append(o.value)
            elif isinstance(msg, m.ToDecide):
                assert o.partition == m.partition_of_pid(msg.analysed.pid, n)
                todos[msg.key].append(msg)

    buckets = [MemoryKV() for _ in range(n)]
    answers: dict[m.Key, dict[bytes, bytes | None]] = defaultdict(dict)
    for b in range(n):
        out = _feed(
            lambda kv, b=b: BucketsTask(kv, CFG, b, n), _merge(to_probes[b], rng), rng, buckets[b]
        )
        for o in out:
            msg = codec.decode(o.value)
            assert isinstance(msg, m.Answer)
            assert o.partition == m.partition_of_pid(msg.pid, n)
            answers[msg.key].update(zip(msg.keys, msg.values, strict=True))

    # every page to decide once (a page id seen again: once a key), as the engine saw it
    assert sorted(todos) == sorted({key(a) for a in pages})
    for k, [todo] in todos.items():
        if todo.repeat:
            assert k not in engine.filtered
            continue
        assert todo.analysed == for_decision(engine.filtered[k])
        if todo.probes:  # the buckets answered what the engine's lookup read
            assert answers[k] == engine.looked[k]
        else:
            assert todo.analysed.template_only and k not in answers

    # the buckets hold the engine's buckets; the hosts its template counts (and no page)
    mine = {k: v for kv in buckets for k, v in kv.data.items() if not k.startswith(BUCKETS_PREFIX)}
    assert mine == _kinds(engine, b"PSCB")
    assert {k: v for kv in stores for k, v in _kinds(kv, b"TH").items()} == _kinds(engine, b"TH")
    assert not any(k.startswith(HOSTS_PREFIX + b"p") for kv in stores for k in kv.data)


def _kinds(state: Engine | MemoryKV, kinds: bytes) -> dict[bytes, bytes]:
    """The items of ``state`` whose keys start with one of ``kinds``."""
    kv = state if isinstance(state, MemoryKV) else state.kv.inner
    assert isinstance(kv, MemoryKV)
    return {k: v for k, v in kv.data.items() if k[0] in kinds}


def test_the_fixture_has_what_the_comparison_needs(pages: list[Analysed]) -> None:
    engine = RecordingEngine()
    engine.run(pages)
    only = [k for k, a in engine.filtered.items() if a.template_only]
    assert only == [key(pages[6])]
    assert len(engine.filtered) == len(pages) - 2  # two ids seen again on their host
    assert engine.stats.repeated == 3  # ... and one under another host
    assert sum(a.order == pages[0].order for a in pages) == 2  # a tie
    assert len(engine.looked) > 5 and any(v for b in engine.looked.values() for v in b.values())
