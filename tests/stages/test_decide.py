"""The decide task (``neardup.flow.decide``) on its own: records asked for before they
come, page ids seen again, its marks, and a task rebuilt from its store at any record."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np
import orjson
import pytest

from neardup.analysis import Analysed, analyse, for_decision
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import Engine
from neardup.flow.buckets import probe_buckets
from neardup.flow.codec import decode, encode
from neardup.flow.decide import DECISIONS, MERGES, DecideTask
from neardup.flow.hosts import bucket_keys
from neardup.flow.messages import (
    ORDER,
    PAGES,
    Answer,
    Edge,
    Key,
    Mark,
    Msg,
    Out,
    Probe,
    SketchAsk,
    SketchReply,
    ToDecide,
    Verdict,
    WireError,
    partition_of_pid,
)
from neardup.flow.pending import HEARD, page_record
from neardup.flow.upkeep import PROGRESS
from neardup.index import KVIndex, make_entry
from neardup.records import Rejected
from neardup.store import MemoryKV
from tests.corpus import ARTICLES, line, raw_page

CFG = EngineConfig(extract_timeout_s=0)
END: Key = (1 << 62, "")


def _page(story: str, url: str, minute: int, paras: list[str] | None = None) -> Analysed:
    msg = raw_page(
        url, paras or ARTICLES[story], story, fetched_at=f"2026-03-01T00:{minute:02d}:00Z"
    )
    page = parse_raw(line(msg), CFG.max_bytes)
    assert not isinstance(page, Rejected)
    a = analyse(page, CFG)
    assert isinstance(a, Analysed)
    return a


def _key(a: Analysed) -> Key:
    return (a.order, a.page.page_id)


def _todo(a: Analysed, probes: int = 1, *, repeat: bool = False) -> ToDecide:
    return ToDecide(_key(a), for_decision(a), probes, repeat)


class Index:
    """One probes partition holding every bucket: each page's one answer, in key order."""

    def __init__(self) -> None:
        self.index = KVIndex(MemoryKV(), CFG)

    def answer(self, a: Analysed) -> Answer:
        entry = np.asarray(make_entry(a.pid, a.fps, a.order)).tobytes()
        keys = tuple(bucket_keys(self.index, a))
        return probe_buckets(self.index, Probe(_key(a), a.pid, 0, keys, entry))


def _feed(task: DecideTask, msgs: list[Msg]) -> list[Out]:
    out: list[Out] = []
    for m in msgs:
        out += task.step(encode(m))
    return out


def _decisions(out: list[Out]) -> list[dict[str, object]]:
    return [json.loads(o.value) for o in out if o.topic == DECISIONS]


def _of(out: list[Out], kind: type) -> list[object]:
    return [m for o in out if o.topic in (PAGES, ORDER) and isinstance(m := decode(o.value), kind)]


@pytest.fixture(scope="module")
def rail() -> tuple[Analysed, Analysed, Analysed]:
    """A story, a copy of it on another site, and another story."""
    first = _page("rail", "https://a.example.cn/rail.html", 1)
    copy = _page("rail", "https://b.example.com/rail.html", 2)
    other = _page("museum", "https://a.example.cn/museum.html", 3)
    return first, copy, other


def test_a_copy_goes_to_the_order_task_and_is_decided_on_its_verdict(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, copy, _ = rail
    index, task = Index(), DecideTask(MemoryKV(), CFG, 0, 1)
    out = _feed(task, [_todo(first), index.answer(first), _todo(copy), index.answer(copy)])
    out += _feed(task, [Mark(0, END, None)])
    [unique] = _decisions(out)
    assert (unique["page_id"], unique["decision"], unique["cluster_id"]) == (
        first.page.page_id, "unique", first.page.page_id,
    )  # fmt: skip
    [edge] = _of(out, Edge)
    assert isinstance(edge, Edge) and edge.key == _key(copy)
    assert [(m.pid, m.page_id) for m in edge.matches] == [(first.pid, first.page.page_id)]
    assert task.frontier() == END  # a page that waits for its verdict holds nothing back
    root = (first.pid, first.order, first.page.page_id)
    out = _feed(task, [Verdict(_key(copy), copy.pid, (first.pid,), root, ())])
    [dup] = _decisions(out)
    want = Engine(MemoryKV(), CFG)
    want.decide_analysed(first)
    expected = want.decide_analysed(copy).decision
    assert {k: v for k, v in dup.items() if k != "decided_at"} == {
        k: v for k, v in expected.items() if k != "decided_at"
    }
    assert dup["duplicate_of_url"] == first.page.url and not task.pages


def test_a_verdict_that_merges_clusters_publishes_the_merges(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, copy, other = rail
    index, task = Index(), DecideTask(MemoryKV(), CFG, 0, 1)
    _feed(task, [_todo(first), index.answer(first), _todo(copy), index.answer(copy)])
    _feed(task, [Mark(0, END, None)])
    root = (first.pid, first.order, first.page.page_id)
    merged = (other.pid, other.order, other.page.page_id)
    out = _feed(task, [Verdict(_key(copy), copy.pid, (first.pid,), root, (merged,))])
    [merge] = [orjson.loads(o.value) for o in out if o.topic == MERGES]
    assert merge["from_cluster"] == other.page.page_id
    assert merge["into_cluster"] == first.page.page_id == _decisions(out)[0]["cluster_id"]
    assert merge["page_id"] == copy.page.page_id and merge["at"] == _decisions(out)[0]["decided_at"]


def test_a_record_asked_for_before_it_came_is_sent_when_it_comes(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, copy, _ = rail
    n = 64  # enough partitions that the two pages' tasks differ
    mine, theirs = partition_of_pid(first.pid, n), partition_of_pid(copy.pid, n)
    assert mine != theirs
    task = DecideTask(MemoryKV(), CFG, mine, n)
    ask = SketchAsk(_key(copy), copy.pid, (first.pid,))
    assert _feed(task, [ask]) == []
    assert _feed(task, [_todo(first, probes=0)]) == []  # behind the watermark
    out = _feed(task, [Mark(s, END, None) for s in range(n)])
    [reply] = [o for o in out if o.topic == PAGES]
    assert reply.partition == theirs
    assert decode(reply.value) == SketchReply(
        _key(copy), copy.pid, ((first.pid, page_record(first)),)
    )
    assert _feed(task, [ask])[0].value == reply.value  # asked again: answered at once


def test_a_page_id_seen_again_waits_for_its_first_decision_and_gets_it_byte_for_byte(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, _, other = rail
    later = _page("rail", first.page.url, 9)
    index, task = Index(), DecideTask(MemoryKV(), CFG, 0, 1)
    # the same host's repeat (no probes), and the id under another host (probed, answered)
    out = _feed(task, [_todo(first), _todo(later, 0, repeat=True), _todo(later, 2)])
    out += _feed(task, [Mark(0, END, None)])
    assert _decisions(out) == [] and task.repeats
    out += _feed(task, [index.answer(first)])
    one, two, three = (o.value for o in out if o.topic == DECISIONS)
    assert one == two == three
    page = replace(other.page, page_id=first.page.page_id, url=first.page.url)
    mixed = replace(other, page=page, pid=first.pid, order=later.order)
    conflict = ToDecide(_key(later), for_decision(mixed), 0, False)
    again = _feed(task, [conflict, *[index.answer(later)] * 2])
    assert [o.value for o in again] == [one] and task.counts["conflicts"] == 1
    assert not task.pages  # the repeat's answers decide nothing and hold nothing back


def test_the_mark_holds_at_pages_not_computed_and_is_drained_as_of_its_oldest_source(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, copy, _ = rail
    task = DecideTask(MemoryKV(), CFG, 0, 2)

    def mark(idle: bool = True) -> Mark:
        [out] = task.tick(idle)
        m = decode(out.value)
        assert isinstance(m, Mark) and out.topic == ORDER
        return m

    assert mark() == Mark(0, None, None)  # a source never heard of
    assert task.tick(True) == []  # the same mark again is not sent
    _feed(task, [_todo(first, probes=1), Mark(0, END, 5.0), Mark(1, END, 7.0)])
    assert mark() == Mark(0, _key(first), None)  # its answer is still to come
    index = Index()
    _feed(task, [index.answer(first)])
    assert mark() == Mark(0, END, 5.0)
    assert mark(idle=False) == Mark(0, END, None)
    _feed(task, [index.answer(copy)])  # an answer before its page: that page is open
    assert mark() == Mark(0, _key(copy), None)
    _feed(task, [Mark(1, END, None), _todo(copy)])
    # source 1 is no longer drained: whatever the mark says next, it is not drained
    assert all(m.drained_at is None for m in map(lambda o: decode(o.value), task.tick(True)))
    assert task.sources.drained_at() is None


def test_a_task_rebuilt_from_its_store_at_any_record_sends_what_one_never_stopped_sends(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    first, copy, other = rail
    n = 2
    index = Index()
    msgs: list[Msg] = [Mark(0, END, 1.0)]
    for a in (first, other, copy):
        msgs += [index.answer(a), _todo(a)]
    msgs.append(Mark(1, END, 1.0))

    def run(fresh: Callable[[DecideTask], DecideTask]) -> list[tuple[str, bytes]]:
        task = DecideTask(MemoryKV(), CFG, partition_of_pid(copy.pid, n), n)
        queue, out = list(msgs), []
        while queue:
            for o in task.step(encode(queue.pop(0))):
                msg = decode(o.value) if o.topic in (PAGES, ORDER) else None
                if isinstance(msg, SketchAsk):  # the other task: it has every record
                    recs = tuple((p, page_record(a)) for a in rail for p in msg.pids if p == a.pid)
                    queue.append(SketchReply(msg.asker, msg.asker_pid, recs))
                elif isinstance(msg, Edge):
                    root = (msg.matches[0].pid, msg.matches[0].order, msg.matches[0].page_id)
                    kept = tuple(m.pid for m in msg.matches)
                    queue.append(Verdict(msg.key, msg.pid, kept, root, ()))
                if o.topic == DECISIONS:
                    d = json.loads(o.value)
                    del d["decided_at"]
                    out.append((o.topic, orjson.dumps(d)))
                else:
                    out.append((o.topic, o.value))
            task = fresh(task)
        return out

    steady = run(lambda t: t)
    assert run(lambda t: DecideTask(t.store, CFG, t.partition, n)) == steady
    topics = [t for t, _ in steady]
    assert topics.count(DECISIONS) == 3 and isinstance(decode(steady[topics.index(ORDER)][1]), Edge)


def test_a_record_that_belongs_elsewhere_is_refused() -> None:
    task = DecideTask(MemoryKV(), CFG, 0, 1)
    with pytest.raises(WireError):
        task.step(b"\x07")
    with pytest.raises(WireError):
        task.step(encode(Probe((1, "a"), 1, 0, (), b"")))


class _Writes(MemoryKV):
    """A store that keeps every value written, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[bytes, bytes]] = []

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        items = list(items)
        self.puts += items
        super().put_many(items)


def test_each_answer_is_written_once_and_a_rebuilt_task_resumes_from_them(
    rail: tuple[Analysed, Analysed, Analysed],
) -> None:
    page = rail[2]
    whole = Index().answer(page)
    n = len(whole.keys)
    cuts = [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]
    parts = [Answer(whole.key, whole.pid, whole.keys[a:b], whole.values[a:b]) for a, b in cuts]
    one = DecideTask(MemoryKV(), CFG, 0, 1)
    want = _decisions(_feed(one, [_todo(page, 3), Mark(0, END, None), *parts]))
    store = _Writes()
    task = DecideTask(store, CFG, 0, 1)
    _feed(task, [_todo(page, 3), Mark(0, END, None), *parts[:2]])
    written = [v for k, v in store.puts if k.startswith(HEARD)]
    assert written == [encode(p) for p in parts[:2]]  # each once, as it came
    progress = {len(v) for k, v in store.puts if k.startswith(PROGRESS)}
    assert len(progress) == 1  # what else is kept of the page does not grow with them
    again = DecideTask(store, CFG, 0, 1)  # from the store alone
    assert again.pages[_key(page)].answers == parts[:2]
    got = _decisions(_feed(again, [parts[2]]))
    assert [d["decision"] for d in got] == [d["decision"] for d in want] == ["unique"]
    assert list(store.scan(HEARD)) == []  # decided: its answers are gone
