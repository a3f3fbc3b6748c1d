"""The buckets task: probes applied in key order behind the watermark; each answered with
what its buckets held before the page, then the page's entry added as the index adds it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.config import EngineConfig
from neardup.fingerprint import Fingerprints
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.flow.buckets import BucketsTask, index_part, probe_buckets
from neardup.index import ENTRY, KVIndex, make_entry
from neardup.store import MemoryKV

CFG = EngineConfig(extract_timeout_s=0)
DAY = 86_400_000


def entry(pid: int, order: int, fp: int = 5) -> bytes:
    fps = Fingerprints(fp, fp ^ 1, (1, 2, 3), 9)
    return np.asarray(make_entry(pid, fps, order)).tobytes()


def probe(order: int, page_id: str, pid: int, keys: tuple[bytes, ...], part: int = 0) -> m.Probe:
    return m.Probe((order, page_id), pid, part, keys, entry(pid, order))


def answers(out: list[m.Out]) -> list[m.Answer]:
    msgs = [codec.decode(o.value) for o in out]
    assert all(isinstance(x, m.Answer) for x in msgs)
    return msgs  # type: ignore[return-value]


def test_an_empty_bucket_answers_nothing_and_takes_the_entry() -> None:
    index = KVIndex(MemoryKV(), CFG)
    p = probe(10, "a", 1, (b"P\x00k", b"C1"))
    assert probe_buckets(index, p) == m.Answer((10, "a"), 1, p.keys, (None, None))
    assert index.kv.get_many([b"P\x00k", b"C1"]) == [p.entry, p.entry]


def test_probes_go_in_key_order_and_each_answers_the_pages_before_it() -> None:
    kv = MemoryKV()
    task = BucketsTask(kv, CFG, 0, 2)
    keys = (b"P\x00same",)
    arrivals = [probe(30, "c", 3, keys, 1), probe(10, "a", 1, keys, 0), probe(20, "b", 2, keys)]
    out = [o for p in arrivals for o in task.step(codec.encode(p))]
    out += task.step(codec.encode(m.Mark(0, (40, ""), None)))
    assert out == []  # hosts task 1 promised nothing yet
    out = task.step(codec.encode(m.Mark(1, (20, "b"), None)))
    assert [a.key for a in answers(out)] == [(10, "a")]
    out = task.step(codec.encode(m.Mark(1, (31, ""), None)))
    got = answers(out)
    assert [a.key for a in got] == [(20, "b"), (30, "c")]
    assert got[0].values == (entry(1, 10),)
    assert got[1].values == (entry(1, 10) + entry(2, 20),)
    assert [o.partition for o in out] == [0, 1]  # to each page's decide task
    assert kv.get_many(list(keys)) == [entry(1, 10) + entry(2, 20) + entry(3, 30)]
    assert task.counts["probes"] == 3


def test_ties_go_by_page_id_and_state_survives_a_restart() -> None:
    kv = MemoryKV()
    task = BucketsTask(kv, CFG, 0, 1)
    keys = (b"C\x00tie",)
    for page_id, pid in (("q", 2), ("p", 1)):
        task.step(codec.encode(probe(50, page_id, pid, keys)))
    task = BucketsTask(kv, CFG, 0, 1)  # a restart: the probes wait in the store
    got = answers(task.step(codec.encode(m.Mark(0, (51, ""), None))))
    assert [(a.key, a.values) for a in got] == [((50, "p"), (None,)), ((50, "q"), (entry(1, 50),))]


def test_a_late_probe_is_answered_at_once_from_the_buckets_as_they_are() -> None:
    task = BucketsTask(MemoryKV(), CFG, 0, 1)
    keys = (b"S\x01x",)
    task.step(codec.encode(probe(20, "b", 2, keys)))
    task.step(codec.encode(m.Mark(0, (21, ""), None)))
    [late] = answers(task.step(codec.encode(probe(10, "a", 1, keys))))
    assert late.values == (entry(2, 20),) and task.counts["late"] == 1


def test_a_full_bucket_takes_nothing_and_is_counted_by_part() -> None:
    cfg = replace(CFG, bucket_cap=16)
    index = KVIndex(MemoryKV(), cfg)
    keys = (b"P\x00a", b"S\x02b", b"C123", b"B1234")
    full = b"".join(entry(100 + i, i) for i in range(16))
    index.kv.put_many([(k, full) for k in keys])
    answer = probe_buckets(index, probe(99, "z", 7, keys))
    assert answer.values == (full,) * 4
    assert index.kv.get_many(list(keys)) == [full] * 4
    assert index.capped == {"simhash": 2, "strings": 1, "minhash": 1}


def test_the_parts_are_those_of_the_index_keys() -> None:
    index = KVIndex(MemoryKV(), CFG)
    short = Fingerprints(1, 2, (7, 8), 3, 5, np.arange(10, dtype="<u4").tobytes())
    sim, postings = index.keys(short)
    assert {index_part(k) for k in sim} == {"simhash"}
    assert [index_part(k) for k in postings] == ["strings"] * 2 + ["minhash"] * CFG.minhash_keys
    with pytest.raises(KeyError):
        index_part(b"Kxx")  # a sketch is no bucket


def test_other_messages_do_not_belong_on_a_probes_partition() -> None:
    task = BucketsTask(MemoryKV(), CFG, 0, 1)
    with pytest.raises(m.WireError, match="Answer"):
        task.step(codec.encode(m.Answer((1, "x"), 1, (), ())))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 6), st.integers(0, 2**64 - 1), st.integers(0, 12)), max_size=20
    ),
    pid=st.integers(1, 8),
    retention=st.booleans(),
    cap=st.sampled_from([16, 17, 4096]),
    empty=st.lists(st.booleans(), min_size=24, max_size=24),
)
def test_a_probe_reads_and_writes_the_buckets_as_the_index_does(
    rows: list[tuple[int, int, int]], *, pid: int, retention: bool, cap: int, empty: list[bool]
) -> None:
    """Against ``KVIndex.lookup`` then ``add`` of the same page on the same buckets: the
    answer is what the lookup read, and the buckets end alike (entries that expire, full
    buckets, a pid already in a bucket)."""
    cfg = replace(CFG, bucket_cap=cap, retention_days=30 if retention else 0)
    fps = Fingerprints(5, 6, (11, 12), 3, 4, np.arange(8, dtype="<u4").tobytes())
    now = 1_000 * DAY
    stored = np.zeros(len(rows), dtype=ENTRY)
    for i, (p, fp, age) in enumerate(rows):
        stored[i] = (p, fp, fp ^ 1, now - age * 7 * DAY, 3)
    mine, theirs = KVIndex(MemoryKV(), cfg), KVIndex(MemoryKV(), cfg)
    sim, postings = mine.keys(fps)
    keys = sim + postings
    filled = [(k, stored.tobytes()) for k, e in zip(keys, empty, strict=False) if not e and rows]
    for index in (mine, theirs):
        index.kv.put_many(filled)

    page_entry = make_entry(pid, fps, now)
    found = theirs.lookup(fps, now)
    theirs.add(found, page_entry, fps, sketch=False)
    pr = m.Probe((now, "x"), pid, 0, tuple(keys), np.asarray(page_entry).tobytes())
    answer = probe_buckets(mine, pr)
    assert dict(zip(answer.keys, answer.values, strict=True)) == found.buckets
    assert mine.kv.data == theirs.kv.data  # type: ignore[attr-defined]
    assert mine.capped == theirs.capped


def test_a_watermark_wait_lets_probes_go_on_the_last_marks() -> None:
    now = [100.0]
    task = BucketsTask(MemoryKV(), CFG, 0, 2, wait=30.0, clock=lambda: now[0])
    task.step(codec.encode(m.Mark(0, (5, ""), 90.0)))  # drained before the probe came
    task.step(codec.encode(m.Mark(1, (99, ""), None)))
    assert task.step(codec.encode(probe(50, "a", 1, (b"P\x00w",))), arrived=100.0) == []
    assert task.tick() == []
    now[0] = 130.0
    assert [a.key for a in answers(task.tick())] == [(50, "a")]
