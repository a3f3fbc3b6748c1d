"""The worker's fixes of Faust's consumer (``neardup.kafka.faustfix``): never commit a
message that no agent handled."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from intervaltree import IntervalTree

from neardup.kafka.faustfix import strict_commits


class _Consumer:
    """The state ``Consumer._new_offset`` reads, for one partition."""

    def __init__(self, committed: int | None, acked: list[int]) -> None:
        self._acked: dict[str, list[int]] = {"tp": list(acked)}
        self._acked_index: dict[str, set[int]] = {"tp": set(acked)}
        self._gap: dict[str, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: dict[str, int | None] = {"tp": committed}
        self._unacked_messages: set[Any] = set()
        self.app = type("App", (), {"consumer_generation_id": 7})()

    def deliver(self, offset: int, generation: int = 7) -> None:
        """A message handed to the streams and not acknowledged yet."""
        message = type("M", (), {"tp": "tp", "offset": offset, "acked": False})()
        message.generation_id = generation
        self._unacked_messages.add(message)


def _new_offset(consumer: _Consumer) -> int | None:
    from faust.transport.consumer import Consumer

    strict_commits()
    fn: Any = Consumer._new_offset
    return fn(consumer, "tp")  # type: ignore[no-any-return]


def test_the_message_at_the_committed_offset_must_be_acknowledged_first() -> None:
    # 10 was committed (next to read is 10); 11 and 12 are acked, 10 is not: Faust's own
    # check (min - committed > 1) let this through and committed 13, past 10
    assert _new_offset(_Consumer(10, [11, 12])) is None
    assert _new_offset(_Consumer(10, [10, 11, 12, 14])) == 13


def test_a_run_after_the_first_commit_and_gaps_of_compacted_topics() -> None:
    c = _Consumer(10, [12, 13])
    c._gap["tp"].addi(10, 12)  # offsets 10 and 11 do not exist in the topic
    assert _new_offset(c) == 14
    assert _new_offset(_Consumer(None, [3, 4, 7])) == 5  # no commit yet: as Faust does


def test_with_no_commit_yet_a_message_still_in_hand_below_the_acknowledged_holds() -> None:
    # nothing committed on the partition yet: 4 and 5 are acknowledged while 3, read
    # before them, is still being handled; taking min(acked) as the start committed 6
    c = _Consumer(None, [4, 5])
    c.deliver(3)
    assert _new_offset(c) is None
    c = _Consumer(None, [4, 5])
    c.deliver(3, generation=6)  # fetched before a rebalance: read again, not waited for
    c.deliver(8)  # above the run: does not hold it
    assert _new_offset(c) == 6


class _Held:
    """A message as a stream holds it: one reference of its own."""

    tp, generation_id = ("raw", 0), 1

    def __init__(self, offset: int = 0) -> None:
        self.offset, self.refcount = offset, 1

    def incref(self) -> None:
        self.refcount += 1


class _HeldEvent:
    def __init__(self, offset: int = 0) -> None:
        self.message = _Held(offset)


class _HeldConsumer:
    def __init__(self, events: list[_HeldEvent]) -> None:
        self._unacked_messages = {e.message for e in events}

    def assignment(self) -> set[tuple[str, int]]:
        return {("raw", 0)}


class _HeldStream:
    """What ``acked_when_done`` uses of a stream: its app's consumer, and ``ack``."""

    def __init__(self, events: list[_HeldEvent]) -> None:
        self.app = SimpleNamespace(consumer=_HeldConsumer(events), consumer_generation_id=1)

    async def ack(self, event: _HeldEvent) -> None:
        event.message.refcount -= 1


def test_a_batch_cancelled_halfway_stays_unacknowledged() -> None:
    """take_events acknowledges its batch in a ``finally`` even when the handler was
    cancelled; the extra reference keeps those messages from being committed."""
    from neardup.kafka.faustfix import acked_when_done

    async def handled(events: list[Any]) -> None:
        await asyncio.sleep(0)

    async def cancelled(events: list[Any]) -> None:
        raise asyncio.CancelledError

    done, stopped = [_HeldEvent(), _HeldEvent()], [_HeldEvent(), _HeldEvent()]

    async def go() -> None:
        stream = _HeldStream(done + stopped)
        await acked_when_done(stream, done, handled)
        with contextlib.suppress(asyncio.CancelledError):
            await acked_when_done(stream, stopped, cancelled)
        for event in done + stopped:  # what take_events' ``finally`` then does
            await stream.ack(event)

    asyncio.run(go())
    assert [e.message.refcount for e in done] == [0, 0]  # acknowledged, committable
    assert [e.message.refcount for e in stopped] == [1, 1]  # still referenced, not committed


# -- the other fixes of neardup.kafka.faustfix ---------------------------------------------


class _Topics:
    def acks_enabled_for(self, topic: str) -> bool:
        return True


class _App:
    topics = _Topics()


class _Message:
    def __init__(self, offset: int, *, tracked: bool) -> None:
        self.tp, self.topic, self.offset = "tp", "raw", offset
        self.tracked, self.acked = tracked, False


class _Acking:
    """The state ``Consumer.ack`` reads and writes."""

    app = _App()

    def __init__(self) -> None:
        self._committed_offset: dict[str, int | None] = {"tp": 10}
        self._acked: dict[str, list[int]] = defaultdict(list)
        self._acked_index: dict[str, set[int]] = defaultdict(set)
        self._unacked_messages: set[Any] = set()
        self._n_acked = 0
        self._waiting_for_ack = None


def test_a_message_no_stream_took_is_never_acknowledged() -> None:
    """A stream skips a message fetched before a rebalance and acks it: Faust then
    committed it though no agent saw it (a lost page in the SIGKILL tests)."""
    from faust.transport.consumer import Consumer

    from neardup.kafka.faustfix import no_skipped_acks

    no_skipped_acks()
    ack: Any = Consumer.ack
    consumer = _Acking()
    assert ack(consumer, _Message(10, tracked=False)) is False
    assert consumer._acked["tp"] == []
    assert ack(consumer, _Message(11, tracked=True)) is True
    assert consumer._acked["tp"] == [11]
    # and the commit waits for 10, which is read again after the rebalance's seek
    consumer_state = _Consumer(10, consumer._acked["tp"])
    assert _new_offset(consumer_state) is None


def test_faust_guessing_a_gap_is_not_taken_only_the_brokers_word() -> None:
    """Faust takes a jump in the offsets its fetch loop sees for offsets the topic lacks.
    After a seek a batch fetched before it jumps (the join-then-kill test lost pages 14
    to 28 so): the guess is not taken. ``mark_absent`` (what the broker said) is."""
    from faust.transport.consumer import Consumer

    from neardup.kafka.faustfix import mark_absent

    strict_commits()
    add_gap: Any = Consumer._add_gap
    c = _Consumer(13, [29])
    asyncio.run(add_gap(c, "tp", 14, 29))  # seek to 13, then 29 from an older batch
    assert not c._gap["tp"]
    assert _new_offset(c) is None  # 13-28 were never handled: no commit
    c = _Consumer(10, [12])
    mark_absent(c, "tp", 10, 12)  # a transaction marker at 10 and 11, record 12
    assert sorted((i.begin, i.end) for i in c._gap["tp"]) == [(10, 12)]
    assert _new_offset(c) == 13
    c = _Consumer(20, [17, 18])  # copies acknowledged while the commit to 20 ran
    assert _new_offset(c) is None and c._acked["tp"] == [] and not c._acked_index["tp"]
    mark_absent(c, "tp", 20, 21)  # the marker after a partition's last transaction
    assert _new_offset(c) == 21  # committed past with nothing acknowledged after it
    assert not c._gap["tp"] and _new_offset(c) is None
    c = _Consumer(10, [])
    mark_absent(c, "tp", 5, 8)  # below the committed offset: nothing
    mark_absent(c, "tp", 11, 11)  # nothing between
    assert not c._gap["tp"]


def test_a_partition_held_back_by_a_message_no_stream_took_is_found() -> None:
    """The trace of a lost page: the message at the committed offset was skipped around a
    rebalance, and its copy fetched again after the seek was dropped as read already."""
    from faust.types import TP
    from intervaltree import IntervalTree

    from neardup.kafka.faustfix import AFTER, READ, UNREAD, stuck_partitions

    a, b, c, d, e, f, g, h, i, j = (TP(name, 0) for name in "abcdefghij")

    class Taken:
        def __init__(self, tp: TP, offset: int) -> None:
            self.tp, self.offset = tp, offset

    class State:
        def __init__(self) -> None:
            self._acked = {a: [11, 12], b: [21], c: [31], d: [40, 41], e: [51]}
            self._acked_index = {tp: set(v) for tp, v in self._acked.items()}
            parts = [a, b, c, d, e, f, g, h, i, j]
            self._committed_offset = dict(zip(parts, range(10, 110, 10), strict=True))
            self._gap = {c: IntervalTree.from_tuples([(30, 31)])}
            self._read_offset = {f: 63, g: 70, h: 80, i: 89, j: 99}
            self.ends = {f: 64, g: 70, h: 90, i: 91, j: 101}
            self._paused_partitions = {j}
            self.unacked = {Taken(b, 20)}
            self.parts = parts

        def assignment(self) -> list[TP]:
            return list(self.parts)

        def highwater(self, tp: TP) -> int | None:
            return self.ends.get(tp)

    # a: 10 never taken, 11 and 12 acked (stuck); b: 20 in progress; c: 30 is absent
    # from the topic; d: the run starts at the committed offset; e: 50 never taken
    # (stuck); f: 60 read past, nothing in progress and no stream waits (stuck); g: read
    # up to its end, nothing there (idle, not stuck); h: 80 read and queued for a stream;
    # i: all read handled, but the end is past 90, which was never read (a transaction
    # marker, or a message not fetched yet: stuck, the caller asks the broker); j: as i,
    # but paused (not fetched on purpose: not stuck)
    state = State()
    found = stuck_partitions(state, lambda topic: topic != "h")
    assert found == {a: (10, AFTER), e: (50, AFTER), f: (60, READ), i: (90, UNREAD)}
    # a commit in progress took a's offsets out of the acknowledged ones and has not yet
    # recorded the new committed offset (the producer's flush is slow): not stuck
    state._neardup_committing = {a: 13}  # type: ignore[attr-defined]
    found = stuck_partitions(state, lambda topic: topic != "h")
    assert found == {e: (50, AFTER), f: (60, READ), i: (90, UNREAD)}
    # copies read again while a commit was in flight, acknowledged against the older
    # committed offset: below the committed offset now, they say nothing about it
    state._acked[e] = [41, 42]
    del state._neardup_committing  # type: ignore[attr-defined]
    found = stuck_partitions(state, lambda topic: topic != "h")
    assert e not in found
    # the sequencer left a later message, or the one at the committed offset itself, to
    # be read again in order: as a later one acknowledged, even with the topic busy; one
    # left below the committed offset (taken since) says nothing
    found = stuck_partitions(state, lambda topic: False, {f: 61, g: 70, e: 49, b: 21, j: 100})
    assert found == {a: (10, AFTER), f: (60, AFTER), g: (70, AFTER)}  # b in hand, j paused


def test_a_page_says_below_which_offset_every_message_was_handled() -> None:
    from neardup.kafka.faustfix import handled_below

    c = _Consumer(10, [10, 11, 12])
    assert handled_below(c, "tp", 13) == 13  # 10-12 acknowledged: nothing missing
    c = _Consumer(10, [10, 12])
    assert handled_below(c, "tp", 13) == 11  # 11 was skipped: it comes back later
    c._gap["tp"].addi(11, 12)  # ... unless the topic has no offset 11
    assert handled_below(c, "tp", 13) == 13
    c = _Consumer(10, [])
    c.__dict__["_neardup_committing"] = {"tp": 13}  # 10-12 being committed right now
    assert handled_below(c, "tp", 13) == 13
    assert handled_below(_Consumer(None, []), "tp", 5) == 5  # no commit known: trusted
    assert handled_below(_Consumer(20, []), "tp", 5) == 20  # a copy of a committed one
    # earlier in the same batch, handled but not acknowledged yet
    assert handled_below(_Consumer(10, [10]), "tp", 13, {11, 12}) == 13
    assert handled_below(_Consumer(10, [10]), "tp", 13, {12}) == 11


def test_runs_missing_are_the_offsets_with_no_message_up_to_the_stop() -> None:
    from neardup.kafka.absent import runs_missing

    assert runs_missing([10, 11, 13, 16], 10, 18) == [(12, 13), (14, 16), (17, 18)]
    assert runs_missing([], 5, 7) == [(5, 7)]  # markers only
    assert runs_missing([5, 6, 9], 5, 7) == []  # past the stop: not asked
    assert runs_missing([7], 5, 8) == [(5, 7)]


# -- the sequencer's partition in offset order (neardup.kafka.inorder) ----------------------


def test_the_sequencer_takes_the_next_offset_only() -> None:
    from neardup.kafka.inorder import Order, in_order

    def none_absent(begin: int, end: int) -> bool:
        return False

    assert in_order(None, 7, none_absent) is Order.TAKE  # nothing to start from
    assert in_order(7, 7, none_absent) is Order.TAKE
    assert in_order(7, 6, none_absent) is Order.AGAIN  # a copy of one taken
    assert in_order(7, 9, none_absent) is Order.AHEAD  # 7 and 8 not seen yet
    asked: list[tuple[int, int]] = []

    def absent(begin: int, end: int) -> bool:
        asked.append((begin, end))
        return True

    assert in_order(7, 9, absent) is Order.TAKE and asked == [(7, 9)]


def test_commits_pass_over_offsets_committed_or_known_absent_only() -> None:
    from neardup.kafka.faustfix import passed_over

    class Consumer:
        def __init__(self, committed: int | None) -> None:
            self._committed_offset = {"tp": committed}
            self._gap: dict[str, IntervalTree] = defaultdict(IntervalTree)

    c = Consumer(5)
    assert passed_over(c, "tp", 2, 5)  # below the committed offset
    assert not passed_over(c, "tp", 2, 6)
    c._gap["tp"].addi(5, 7)
    c._gap["tp"].addi(7, 8)  # touching runs, not merged
    assert passed_over(c, "tp", 3, 8)
    assert not passed_over(c, "tp", 3, 9)
    c._gap["tp"].addi(10, 12)
    assert not passed_over(c, "tp", 5, 12)  # 8 and 9 may hold messages
    c.__dict__["_neardup_committing"] = {"tp": 10}  # a commit under way: gaps forgotten
    assert passed_over(c, "tp", 8, 12) and not passed_over(c, "tp", 8, 13)
    fresh = Consumer(None)
    assert not passed_over(fresh, "tp", 0, 1)
    assert passed_over(fresh, "tp", 4, 4)


def test_messages_left_to_be_read_again_are_neither_acknowledged_nor_waited_for() -> None:
    from neardup.kafka.faustfix import acked_when_done

    events = [_HeldEvent(3), _HeldEvent(5), _HeldEvent(6)]
    stream = _HeldStream(events)

    async def left_past_hole(batch: list[Any]) -> list[Any]:
        return batch[1:]

    async def go() -> None:
        await acked_when_done(stream, events, left_past_hole)
        for event in events:  # take_events' ``finally``
            await stream.ack(event)

    asyncio.run(go())
    assert [e.message.refcount for e in events] == [0, 1, 1]
    assert stream.app.consumer._unacked_messages == {events[0].message}
