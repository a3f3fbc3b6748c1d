"""The worker's agents in Faust's test context: memory store, no broker.

Each test builds its own ``Worker`` (its own app id) and replaces its ``send`` and
``flush`` with recorders, so that what the agents publish, and in which order relative to
the changelog flush, can be read back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from neardup.config import EngineConfig
from neardup.contract import parse_raw, validate
from neardup.engine import Analysed, Engine, Stats
from neardup.kafka import faustfix, wire
from neardup.kafka.app import Worker
from neardup.kafka.inorder import Hole
from neardup.kafka.stage import analyse_messages, backlogged, drained
from neardup.records import Rejected
from neardup.settings import Settings
from neardup.store import MemoryKV
from tests.corpus import line
from tests.gold import gold_stream

PDF = {
    "url": "https://files.example.cn/report.pdf",
    "fetched_at": "2026-03-01T08:30:00Z",
    "content_type": "application/pdf",
    "body_b64": "JVBERi0xLjQKJcfsj6IKNSAwIG9iago8PC9MZW5ndGggNiAwIFI+PgpzdHJlYW0K",
}


class Recorder:
    """Stands in for the worker's ``send`` and ``flush``; remembers the calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes | None, bytes]] = []
        self.partitions: list[int | None] = []

    def take(self, suffix: str) -> list[tuple[int | None, bytes]]:
        """The calls to topics ending in ``suffix``, with their partitions; forgets them."""
        picked = [
            (p, v)
            for (t, _, v), p in zip(self.calls, self.partitions, strict=True)
            if t.endswith(suffix)
        ]
        kept = [
            (c, p)
            for c, p in zip(self.calls, self.partitions, strict=True)
            if not c[0].endswith(suffix)
        ]
        self.calls = [c for c, _ in kept]
        self.partitions = [p for _, p in kept]
        return picked

    async def send(
        self, topic: Any, key: bytes | None, value: bytes, partition: int | None = None
    ) -> None:
        self.calls.append((topic.get_topic_name(), key, value))
        self.partitions.append(partition)

    async def flush(self) -> None:
        self.calls.append(("<flush>", None, b""))
        self.partitions.append(None)

    def values(self, suffix: str) -> list[bytes]:
        return [v for t, _, v in self.calls if t.endswith(suffix)]


def _worker(
    tmp_path: Path, partitions: int = 1, topology: str = "sequential"
) -> tuple[Worker, Recorder]:
    settings = Settings(
        state_dir=str(tmp_path),
        app_id=f"agents-{uuid.uuid4().hex[:8]}",
        partitions=partitions,
        topology=topology,  # type: ignore[arg-type]
    )
    worker = Worker(settings, store="memory://", serve_http=False)
    rec = Recorder()
    worker.send = rec.send
    worker.flush = rec.flush
    return worker, rec


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for ``condition`` (agents that take batches answer a little later)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def sequenced(rec: Recorder) -> list[bytes]:
    """The pages the analyse agent sent the sequencer (a batch's pages go framed as one
    message)."""
    return [item for v in rec.values("sequencer") for item in wire.unframe(v)]


async def analysed(rec: Recorder, n: int) -> None:
    """Wait for the analyse agent to have forwarded or dead-lettered ``n`` pages (it takes
    them in batches: a page put may be handled after ``put`` returns)."""
    await until(
        lambda: len(sequenced(rec)) + len(rec.values("rejected-pages")) == n,
        f"{n} pages analysed",
    )


def test_analyse_forwards_pages_with_their_offsets_and_dead_letters_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker, rec = _worker(tmp_path, partitions=2)
    pages = gold_stream()[0][:2]
    bad = [b"{not json", line({**pages[0], "body_b64": "@@@", "html": None}).encode()]
    bad_b64 = dict(pages[0])
    bad_b64.pop("html", None)
    bad_b64["body_b64"] = "not base64!"

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            for p in pages:
                await agent.put(value=line(p).encode(), key=b"k", partition=1)
            await agent.put(value=bad[0], key=b"k", partition=1)
            await agent.put(value=line(bad_b64).encode(), key=b"k", partition=1)
            await agent.put(value=line(PDF).encode(), key=b"k", partition=1)
            await analysed(rec, len(pages) + 3)

    with caplog.at_level(logging.INFO, logger="neardup.kafka"):
        run(go)
    forwarded = [wire.decode(v) for v in sequenced(rec)]
    assert [type(m) for m in forwarded] == [wire.PageMsg, wire.PageMsg]
    assert [(m.partition, m.offset) for m in forwarded if isinstance(m, wire.PageMsg)] == [
        (1, 0),
        (1, 1),
    ]
    rejected = [json.loads(v) for v in rec.values("rejected-pages")]
    assert [r["reason"] for r in rejected] == ["bad_json", "bad_base64", "not_html"]
    for r in rejected:
        assert validate("rejected", r) == []
    # the structured log line says where the message was
    logged = [r.getMessage() for r in caplog.records if "page rejected" in r.getMessage()]
    assert len(logged) == 3
    assert all("partition=1" in m and "offset=" in m and "topic=" in m for m in logged)


def test_a_batch_of_pages_goes_to_the_sequencer_framed_in_order(tmp_path: Path) -> None:
    """Pages taken in one batch reach the sequencer as one framed message, in their
    order, each with its offset; a dead letter among them goes out on its own."""
    worker, rec = _worker(tmp_path)
    pages = gold_stream()[0][:6]
    values = [line(p).encode() for p in pages]
    values.insert(2, b"{not json")

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            for v in values:
                await agent.put(value=v, key=b"k", partition=0, wait=False)
            await analysed(rec, len(values))

    run(go)
    assert len(rec.values("sequencer")) < len(pages)
    forwarded = [wire.decode(v) for v in sequenced(rec)]
    offsets = [m.offset for m in forwarded if isinstance(m, wire.PageMsg)]
    assert offsets == [0, 1, 3, 4, 5, 6]
    assert [json.loads(v)["reason"] for v in rec.values("rejected-pages")] == ["bad_json"]


def test_sequence_decides_like_the_engine_and_flushes_before_publishing(tmp_path: Path) -> None:
    worker, rec = _worker(tmp_path)
    cfg = EngineConfig()
    pages = gold_stream()[0]
    engine = Engine(MemoryKV(), cfg)
    want = []
    for p in pages:
        out = engine.process(parse_raw(line(p), cfg.max_bytes))
        assert not isinstance(out, Rejected)
        want.append({k: v for k, v in out.decision.items() if k != "decided_at"})

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            for p in pages:
                await agent.put(value=line(p).encode(), key=b"k", partition=0)
            await analysed(rec, len(pages))
        forwarded = rec.values("sequencer")
        async with worker.sequence_agent.test_context() as agent:
            for v in forwarded:
                await agent.put(value=v, partition=0)
            # each page goes once a later one has come; the last waits for partition 0
            # to be drained
            await until(lambda: len(rec.values("decisions")) == len(pages) - 1, "decisions")
            marks = wire.MarksMsg(1, (wire.Mark(0, len(pages)),))
            await agent.put(value=wire.encode(marks), partition=0)
            await until(lambda: len(rec.values("decisions")) == len(pages), "the last decision")

    run(go)
    decisions = [json.loads(v) for v in rec.values("decisions")]
    assert [{k: v for k, v in d.items() if k != "decided_at"} for d in decisions] == want
    for d in decisions:
        assert validate("decision", d) == []
    first_decision = next(i for i, c in enumerate(rec.calls) if c[0].endswith("decisions"))
    assert rec.calls[first_decision - 1][0] == "<flush>"


def test_a_redelivered_page_gets_its_stored_decision_and_no_other(tmp_path: Path) -> None:
    worker, rec = _worker(tmp_path)
    msg = gold_stream()[0][0]

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            await agent.put(value=line(msg).encode(), key=b"k", partition=0)
            await analysed(rec, 1)
        (page_msg,) = rec.values("sequencer")
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=page_msg, partition=0)
            await agent.put(value=wire.encode(wire.MarksMsg(1, (wire.Mark(0, 1),))), partition=0)
            await until(lambda: len(rec.values("decisions")) == 1, "the decision")
            await agent.put(value=page_msg, partition=0)  # at-least-once: delivered again
            await until(lambda: len(rec.values("decisions")) == 2, "the stored decision")

    run(go)
    decisions = rec.values("decisions")
    assert len(decisions) == 2 and decisions[0] == decisions[1]
    assert json.loads(decisions[0])["decision"] == "unique"


def test_sequencer_messages_past_a_dropped_one_wait_for_it_to_be_read_again(
    tmp_path: Path,
) -> None:
    """The sequencer takes its partition in offset order. Here the message at offset 1
    (the first page, from raw partition 1) is dropped on the way, and the marks at
    offset 2 come first: taken then, they would release the copy (raw partition 0, a
    later fetch time) before the page it copies, and the copy would come out unique. The
    marks are left instead, and when the partition is read again from offset 1 the pages
    are decided in fetch-time order, as with no drop."""
    worker, rec = _worker(tmp_path, partitions=2)
    msgs, labels = gold_stream()
    first = msgs[0]
    copy = next(
        m
        for m, lab in zip(msgs, labels, strict=True)
        if lab["story"] == labels[0]["story"] and lab["kind"] == "copy"
    )
    cfg = EngineConfig()
    (a_first,) = analyse_messages([line(first).encode()], cfg, Stats())
    (a_copy,) = analyse_messages([line(copy).encode()], cfg, Stats())
    assert isinstance(a_first, Analysed) and isinstance(a_copy, Analysed)
    assert a_first.order < a_copy.order
    messages = [
        wire.encode(wire.PageMsg(0, 0, 2, a_copy)),
        wire.encode(wire.PageMsg(1, 0, 2, a_first)),
        wire.encode(wire.MarksMsg(2, (wire.Mark(0, 1), wire.Mark(1, 1)))),
    ]

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=messages[0], partition=0)
            agent.sent_offset = 2  # offset 1 dropped
            await agent.put(value=messages[2], partition=0)
            await until(
                lambda: worker.out_of_order == 1 or bool(rec.values("decisions")),
                "the marks left or taken",
            )
            assert rec.values("decisions") == []  # the marks were not taken
            agent.sent_offset = 1  # read again from the hole
            await agent.put(value=messages[1], partition=0)
            await agent.put(value=messages[2], partition=0)
            await until(lambda: len(rec.values("decisions")) == 2, "both decisions")

    run(go)
    decided = [json.loads(v) for v in rec.values("decisions")]
    assert [d["page_id"] for d in decided] == [a_first.page.page_id, a_copy.page.page_id]
    assert decided[0]["decision"] == "unique"
    assert decided[1]["decision"] == "duplicate"
    assert decided[1]["duplicate_of"] == a_first.page.page_id
    assert worker.seq_next == {TP(worker.names.sequence, 0): 3}


def _marks2() -> bytes:
    return wire.encode(wire.MarksMsg(2, (wire.Mark(0, 1), wire.Mark(1, 1))))


def _one_page(tmp_path: Path) -> tuple[Worker, Recorder, TP, bytes, bytes]:
    """A worker with one raw partition; the sequencer's partition; a page from the raw
    partition, and marks that drain it."""
    worker, rec = _worker(tmp_path, partitions=1)
    (a,) = analyse_messages([line(gold_stream()[0][0]).encode()], EngineConfig(), Stats())
    assert isinstance(a, Analysed)
    page = wire.encode(wire.PageMsg(0, 0, 1, a))
    marks = wire.encode(wire.MarksMsg(1, (wire.Mark(0, 1),)))
    return worker, rec, TP(worker.names.sequence, 0), page, marks


def _sequence_one_at(worker: Worker, offset: int) -> None:
    """Marks at ``offset`` of the sequencer topic, the only message; until taken or left."""
    tp = TP(worker.names.sequence, 0)

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            agent.sent_offset = offset
            await agent.put(value=_marks2(), partition=0)
            await until(lambda: worker.out_of_order == 1 or tp in worker.seq_next, "left or taken")

    run(go)


def test_the_first_sequencer_message_after_an_assignment_is_checked_against_the_commit(
    tmp_path: Path,
) -> None:
    """The CI fault's path: just assigned, the partition committed at 2, and the message
    at 3 comes first: it is left, to be read again from 2."""
    worker, _ = _worker(tmp_path, partitions=2)
    tp = TP(worker.names.sequence, 0)
    worker.app.consumer._committed_offset[tp] = 2
    _sequence_one_at(worker, 3)
    assert worker.out_of_order == 1 and worker.seq_next == {}
    assert worker.holes[tp][:2] == (2, 3)  # waiting for 2, 3 left


def test_offsets_known_to_hold_no_message_are_passed_over(tmp_path: Path) -> None:
    """Offsets 2 to 4 known absent (retention): the message at 5 comes next. (Left, it
    would be left again at every reading from 2: the partition would stall.)"""
    worker, _ = _worker(tmp_path, partitions=2)
    tp = TP(worker.names.sequence, 0)
    worker.app.consumer._committed_offset[tp] = 2
    worker.app.consumer._gap[tp].addi(2, 5)
    _sequence_one_at(worker, 5)
    assert worker.seq_next == {tp: 6} and worker.out_of_order == 0


def test_a_copy_of_a_sequencer_message_taken_already_is_not_taken_again(tmp_path: Path) -> None:
    worker, rec, tp, page, marks = _one_page(tmp_path)

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=page, partition=0)  # 0
            await agent.put(value=marks, partition=0)  # 1
            await until(lambda: len(rec.values("decisions")) == 1, "decided")
            agent.sent_offset = 0  # read again from 0
            await agent.put(value=page, partition=0)
            await agent.put(value=marks, partition=0)
            await agent.put(value=marks, partition=0)  # 2: the next one
            await until(lambda: worker.seq_next.get(tp) == 3, "2 taken")

    run(go)
    assert len(rec.values("decisions")) == 1  # taken again, it would be sent again


def test_a_new_hole_after_one_filled_is_logged_and_read_again_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hole at 1, filled by a reading this worker did not ask for; then a hole at 4:
    the hole is forgotten when the first is filled and the second recorded (for
    ``unstick``), and both are logged."""
    worker, _ = _worker(tmp_path, partitions=2)
    tp = TP(worker.names.sequence, 0)

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=_marks2(), partition=0)  # 0
            agent.sent_offset = 2
            await agent.put(value=_marks2(), partition=0)  # 2: left
            await until(lambda: worker.out_of_order == 1, "left")
            agent.sent_offset = 1
            for _ in range(3):  # 1, 2, 3
                await agent.put(value=_marks2(), partition=0)
            await until(lambda: worker.seq_next.get(tp) == 4, "taken through 3")
            assert worker.holes == {}  # the hole is filled
            agent.sent_offset = 5  # 4 dropped
            await agent.put(value=_marks2(), partition=0)  # 5: left
            await until(lambda: worker.out_of_order == 2, "left again")

    with caplog.at_level(logging.WARNING, logger="neardup.kafka"):
        run(go)
    assert worker.holes[tp][:2] == (4, 5)
    assert len([r for r in caplog.records if "came before" in r.getMessage()]) == 2


def test_with_no_commit_yet_a_message_below_the_first_taken_is_taken_late(
    tmp_path: Path,
) -> None:
    """No committed offset (or 0, which Faust keeps as none): where reading began is not
    known, so the message at 3 after the one at 5 is taken late, not passed over as a
    copy, and the order goes on from 6."""
    worker, rec, tp, page, marks = _one_page(tmp_path)

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            agent.sent_offset = 5
            await agent.put(value=marks, partition=0)  # 5: taken first
            await until(lambda: tp in worker.seq_next, "taken")
            agent.sent_offset = 3
            await agent.put(value=page, partition=0)  # 3: taken late
            agent.sent_offset = 6
            await agent.put(value=marks, partition=0)
            await until(lambda: worker.seq_next.get(tp) == 7, "6 taken")
            await until(lambda: len(rec.values("decisions")) == 1, "the page decided")

    run(go)
    assert worker.out_of_order == 0


def test_a_rebalance_forgets_where_the_sequencer_was(tmp_path: Path) -> None:
    """After a revoke or an assignment the next offset is the committed one again (the
    stage was unloaded: what it took is taken again)."""
    worker, _ = _worker(tmp_path, partitions=2)
    tp = TP(worker.names.sequence, 0)

    async def go() -> None:
        for signal in (worker._on_assigned, worker._on_revoked):
            worker.seq_next[tp], worker.seq_start[tp] = 7, 3
            worker.holes[tp] = Hole(7, 9, 0.0)
            await signal(None)
            assert worker.seq_next == worker.seq_start == worker.holes == {}

    run(go)


def test_an_undecodable_sequencer_message_is_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker, rec = _worker(tmp_path)

    async def go() -> None:
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=b'{"v": 99}', partition=0)
            await until(lambda: any("undecodable" in r.getMessage() for r in caplog.records), "log")

    with caplog.at_level(logging.ERROR, logger="neardup.kafka"):
        run(go)
    assert rec.calls == []
    (record,) = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert "partition=0" in record.getMessage() and "offset=0" in record.getMessage()


def test_marks_are_made_for_partitions_committed_to_their_end() -> None:
    marks, lag = drained(
        ends={0: 10, 1: 5, 2: 0, 3: 7, 4: None},
        committed={0: 10, 1: 3, 2: None, 3: None, 4: 1},
        earliest={2: 0, 3: 2},
    )
    assert marks == [wire.Mark(0, 10), wire.Mark(2, 0)]
    assert lag == {0: 0, 1: 2, 2: 0, 3: 5}


def test_raw_pages_wait_from_above_the_backlog_limit_until_half_of_it() -> None:
    assert [backlogged(lag, False, 100) for lag in (0, 100, 101)] == [False, False, True]
    assert [backlogged(lag, True, 100) for lag in (101, 51, 50, 0)] == [True, True, False, False]
    assert not backlogged(10**9, False, 0) and not backlogged(10**9, True, 0)


class _BacklogConsumer:
    """What ``Worker.admit`` asks of Faust's consumer: the sequencer topic's end offset
    and its committed offset, and the raw partitions to pause."""

    def __init__(self, worker: Worker, end: int, committed: int | None) -> None:
        from faust.types import TP

        self.end, self.earliest = end, 0
        self.seq = TP(worker.names.sequence, 0)
        self.raw = {TP(worker.names.raw, p) for p in range(3)}
        self.other = TP("elsewhere", 0)
        self.paused: set[Any] = set()
        self._committed_offset = {TP(worker.names.raw, 0): 5, self.seq: committed}
        self.sought: dict[Any, int] = {}
        self.assigned_seq = True
        self.app = SimpleNamespace(consumer_generation_id=1)

    def _new_topicpartition(self, topic: str, partition: int) -> Any:
        from faust.types import TP

        return TP(topic, partition)

    def assignment(self) -> set[Any]:
        return self.raw | {self.other} | ({self.seq} if self.assigned_seq else set())

    async def highwaters(self, *tps: Any) -> dict[Any, int]:
        return {tp: self.end for tp in tps if tp == self.seq}

    async def earliest_offsets(self, *tps: Any) -> dict[Any, int]:
        return {tp: self.earliest for tp in tps}

    async def seek(self, tp: Any, offset: int) -> None:
        self.sought[tp] = offset

    def pause_partitions(self, tps: Any) -> None:
        self.paused |= set(tps)

    def resume_partitions(self, tps: Any) -> None:
        self.paused -= set(tps)


def test_a_worker_pauses_its_raw_partitions_while_the_sequencer_is_behind(
    tmp_path: Path,
) -> None:
    worker, _ = _worker(tmp_path, partitions=3)
    consumer = _BacklogConsumer(worker, end=2500, committed=400)
    worker.app.consumer = consumer  # type: ignore[assignment]

    async def go() -> None:
        await worker.admit()  # 2,100 waiting > 2,000: pause
        assert consumer.paused == consumer.raw and worker.paused and worker.backlog == 2100
        consumer._committed_offset[consumer.seq] = (
            1400  # 1,100 waiting: above half the limit, still paused
        )
        await worker.admit()
        assert consumer.paused == consumer.raw
        consumer._committed_offset[consumer.seq] = (
            1500  # 1,000: resume, reading again from the committed offsets
        )
        assert consumer.sought == {}
        await worker.admit()
        assert consumer.paused == set() and not worker.paused
        assert consumer.sought == {}  # made by the fetch loop before its next fetch:
        await faustfix.make_requested_seeks(consumer)
        assert consumer.sought == {tp: 5 if tp.partition == 0 else 0 for tp in consumer.raw}
        consumer._committed_offset[consumer.seq] = 400
        await worker.admit()  # 2,100 again: paused
        assert consumer.paused == consumer.raw
        consumer.assigned_seq = False  # the sequencer moved to another worker: resume
        await worker.admit()
        assert consumer.paused == set() and worker.backlog == 0

    run(go)
    assert worker.pauses == 2
    metrics = worker.metrics.render().decode()
    assert "neardup_raw_pauses_total 2.0" in metrics
    assert "neardup_raw_paused 0.0" in metrics and "neardup_sequencer_backlog 0.0" in metrics


def test_a_resume_across_a_rebalance_leaves_the_reading_again_to_the_rebalance(
    tmp_path: Path,
) -> None:
    """The rebalance seeks every partition to its committed offset itself; a seek asked
    for after it, from offsets looked up before, would come after that one."""
    worker, _ = _worker(tmp_path, partitions=3)
    consumer = _BacklogConsumer(worker, end=2500, committed=1500)  # 1,000: resume
    worker.app.consumer = consumer  # type: ignore[assignment]
    worker.paused = True
    looked_up = consumer.earliest_offsets

    async def earliest_during_a_rebalance(*tps: Any) -> dict[Any, int]:
        worker.app.consumer_generation_id += 1
        return await looked_up(*tps)

    consumer.earliest_offsets = earliest_during_a_rebalance  # type: ignore[method-assign]
    run(worker.admit)
    assert consumer.paused == set() and not worker.paused
    assert faustfix.requested_seeks(consumer) == {} and consumer.sought == {}


def test_the_metrics_say_what_the_bounds_dropped(tmp_path: Path) -> None:
    worker, _ = _worker(tmp_path)
    worker.stage.engine.index.capped["strings"] = 5
    worker.stage.engine.templates.hosts_evicted = 3
    metrics = worker.metrics.render().decode()
    assert 'neardup_index_capped{part="strings"} 5.0' in metrics
    assert "neardup_template_hosts_dropped_total 3.0" in metrics


def test_paused_raw_pages_wait_unanalysed_then_go_on(tmp_path: Path) -> None:
    worker, rec = _worker(tmp_path)
    worker.paused = True

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            put = asyncio.ensure_future(agent.put(value=line(gold_stream()[0][0]).encode()))
            await asyncio.sleep(0.5)
            assert rec.values("sequencer") == [] and worker.analyse_stats.pages == 0
            worker.paused = False
            await put
            await until(lambda: len(rec.values("sequencer")) == 1, "the page forwarded")

    run(go)


def test_exactly_once_is_refused_with_a_reason(tmp_path: Path) -> None:
    settings = Settings(state_dir=str(tmp_path), processing_guarantee="exactly_once")
    with pytest.raises(SystemExit, match="at_least_once"):
        Worker(settings, store="memory://", serve_http=False)


def test_routed_agents_probe_buckets_by_key_and_decide_like_the_engine(tmp_path: Path) -> None:
    worker, rec = _worker(tmp_path, partitions=3, topology="routed")
    cfg = EngineConfig()
    pages = gold_stream()[0]
    engine = Engine(MemoryKV(), cfg)
    want = []
    for p in pages:
        out = engine.process(parse_raw(line(p), cfg.max_bytes))
        assert not isinstance(out, Rejected)
        want.append({k: v for k, v in out.decision.items() if k != "decided_at"})

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            for p in pages:
                await agent.put(value=line(p).encode(), key=b"k", partition=0)
            await analysed(rec, len(pages))
        inbox = [v for _, v in rec.take("sequencer")]
        inbox.append(wire.encode(wire.MarksMsg(3, tuple(wire.Mark(p, 10_000) for p in range(3)))))
        async with (
            worker.sequence_agent.test_context() as seq,
            worker.probe_agent.test_context() as probe,
            worker.records_agent.test_context() as records,
        ):
            # carry each message the agents send to the agent of its topic, until the last
            # page is decided
            deadline = asyncio.get_running_loop().time() + 60
            while len(rec.values("decisions")) < len(pages):
                assert asyncio.get_running_loop().time() < deadline, "the pages never decided"
                for v in inbox:
                    await seq.put(value=v, partition=0)
                for p, v in rec.take("probes"):
                    assert p is not None and 0 <= p < 3
                    await probe.put(value=v, partition=p)
                for p, v in rec.take("records"):
                    assert p is not None and 0 <= p < 3
                    await records.put(value=v, partition=p)
                await asyncio.sleep(0.02)
                inbox = [v for _, v in rec.take("sequencer")]

    run(go)
    decisions = [json.loads(v) for v in rec.values("decisions")]
    assert [{k: v for k, v in d.items() if k != "decided_at"} for d in decisions] == want


def test_the_state_gate_holds_steps_back_until_reopened_and_waits_for_those_under_way() -> None:
    from neardup.kafka.app import StateGate

    async def go() -> None:
        gate = StateGate(timeout=5.0)
        inside, leave, order = asyncio.Event(), asyncio.Event(), []

        async def step(name: str, hold: bool = False) -> None:
            async with gate.step():
                order.append(f"{name} in")
                if hold:
                    inside.set()
                    await leave.wait()
                order.append(f"{name} out")

        first = asyncio.create_task(step("first", hold=True))
        await inside.wait()
        closing = asyncio.create_task(gate.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # the step under way still runs
        second = asyncio.create_task(step("second"))
        await asyncio.sleep(0.05)
        assert order == ["first in"]  # the gate is closed: the second step waits
        leave.set()
        await closing
        await first
        assert order == ["first in", "first out"] and not second.done()
        gate.open()
        await second
        assert order == ["first in", "first out", "second in", "second out"]

        stuck = asyncio.create_task(step("stuck", hold=True))
        inside.clear()
        leave.clear()
        await inside.wait()
        gate.timeout = 0.05
        with pytest.raises(RuntimeError, match="did not finish within"):
            await gate.close()
        leave.set()
        await stuck

    run(go)


def test_a_step_woken_by_the_gate_and_closed_out_again_before_it_ran_waits_again() -> None:
    from neardup.kafka.app import StateGate

    async def go() -> None:
        gate = StateGate(timeout=5.0)
        await gate.close()
        entered: list[str] = []

        async def step() -> None:
            async with gate.step():
                entered.append("in")

        task = asyncio.create_task(step())
        await asyncio.sleep(0.01)  # waiting at the closed gate
        gate.open()
        await gate.close()  # before the woken step ran: it must not start now
        for _ in range(5):
            await asyncio.sleep(0)
        assert entered == [] and not task.done()
        gate.open()
        await asyncio.wait_for(task, 5)
        assert entered == ["in"]

    run(go)


def test_a_restore_overtaken_by_another_rebalance_does_not_reopen_the_gate(
    tmp_path: Path,
) -> None:
    """Faust's recovery says complete at the end of a restore even when partitions were
    revoked again meanwhile: the gate opens only at the end of the latest one."""
    worker, _ = _worker(tmp_path)
    restart = worker.app.tables.recovery.signal_recovery_start

    async def go() -> None:
        await worker._on_revoked(None)
        await worker._on_rebalance_complete(None)  # revoked again before this restore ended
        assert not worker.gate.is_open and not worker.ready
        await worker._on_assigned(None)
        restart.set()  # assigned again, its restore not begun
        await worker._on_rebalance_complete(None)
        assert not worker.gate.is_open
        restart.clear()  # that restore began, and now ends
        await worker._on_rebalance_complete(None)
        assert worker.gate.is_open and worker.ready

    run(go)


def test_no_ack_for_messages_of_revoked_partitions_or_of_an_older_generation() -> None:
    from faust.types import TP

    from neardup.kafka import faustfix

    kept, gone = TP("raw", 0), TP("raw", 1)

    class Message:
        def __init__(self, tp: TP, generation_id: int) -> None:
            self.tp, self.generation_id, self.refs = tp, generation_id, 0

        def incref(self) -> None:
            self.refs += 1

    class Event:
        def __init__(self, tp: TP, generation_id: int = 7) -> None:
            self.message = Message(tp, generation_id)

    now = {kept, gone}

    class Consumer:
        def assignment(self) -> set[TP]:
            return set(now)

    class App:
        consumer = Consumer()
        consumer_generation_id = 7

    acked: list[TP] = []

    class Stream:
        app = App()

        async def ack(self, event: Event) -> None:
            acked.append(event.message.tp)

    async def handle(events: list[Any]) -> None:
        now.discard(gone)  # a revoke while the step ran

    # the last was fetched before a rebalance that gave its partition back: read again
    events = [Event(kept), Event(gone), Event(kept), Event(kept, generation_id=6)]
    run(lambda: faustfix.acked_when_done(Stream(), events, handle))
    assert acked == [kept, kept]
    assert all(e.message.refs == 1 for e in events)


def test_a_revoke_waits_for_the_sequencer_step_then_flushes_the_changelog_then_unloads(
    tmp_path: Path,
) -> None:
    """Faust restores assigned tables from their changelogs right after a revoke: a
    sequencer step still writing then, or records not yet flushed, would be undone by the
    replay (the bug this guards against lost pages at a rebalance)."""
    worker, rec = _worker(tmp_path)
    msg = gold_stream()[0][0]
    order: list[str] = []
    in_flush, release = asyncio.Event(), asyncio.Event()

    async def slow_flush() -> None:  # the sequencer's flush before it publishes
        order.append("step flushes")
        in_flush.set()
        await release.wait()

    async def flush_changelog(*, wait: bool) -> None:
        order.append(f"changelog flushed (wait={wait})")

    unload = worker.stage.unload

    def unloaded() -> None:
        order.append("unloaded")
        unload()

    async def go() -> None:
        async with worker.analyse_agent.test_context() as agent:
            await agent.put(value=line(msg).encode(), key=b"k", partition=0)
            await analysed(rec, 1)
        (page_msg,) = rec.values("sequencer")
        worker.flush = slow_flush
        worker.flush_changelog = flush_changelog  # type: ignore[method-assign]
        worker.stage.unload = unloaded  # type: ignore[method-assign]
        async with worker.sequence_agent.test_context() as agent:
            await agent.put(value=page_msg, partition=0)
            await agent.put(value=wire.encode(wire.MarksMsg(1, (wire.Mark(0, 1),))), partition=0)
            await asyncio.wait_for(in_flush.wait(), 30)
            revoke = asyncio.create_task(worker._on_revoked(None))
            await asyncio.sleep(0.1)
            assert not revoke.done() and "unloaded" not in order
            release.set()
            await asyncio.wait_for(revoke, 30)
            assert not worker.gate.is_open
            await worker._on_assigned(None)
            await worker._on_rebalance_complete(None)
            assert worker.gate.is_open

    run(go)
    assert order.index("unloaded") > order.index("changelog flushed (wait=True)")
    assert order.index("changelog flushed (wait=True)") > order.index("step flushes")
    assert len(rec.values("decisions")) == 1  # the step finished: its decision went out
