"""The worker's fix of Faust's offset commits: never past an unacknowledged message."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

from intervaltree import IntervalTree

from worker.kafka.app import _strict_commits


class _Consumer:
    """The state ``Consumer._new_offset`` reads, for one partition."""

    def __init__(self, committed: int | None, acked: list[int]) -> None:
        self._acked: dict[str, list[int]] = {"tp": list(acked)}
        self._acked_index: dict[str, set[int]] = {"tp": set(acked)}
        self._gap: dict[str, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: dict[str, int | None] = {"tp": committed}


def _new_offset(consumer: _Consumer) -> int | None:
    from faust.transport.consumer import Consumer

    _strict_commits()
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


def test_a_batch_cancelled_halfway_stays_unacknowledged() -> None:
    """take_events acknowledges its batch in a ``finally`` even when the handler was
    cancelled; the extra reference keeps those messages from being committed."""
    import asyncio

    from worker.kafka.app import _acked_when_done

    class Message:
        def __init__(self) -> None:
            self.refcount = 1  # the stream's own reference

        def incref(self) -> None:
            self.refcount += 1

    class Event:
        def __init__(self) -> None:
            self.message = Message()

    class Stream:
        async def ack(self, event: Event) -> None:
            event.message.refcount -= 1

    async def handled(events: list[Any]) -> None:
        await asyncio.sleep(0)

    async def cancelled(events: list[Any]) -> None:
        raise asyncio.CancelledError

    async def go() -> tuple[list[int], list[int]]:
        stream = Stream()
        done, stopped = [Event(), Event()], [Event(), Event()]
        await _acked_when_done(stream, done, handled)
        with contextlib.suppress(asyncio.CancelledError):
            await _acked_when_done(stream, stopped, cancelled)
        for event in done + stopped:  # what take_events' ``finally`` then does
            await stream.ack(event)
        return [e.message.refcount for e in done], [e.message.refcount for e in stopped]

    done, stopped = asyncio.run(go())
    assert done == [0, 0]  # handled: acknowledged, committable
    assert stopped == [1, 1]  # cancelled: still referenced, never committed
