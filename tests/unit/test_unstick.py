"""``Worker.unstick``'s rules, with the consumer, the broker's answers and the clock
faked: ask the broker before acting, read again only what was dropped, and never touch
a partition a rebalance took away while the question was out."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from intervaltree import IntervalTree

from neardup.kafka import app as app_module
from neardup.kafka import faustfix
from neardup.kafka.app import GAP_CHECK_S, STUCK_S, Worker
from neardup.kafka.inorder import Hole


class FakeConsumer:
    def __init__(self, tps: list[str], committed: int, end: int) -> None:
        self.tps = list(tps)
        self._committed_offset = dict.fromkeys(tps, committed)
        self._acked: dict[str, list[int]] = defaultdict(list)
        self._gap: dict[str, IntervalTree] = defaultdict(IntervalTree)
        self._read_offset: dict[str, int] = {}
        # what the real ``stuck_partitions`` reads too: nothing in hand, nothing paused
        self.unacked: list[Any] = []
        self._acked_index: dict[str, set[int]] = {}
        self._paused_partitions: set[str] = set()
        self.end = end
        self.seeks: list[tuple[str, int]] = []
        self.app = SimpleNamespace(consumer_generation_id=1)

    def assignment(self) -> list[str]:
        return list(self.tps)

    def highwater(self, tp: str) -> int:
        return self.end

    async def seek(self, tp: str, offset: int) -> None:
        if tp not in self.tps:
            raise RuntimeError("not assigned")  # aiokafka's IllegalStateError
        self.seeks.append((tp, offset))


class FakeApp:
    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer
        self.rebalancing = False


class FakeAbsent:
    """The broker: ``runs`` answers every question; ``during`` runs while it is out."""

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = runs
        self.asked: list[tuple[str, int, int]] = []
        self.during: Any = None

    async def between(self, topic: str, partition: int, start: int, stop: int) -> Any:
        self.asked.append((topic, start, stop))
        if self.during is not None:
            self.during()
        return self.runs


class TP(str):
    @property
    def topic(self) -> str:
        return str(self)

    @property
    def partition(self) -> int:
        return 0


def _worker(consumer: FakeConsumer, absent: FakeAbsent) -> Worker:
    w = Worker.__new__(Worker)
    w.app = FakeApp(consumer)  # type: ignore[assignment]
    w.stuck, w.present, w.reread = {}, {}, {}
    w.rereads = w.absent_runs = 0
    w.holes, w.seq_next = {}, {}
    w.absent = absent  # type: ignore[assignment]
    return w


def _unstick(w: Worker) -> None:
    """``unstick`` once, then the fetch loop's next fetch, which makes the seeks it asked
    for (``faustfix.seeks_between_fetches``)."""
    asyncio.run(w.unstick())
    asyncio.run(faustfix.make_requested_seeks(w.app.consumer))


def _run(monkeypatch: pytest.MonkeyPatch, w: Worker, why: str, at: list[float], tp: TP) -> None:
    """``unstick`` once at each time in ``at``, the partition held back for ``why``."""
    consumer: Any = w.app.consumer

    def stuck(c: FakeConsumer, idle: Any, left: Any = None) -> dict[TP, tuple[int, str]]:
        at = c._committed_offset[tp]
        if tp not in c.tps or c._gap[tp].overlaps(at):  # (absent: the commit passes)
            return {}
        return {tp: (at, why)}

    monkeypatch.setattr(faustfix, "stuck_partitions", stuck)
    for t in at:
        monkeypatch.setattr(app_module.time, "monotonic", lambda t=t: t)
        _unstick(w)
    assert consumer is w.app.consumer


def test_a_partition_not_fetched_yet_is_asked_about_once_and_never_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])  # 40 is there
    w = _worker(consumer, absent)
    _run(monkeypatch, w, faustfix.UNREAD, [0.0, GAP_CHECK_S, 5.0, STUCK_S + 5, 60.0], tp)
    assert absent.asked == [("raw", 40, 45)]
    assert consumer.seeks == []


def test_a_dropped_message_is_read_again_at_once_if_a_later_one_was_handled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])
    consumer._acked[tp] = [41, 42]
    w = _worker(consumer, absent)
    _run(monkeypatch, w, faustfix.AFTER, [0.0, 0.5, GAP_CHECK_S], tp)
    assert absent.asked == [("raw", 40, 43)]  # up to the last one acknowledged
    assert consumer.seeks == [(tp, 40)] and w.rereads == 1
    _run(monkeypatch, w, faustfix.AFTER, [GAP_CHECK_S + 1, GAP_CHECK_S + 5], tp)
    assert consumer.seeks == [(tp, 40)]  # not again before STUCK_S
    _run(monkeypatch, w, faustfix.AFTER, [GAP_CHECK_S + STUCK_S], tp)
    assert consumer.seeks == [(tp, 40), (tp, 40)]


def test_reading_again_is_left_to_the_fetch_loops_next_fetch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not sought at once: the fetch loop may hold a batch fetched before, whose records
    would move its read offset past the seek (``faustfix.seeks_between_fetches``)."""
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])
    consumer._acked[tp] = [41]
    w = _worker(consumer, absent)
    monkeypatch.setattr(faustfix, "stuck_partitions", lambda c, idle, left=None: {
        tp: (40, faustfix.AFTER)})  # fmt: skip
    for t in (0.0, GAP_CHECK_S):
        monkeypatch.setattr(app_module.time, "monotonic", lambda t=t: t)
        asyncio.run(w.unstick())
    assert consumer.seeks == [] and faustfix.requested_seeks(consumer) == {tp: 40}
    asyncio.run(faustfix.make_requested_seeks(consumer))
    assert consumer.seeks == [(tp, 40)] and faustfix.requested_seeks(consumer) == {}


def test_a_message_read_past_is_read_again_after_stuck_s_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])
    w = _worker(consumer, absent)
    _run(monkeypatch, w, faustfix.READ, [0.0, GAP_CHECK_S, STUCK_S - 1], tp)
    assert consumer.seeks == []
    _run(monkeypatch, w, faustfix.READ, [STUCK_S], tp)
    assert consumer.seeks == [(tp, 40)]


def test_a_sequencer_message_left_past_a_hole_has_it_read_again_however_busy_the_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real ``stuck_partitions``: the sequencer left the message at 43 for being past
    the hole at 40 (``neardup.kafka.inorder``), and the topic's streams are never idle.
    After ``GAP_CHECK_S`` and one question (up to the left message only) the partition
    is read again from 40; the hole stays until a message is taken, so a reading whose
    copy never comes is tried again after ``STUCK_S``."""
    tp = TP("seq")
    consumer, absent = FakeConsumer([tp], 40, 2000), FakeAbsent([])
    consumer._read_offset[tp] = 60
    w = _worker(consumer, absent)
    # (the hole opened long before: still, the rule above reads it again, as the commits
    # show it, not ``_reread_holes`` at once)
    w.seq_next[tp], w.holes[tp] = 40, Hole(40, 43, -STUCK_S)
    monkeypatch.setattr(faustfix, "topic_idle", lambda app, topic: False)
    when = {}
    for t in (0.0, GAP_CHECK_S, GAP_CHECK_S + 1, GAP_CHECK_S + STUCK_S):
        monkeypatch.setattr(app_module.time, "monotonic", lambda t=t: t)
        _unstick(w)
        when[t] = len(consumer.seeks)
    assert when == {0.0: 0, GAP_CHECK_S: 1, GAP_CHECK_S + 1: 1, GAP_CHECK_S + STUCK_S: 2}
    assert absent.asked == [("seq", 40, 44)]
    # (not three: ``_reread_holes`` leaves a hole the commits show to the rule above)
    assert consumer.seeks == [(tp, 40), (tp, 40)] and w.holes == {tp: Hole(40, 43, -STUCK_S)}
    w.holes = {}  # no message left: busy, and read past, it waits (READ, then idle)
    consumer.seeks = []
    w.reread = {}
    for t in (100.0, 100 + GAP_CHECK_S, 100 + STUCK_S + 1):
        monkeypatch.setattr(app_module.time, "monotonic", lambda t=t: t)
        _unstick(w)
    assert consumer.seeks == []


def test_a_rebalance_forgets_what_was_read_again_but_not_the_sequencers_holes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Partitions move: Faust reads them again from their committed offsets. The
    sequencer's holes are forgotten by the revoke and the assignment
    (``test_a_rebalance_forgets_where_the_sequencer_was``), not here: its steps may run
    after the restore, before the rebalance ends, and a hole they open must stay known."""
    tp = TP("seq")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])
    w = _worker(consumer, absent)
    w.reread[tp], w.holes[tp] = (40, 0.0), Hole(40, 43, 0.0)
    w.app.rebalancing = True
    _unstick(w)
    assert w.reread == {} and absent.asked == [] and consumer.seeks == []
    assert w.holes == {tp: Hole(40, 43, 0.0)}


def test_offsets_the_broker_says_are_absent_are_committed_past_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([(40, 41), (43, 44)])
    consumer._acked[tp] = [41, 42, 44]
    w = _worker(consumer, absent)
    _run(monkeypatch, w, faustfix.AFTER, [0.0, GAP_CHECK_S, STUCK_S + 1], tp)
    assert sorted((i.begin, i.end) for i in consumer._gap[tp]) == [(40, 41), (43, 44)]
    assert consumer.seeks == [] and w.absent_runs == 2


def test_a_partition_taken_away_while_the_question_is_out_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("raw")
    consumer, absent = FakeConsumer([tp], 40, 45), FakeAbsent([])
    consumer._acked[tp] = [41]
    absent.during = lambda: consumer.tps.remove(tp)  # a rebalance meanwhile
    w = _worker(consumer, absent)
    _run(monkeypatch, w, faustfix.AFTER, [0.0, GAP_CHECK_S], tp)
    assert absent.asked and consumer.seeks == []


def test_one_question_a_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = TP("a"), TP("b")
    consumer, absent = FakeConsumer([a, b], 40, 45), FakeAbsent([])
    w = _worker(consumer, absent)
    monkeypatch.setattr(
        faustfix,
        "stuck_partitions",
        lambda c, idle, left=None: {tp: (40, faustfix.UNREAD) for tp in (a, b)},
    )
    for t in (0.0, GAP_CHECK_S):
        monkeypatch.setattr(app_module.time, "monotonic", lambda t=t: t)
        _unstick(w)
    assert len(absent.asked) == 1
    monkeypatch.setattr(app_module.time, "monotonic", lambda: GAP_CHECK_S + 0.2)
    _unstick(w)
    assert sorted(x[0] for x in absent.asked) == ["a", "b"]


def _held(tp: TP) -> tuple[FakeConsumer, FakeAbsent, Worker]:
    """Just after an assignment (nothing taken yet: no ``seq_next``), the sequencer waits
    for offset 41 since t=0, the message at 43 left past it; the commits do not show the
    hole: committed at 40, a commit of 41 in flight, so the real ``stuck_partitions``
    does not name the partition."""
    consumer, absent = FakeConsumer([tp], 40, 2000), FakeAbsent([])
    held: Any = consumer
    held._neardup_committing = {tp: 41}
    w = _worker(consumer, absent)
    w.holes[tp] = Hole(41, 43, 0.0)
    return consumer, absent, w


def _tick(monkeypatch: pytest.MonkeyPatch, w: Worker, at: float) -> None:
    monkeypatch.setattr(app_module.time, "monotonic", lambda: at)
    monkeypatch.setattr(faustfix, "topic_idle", lambda app, topic: True)
    _unstick(w)


def test_a_sequencer_hole_the_commits_do_not_show_is_read_again_after_stuck_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From the offset the sequencer waits for (not the committed one), after one
    question up to the message left, at most once each ``STUCK_S``."""
    tp = TP("seq")
    consumer, absent, w = _held(tp)
    for t in (0.0, GAP_CHECK_S, STUCK_S - 0.5, STUCK_S, STUCK_S + 1, 2 * STUCK_S):
        _tick(monkeypatch, w, t)
    assert absent.asked == [("seq", 41, 44), ("seq", 41, 44)]
    assert consumer.seeks == [(tp, 41), (tp, 41)] and w.rereads == 2


@pytest.mark.parametrize("meanwhile", ["filled", "a new hole", "rebalancing", "taken away"])
def test_a_sequencer_hole_that_changed_while_the_question_was_out_is_not_read_again(
    monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    tp = TP("seq")
    consumer, absent, w = _held(tp)

    def change() -> None:
        if meanwhile == "filled":  # the message at 41 came and was taken
            w.holes = {}
        elif meanwhile == "a new hole":  # ... and then one at 44 opened
            w.holes = {tp: Hole(44, 46, 5.0)}
        elif meanwhile == "rebalancing":
            w.app.rebalancing = True
        else:
            consumer.tps.remove(tp)

    absent.during = change
    _tick(monkeypatch, w, STUCK_S)
    assert absent.asked and consumer.seeks == [] and w.rereads == 0


def test_a_sequencer_hole_the_broker_says_holds_no_message_is_marked_absent_and_read_past(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The messages left past it must come again; ``in_order`` then takes them, the
    offsets below held to hold no message (``faustfix.passed_over``)."""
    tp = TP("seq")
    consumer, absent, w = _held(tp)
    absent.runs = [(41, 43)]
    _tick(monkeypatch, w, STUCK_S)
    assert consumer.seeks == [(tp, 41)]
    assert faustfix.passed_over(consumer, tp, 41, 43)


def test_a_sequencer_hole_is_read_again_without_a_question_if_one_was_asked_this_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One broker question a tick; the fallback does not wait for a tick with none."""
    tp = TP("seq")
    consumer, absent, w = _held(tp)
    monkeypatch.setattr(app_module.time, "monotonic", lambda: STUCK_S)
    asyncio.run(w._reread_holes(STUCK_S, asked=True))
    asyncio.run(faustfix.make_requested_seeks(consumer))  # the fetch loop's next fetch
    assert absent.asked == [] and consumer.seeks == [(tp, 41)]


def test_a_sequencer_hole_the_broker_never_answers_about_is_read_again_after_stuck_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commits show the hole (the real ``stuck_partitions`` names it: AFTER), but the
    broker gives no answer, so the rule above never reads it again; after ``STUCK_S``
    the fallback does, with no question of its own (the rule above asked this tick)."""
    tp = TP("seq")
    consumer, absent = FakeConsumer([tp], 40, 2000), FakeAbsent([])
    absent.runs = None  # type: ignore[assignment]
    w = _worker(consumer, absent)
    w.seq_next[tp], w.holes[tp] = 40, Hole(40, 43, 0.0)
    seeks = {}
    for t in (0.0, GAP_CHECK_S, GAP_CHECK_S + 1, STUCK_S - 0.5, STUCK_S, STUCK_S + 1):
        _tick(monkeypatch, w, t)
        seeks[t] = len(consumer.seeks)
    assert seeks == {0.0: 0, GAP_CHECK_S: 0, GAP_CHECK_S + 1: 0, STUCK_S - 0.5: 0,
                     STUCK_S: 1, STUCK_S + 1: 1}  # fmt: skip
    assert consumer.seeks == [(tp, 40)]
    assert len(absent.asked) == 5  # the rule above's, each tick from GAP_CHECK_S
