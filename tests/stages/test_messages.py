"""The partitioned topology's messages: every one round-trips, and a record that is not
one is refused with ``WireError``, never another exception."""

from __future__ import annotations

import base64
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.config import EngineConfig
from neardup.decide import Kind
from neardup.engine import Analysed, analyse, for_decision
from neardup.fingerprint import Fingerprints
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.records import RawPage

CFG = EngineConfig()

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)
# UTF-8 carries every character but a lone surrogate (the engine refuses those)
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
keys = st.tuples(i64, text)
floats = st.floats(allow_nan=False)
blobs = st.binary(max_size=40)


@st.composite
def records(draw: st.DrawFn) -> m.PageRecord:
    return m.PageRecord(draw(text), draw(text), draw(i64), draw(u32), draw(blobs))


@st.composite
def analysed(draw: st.DrawFn) -> Analysed:
    page = RawPage(draw(text), draw(text), "2026-03-01T08:00:00Z", "text/html", "")
    strings = tuple(sorted(set(draw(st.lists(u64, max_size=6)))))
    fps = Fingerprints(draw(u64), draw(u64), strings, draw(u32), draw(u32), draw(blobs))
    return Analysed(page, draw(u64), draw(i64), draw(text), draw(text), 12, fps, "utf-8", "meta")


page_keys = st.tuples(u64, i64, text)
edge_matches = st.builds(
    m.EdgeMatch,
    u64,
    i64,
    text,
    st.sampled_from(["duplicate", "contained", "contains"]),
    st.integers(0, 64),
    floats,
    floats,
    st.booleans(),
)
answers = st.lists(st.tuples(blobs, st.none() | blobs), max_size=5).flatmap(
    lambda pairs: st.builds(
        m.Answer,
        keys,
        u64,
        st.just(tuple(k for k, _ in pairs)),
        st.just(tuple(v for _, v in pairs)),
    )
)
messages = st.one_of(
    st.builds(m.Mark, u32, st.none() | keys, st.none() | floats),
    st.builds(m.PageIn, keys, analysed()),
    st.builds(m.Probe, keys, u64, u32, st.lists(blobs, max_size=5).map(tuple), blobs),
    answers,
    st.builds(m.ToDecide, keys, analysed(), u32, st.booleans()),
    st.builds(m.SketchAsk, keys, u64, st.lists(u64, max_size=8).map(tuple)),
    st.builds(m.SketchReply, keys, u64, st.lists(st.tuples(u64, records()), max_size=4).map(tuple)),
    st.builds(
        m.Edge,
        keys,
        u64,
        st.lists(edge_matches, max_size=4).map(tuple),
        st.lists(st.tuples(u64, floats), max_size=4).map(tuple),
    ),
    st.builds(
        m.Verdict,
        keys,
        u64,
        st.lists(u64, max_size=5).map(tuple),
        page_keys,
        st.lists(page_keys, max_size=3).map(tuple),
    ),
)


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(msg: m.Msg) -> None:
    raw = codec.encode(msg)
    assert codec.decode(raw) == msg
    assert raw[1] == codec.VERSION


@settings(max_examples=200, deadline=None)
@given(st.one_of(answers, st.builds(m.Probe, keys, u64, u32, st.lists(blobs).map(tuple), blobs)))
def test_probes_and_answers_keep_the_field_codecs_bytes(msg: m.Probe | m.Answer) -> None:
    """Their codecs are written out for speed: the bytes are the field codecs' still."""
    out: list[bytes] = [codec.encode(msg)[:2]]
    codec.FIELD_CODECS[type(msg)].write(out, msg)
    assert codec.encode(msg) == b"".join(out)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_a_record_cut_short_or_with_bytes_left_over_is_refused(
    msg: m.Msg, data: st.DataObject
) -> None:
    raw = codec.encode(msg)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(m.WireError):
        codec.decode(raw[:cut])
    with pytest.raises(m.WireError):
        codec.decode(raw + b"\x00")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_decode_to_a_message_or_a_wire_error(raw: bytes) -> None:
    try:
        msg = codec.decode(raw)
    except m.WireError:
        return
    assert isinstance(msg, m.Mark | m.SketchAsk | m.Verdict | m.Edge | m.Probe | m.Answer)


def test_an_unknown_type_or_another_version_is_refused() -> None:
    good = codec.encode(m.Mark(3, (10, "页"), None))
    for bad, says in (
        (bytes([99]) + good[1:], "unknown message type 99"),
        (bytes([0]) + good[1:], "unknown message type 0"),
        (good[:1] + bytes([codec.VERSION + 1]) + good[2:], "version"),
        (b"", "holds no message"),
    ):
        with pytest.raises(m.WireError, match=says):
            codec.decode(bad)


def test_a_page_for_decision_round_trips_without_its_body() -> None:
    body = (
        "<html><head><title>社区图书角开放</title></head><body><p>本周六上午，"
        "东湖社区的图书角正式开放，居民可以免费借阅两千多册图书。社区工作人员说，"
        "这些书大多来自居民捐赠，以后每月还会更新一次。</p><p>不少家长带着孩子前来看书，"
        "一位老人说，退休以后终于有了一个安静读报的好去处。</p></body></html>"
    )
    page = RawPage("bk-1", "https://news.example/a/1", "2026-03-01T08:00:00Z", "text/html", body)
    a = analyse(page, CFG)
    assert isinstance(a, Analysed) and a.fps.piece_strings  # carries the template data
    for msg in (
        m.PageIn((a.order, "bk-1"), a),
        m.ToDecide((a.order, "bk-1"), for_decision(a), 3, False),
    ):
        back = codec.decode(codec.encode(msg))
        assert isinstance(back, m.PageIn | m.ToDecide)
        assert back.analysed.page.body == ""
        got, want = back.analysed, msg.analysed
        assert got.fps == want.fps and got.line_keys == want.line_keys
        assert (got.pid, got.order, got.host, got.title) == (a.pid, a.order, a.host, a.title)
        # its byte strings go as they are, not as base64 in its JSON
        raw = codec.encode(msg)
        assert msg.analysed.fps.sketch in raw
        assert base64.b64encode(msg.analysed.fps.sketch) not in raw


def test_every_kind_of_match_travels_and_no_other() -> None:
    for kind in Kind:
        match = m.EdgeMatch(1, 2, "p", str(kind), 3, 0.5, 0.5, False)
        edge = m.Edge((2, "q"), 4, (match,), ())
        assert codec.decode(codec.encode(edge)) == edge
    with pytest.raises(ValueError, match="kind"):
        codec.encode(m.Edge((2, "q"), 4, (match._replace(kind="similar"),), ()))
    raw = bytearray(codec.encode(edge))
    raw[2 + (12 + 1) + 8 + 4 + 8 + 8] = 200  # the kind's byte
    with pytest.raises(m.WireError, match="Edge"):
        codec.decode(bytes(raw))


def test_marks_edges_and_verdicts_are_compact() -> None:
    """The order topic's messages are packed, not JSON: a few bytes beyond their fields."""
    mark = codec.encode(m.Mark(7, (1_700_000_000_000, "p-000123"), 12.5))
    # head, source, the frontier (a flag, its order, the page id's length and bytes), the time
    assert len(mark) == 2 + 4 + (1 + 8 + 4 + 8) + (1 + 8)
    match = m.EdgeMatch(5, 1_700_000_000_000, "p-000001", "duplicate", 2, 0.93, 1.0, True)
    edge = codec.encode(m.Edge((1_700_000_000_001, "p-000123"), 9, (match,), ((5, 1.0),)))
    # head, key, pid, one match (pid, order, kind, distance, similarity, share, by_simhash,
    # the page id's length and bytes), one share
    assert len(edge) == 2 + 20 + 8 + 4 + (8 + 8 + 1 + 4 + 8 + 8 + 1 + 4 + 8) + 4 + 16


def test_the_order_topics_records_keep_their_bytes() -> None:
    """Marks, edges and verdicts have codecs of their own (they are read once a page):
    these are the bytes format version 1 gave them with the field codecs, but for the
    version byte (the second): their layouts have not changed since."""
    match = m.EdgeMatch(5, 1_700_000_000_000, "p-1", "contains", 2, 0.5, 0.25, True)
    cases = {
        m.Mark(7, (1_700_000_000_000, "p-1"), 12.5): (
            "010107000000010068e5cf8b01000003000000702d31010000000000002940"
        ),
        m.Mark(2, None, None): "0101020000000000",
        m.Edge((1_700_000_000_001, "p-2"), 9, (match,), ((5, 0.5),)): (
            "08010168e5cf8b01000003000000702d32090000000000000001000000050000000000000000"
            "68e5cf8b0100000302000000000000000000e03f000000000000d03f0103000000702d310100"
            "00000500000000000000000000000000e03f"
        ),
        m.Verdict((1_700_000_000_001, "p-2"), 9, (5, 6), (5, 1_700_000_000_000, "p-1"),
                  ((6, 3, "q"),)): (
            "09010168e5cf8b01000003000000702d32090000000000000002000000050000000000000006"
            "0000000000000005000000000000000068e5cf8b01000003000000702d310100000006000000"
            "0000000003000000000000000100000071"
        ),
    }  # fmt: skip
    for msg, v1 in cases.items():
        want = v1[:2] + f"{codec.VERSION:02x}" + v1[4:]
        assert codec.encode(msg).hex() == want
        assert codec.decode(bytes.fromhex(want)) == msg


@given(st.text(max_size=30), st.binary(max_size=30), u64, st.integers(1, 512))
def test_partitions_are_stable_and_in_range(host: str, bucket: bytes, pid: int, n: int) -> None:
    for part in (
        m.partition_of_host(host, n),
        m.partition_of_bucket(bucket, n),
        m.partition_of_pid(pid, n),
    ):
        assert 0 <= part < n
    assert m.partition_of_bucket(bucket, n) == zlib.crc32(bucket) % n
    assert m.partition_of_host(host, n) == m.partition_of_host(str(host), n)
