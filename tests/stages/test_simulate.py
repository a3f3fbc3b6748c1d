"""The partitioned topology, simulated in memory (``neardup.flow.simulate``), decides as
``neardup dedup`` does: any partition count, interleaving and crash points."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.analysis import Analysed, analyse
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import Engine
from neardup.flow.messages import Mark
from neardup.flow.simulate import Overlay, Topology, decisions, merges
from neardup.flow.watermark import Watermark
from neardup.records import Rejected
from neardup.store import MemoryKV
from tests.corpus import ARTICLES, line, raw_page
from tests.fuzz.inputs import article
from tests.gold import gold_stream

CFG = EngineConfig(extract_timeout_s=0)
MINUTE = 60_000

#: Site furniture long enough to count as template blocks of its host: on every page of
#: the template site, three times as long as the page's own text.
FURNITURE = [
    "本网站所有内容均由编辑部统一审核发布，转载请注明出处并保留原文链接，违者必究，谢谢合作。",
    "如发现本站内容存在侵权或错误信息，请及时通过页面下方的联系方式与我们取得联系，我们将尽快处理。",
    "欢迎订阅本站每日新闻简报，每天早上八点准时推送当天最重要的本地新闻、天气预报和交通出行提示。",
    "本站常年招聘新闻编辑、摄影记者和视频剪辑人员，有意者请将个人简历发送至编辑部人事办公室邮箱。",
]


def _analysed(msg: dict[str, str]) -> Analysed:
    page = parse_raw(line(msg), CFG.max_bytes)
    assert not isinstance(page, Rejected), page
    out = analyse(page, CFG)
    assert isinstance(out, Analysed), out
    return out


@pytest.fixture(scope="module")
def pool() -> list[Analysed]:
    """The gold stream (copies, edits, excerpts, two formulaic briefings) and a template
    site whose pages share most of their text."""
    pages = [_analysed(m) for m in gold_stream()[0]]
    for n, (a, b) in enumerate((("rail", "library"), ("museum", "heatwave"))):
        paras = ARTICLES[a] + ARTICLES[b]  # a digest of two stories: it may join their clusters
        pages.append(_analysed(raw_page(f"https://digest.example.net/{n}.html", paras, a + b)))
    rng = random.Random(38)
    for k in range(6):
        own = article(rng, 2)
        msg = raw_page(
            f"https://tpl.example.org/{k}.html", [own[0], *FURNITURE, own[1]], f"第{k}期"
        )
        pages.append(_analysed(msg))
    return pages


def _key(a: Analysed) -> tuple[int, str]:
    return (a.order, a.page.page_id)


def _stream(pool: list[Analysed], rng: random.Random) -> list[Analysed]:
    """The pool at fetch times with many ties, and page ids seen again: the same page
    later, other content under the id (a conflict), the same page under another host,
    earlier or later. Never two pages of one key: nothing orders them, in ``neardup
    dedup`` (its input order) or in the topology (see ``test_a_frontier_...``)."""
    base = pool[0].order
    pages = [replace(a, order=base + rng.randrange(12) * MINUTE) for a in pool]
    keys = {_key(a) for a in pages}

    def again(a: Analysed, steps: range, **changes: Any) -> None:
        free = [o for o in (a.order + s * MINUTE for s in steps) if (o, a.page.page_id) not in keys]
        if free:
            order = rng.choice(free)
            keys.add((order, a.page.page_id))
            pages.append(replace(a, order=order, **changes))

    for a in rng.sample(pages, 4):
        again(a, range(1, 6))
    for a, b in zip(rng.sample(pages, 2), rng.sample(pool, 2), strict=True):
        page = replace(b.page, page_id=a.page.page_id, url=a.page.url)
        again(replace(b, order=a.order), range(1, 8), page=page, pid=a.pid, host=a.host)
    for a in rng.sample(pages, 2):  # under another host: its hosts task does not know it
        page = replace(a.page, url=a.page.url.replace("://", "://mirror."))
        again(a, range(-2, 3), page=page, host="mirror." + a.host)
    return pages


def _engine(pages: list[Analysed]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Engine]:
    eng = Engine(MemoryKV(), CFG)
    out, merged = [], []
    for a in sorted(pages, key=_key):
        outcome = eng.decide_analysed(a)
        eng.kv.commit()
        out.append(outcome.decision)
        merged += [m.to_json() for m in outcome.merges]
    return out, merged, eng


def _stable(d: dict[str, Any], drop: str) -> str:
    return json.dumps({k: v for k, v in d.items() if k != drop}, sort_keys=True)


def _final(decided: list[dict[str, Any]], merged: list[dict[str, Any]]) -> dict[str, str]:
    """Each page's cluster once every merge is applied."""
    into = {m["from_cluster"]: m["into_cluster"] for m in merged}
    out = {}
    for d in decided:
        c = d["cluster_id"]
        while c in into:
            c = into[c]
        out[d["page_id"]] = c
    return out


def _written(
    pages: list[Analysed], raw: list[list[int]], rng: random.Random, skew: float
) -> list[list[float]]:
    """When a producer writes each raw page, beside ``raw``: it sends them in key order,
    one a turn, and each lands up to ``skew`` turns later, but never before the page
    ahead of it on its partition (a partition with batches queued lags the others)."""
    in_order = sorted(range(len(pages)), key=lambda i: _key(pages[i]))
    sent = {i: float(n) for n, i in enumerate(in_order)}
    out = []
    for part in raw:
        times, last = [], 0.0
        for i in part:
            last = max(last, sent[i] + rng.uniform(0, skew))
            times.append(last)
        out.append(times)
    return out


def _simulate(
    pages: list[Analysed],
    partitions: int,
    rng: random.Random,
    crash: float,
    *,
    skew: float | None = None,
    vouch_skew: float | None = None,
) -> Topology:
    """``skew``: the raw pages are written while the tasks run, a page up to that many
    turns after pages of later keys on other partitions (None: all there at the start);
    ``vouch_skew``: the hosts tasks' allowance for it (default: ``skew``)."""
    raw: list[list[int]] = [[] for _ in range(partitions)]
    for i in range(len(pages)):
        raw[rng.randrange(partitions)].append(i)
    for part in raw:  # a raw partition is written in fetch-time order
        part.sort(key=lambda i: _key(pages[i]))
    written = None if skew is None else _written(pages, raw, rng, skew)
    vouch = (skew or 0.0) if vouch_skew is None else vouch_skew
    sim = Topology(pages, raw, CFG, rng, crash=crash, written=written, skew=vouch)
    sim.run(lambda out: len(decisions(out)) >= len(pages))
    return sim


@settings(max_examples=25, deadline=None)
@given(
    partitions=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    crash=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_any_partitioning_interleaving_and_crash_decides_like_the_engine(
    pool: list[Analysed], partitions: int, seed: int, crash: float
) -> None:
    rng = random.Random(seed)
    pages = _stream(pool, rng)
    sim = _simulate(pages, partitions, rng, crash)
    got = [json.loads(v) for v in decisions(sim.published)]
    want, want_merges, eng = _engine(pages)
    assert sorted(_stable(d, "decided_at") for d in got) == sorted(
        _stable(d, "decided_at") for d in want
    )
    got_merges = [json.loads(v) for v in merges(sim.published)]
    assert sorted(_stable(m, "at") for m in got_merges) == sorted(
        _stable(m, "at") for m in want_merges
    )
    final = _final(got, got_merges)
    assert final == {a.page.page_id: eng.cluster_of(a.page.page_id) for a in pages}
    assert sim.late() == 0
    assert sim.crashes > 0 or not crash


@settings(max_examples=20, deadline=None)
@given(
    partitions=st.integers(2, 4),
    seed=st.integers(0, 10_000),
    crash=st.sampled_from([0.0, 0.05, 0.3]),
    skew=st.sampled_from([5.0, 30.0]),
)
def test_raw_partitions_written_out_of_step_within_the_skew_decide_like_the_engine(
    pool: list[Analysed], partitions: int, seed: int, crash: float, skew: float
) -> None:
    """The raw pages written while the tasks run, each partition in key order, but a page
    up to ``skew`` turns after pages of later keys on other partitions; the hosts tasks
    allow for that skew. Nothing comes late, and the decisions are the engine's."""
    rng = random.Random(seed)
    pages = _stream(pool, rng)
    sim = _simulate(pages, partitions, rng, crash, skew=skew)
    got = [json.loads(v) for v in decisions(sim.published)]
    want, _, _ = _engine(pages)
    assert sim.late() == 0
    assert sorted(_stable(d, "decided_at") for d in got) == sorted(
        _stable(d, "decided_at") for d in want
    )


def test_hosts_tasks_that_allow_for_no_skew_let_such_a_page_come_late(
    pool: list[Analysed],
) -> None:
    """The same out-of-step writes, but the hosts tasks take the analyse tasks' drained
    marks to vouch for all that came before them: a page of an earlier key comes after a
    later one went on, and is decided as if it had come after it. (What the skew is for,
    and a check that the simulated producer does write out of step.)"""
    rng = random.Random(5)
    pages = _stream(pool, rng)
    sim = _simulate(pages, 2, rng, 0.0, skew=30.0, vouch_skew=0.0)
    got = {_stable(json.loads(v), "decided_at") for v in decisions(sim.published)}
    assert sim.late() > 0
    assert got != {_stable(d, "decided_at") for d in _engine(pages)[0]}


def test_a_frontier_stays_at_a_key_still_held() -> None:
    """Two items of one key, the first let go by a drained mark made between their
    arrivals: the second is held, so the frontier (what a hosts task promises downstream)
    must not pass their key, or the second is late wherever it goes next."""
    w = Watermark(MemoryKV(), b"x", 2, clock=lambda: 0.0)
    w.load()
    w.on_mark(Mark(0, (20, ""), None))
    w.add((10, "p"), b"A", arrived=1.0)
    w.on_mark(Mark(1, (5, ""), 2.0))
    w.add((10, "p"), b"B", arrived=3.0)
    assert w.release() == [((10, "p"), b"A")] and len(w) == 1
    frontier = w.frontier()
    assert frontier is not None and frontier <= (10, "p")


def test_a_turns_store_writes_are_read_back_and_go_all_or_none() -> None:
    base = MemoryKV()
    base.put_many([(b"a1", b"1"), (b"a2", b"2"), (b"b1", b"3")])
    store = Overlay(base)
    store.put_many([(b"a3", b"4")])
    store.delete_many([b"a1"])
    store.write([(b"b2", b"5")], prefixes=[b"b"])
    assert list(store.scan(b"")) == [(b"a2", b"2"), (b"a3", b"4"), (b"b2", b"5")]
    assert store.get_many([b"a1", b"a3", b"b1", b"c"]) == [None, b"4", None, None]
    store.drop()
    assert list(store.scan(b"")) == list(base.scan(b"")) == [
        (b"a1", b"1"), (b"a2", b"2"), (b"b1", b"3"),
    ]  # fmt: skip
    store.put_many([(b"a3", b"4")])
    store.delete_many([b"a1"])
    store.commit()
    assert base.data == {b"a2": b"2", b"a3": b"4", b"b1": b"3"} and not store.puts
