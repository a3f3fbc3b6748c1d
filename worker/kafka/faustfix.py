"""Fixes to faust-streaming's consumer (0.15.3, pinned in ``requirements.lock``) that the
worker's promise rests on: every raw page comes out, as a decision or a dead letter.

Each fix wraps or replaces one method of Faust's ``Consumer``; ``install`` applies them
all, once. They were found by tracing offsets through Faust under the fault tests
(``tests/integration/test_faults.py``: SIGKILLs, restarts, rebalances):

* ``strict_commits``: Faust committed past one unacknowledged message at the committed
  offset (faust-streaming #312, #606).
* ``no_skipped_acks``: a stream skips a message fetched while the flow was stopped or for
  an older generation (a rebalance; faust-streaming #221, #223), and *acknowledges* it, so
  that it was committed although no agent ever saw it.
* ``authoritative_seeks``: at the end of a rebalance Faust seeks to the committed offsets,
  but its fetch loop went on delivering records fetched before the seek and set its read
  offsets past it, so the records fetched again from the committed offset were dropped as
  read already. Now records fetched before a seek of their partition are not delivered,
  and a seek's read offsets stand.

With them, a message that is skipped is read again after the rebalance that skipped it;
should some other path ever drop one, ``stuck_partitions`` finds the partition whose
commits it holds back, and the worker reads it again from there (``Worker.unstick``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("worker.kafka")

#: How long the broker may hold a fetch for data. Faust hard-codes 1500 ms; the consumer
#: fetches every partition it owns in one request, and the worker owns internal partitions
#: that are mostly idle, so a fetch for the busy raw partitions would wait behind them.
FETCH_MAX_WAIT_MS = 50


def install() -> None:
    tune_fetch()
    strict_commits()
    no_skipped_acks()
    authoritative_seeks()


def _once(cls: Any, name: str, fn: Any) -> None:
    """Replace ``cls.name`` with ``fn`` unless it was replaced already."""
    if getattr(getattr(cls, name), "neardup_fix", False):
        return
    fn.neardup_fix = True
    setattr(cls, name, fn)


def tune_fetch() -> None:
    """Give Faust's consumer ``FETCH_MAX_WAIT_MS`` (a wrap of the one method that builds
    it: Faust has no setting for it)."""
    from faust.transport.drivers import aiokafka as driver

    thread = driver.AIOKafkaConsumerThread
    build = thread._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = build(self, transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts
        return consumer

    _once(thread, "_create_worker_consumer", create)


def strict_commits() -> None:
    """Never commit past a message that was not acknowledged.

    Faust's ``Consumer._new_offset`` commits the run of acknowledged offsets that starts
    at the smallest one, and only checks that this run starts where the last commit ended
    if ``min(acked) - committed > 1``: one unacknowledged message right at the committed
    offset is committed past (faust-streaming issues #312, #606). This is the same
    function with the check made exact (``committed`` is the next offset to read, as
    Kafka's commits are). Offsets the topic does not have (transaction markers, compacted
    records) are gaps, counted as acknowledged (see ``_add_gap``)."""
    from faust.transport import consumer as faust_consumer
    from faust.utils.functional import consecutive_numbers

    def new_offset(self: Any, tp: Any) -> int | None:
        acked = self._acked[tp]
        if not acked:
            return None
        gaps = self._gap[tp]
        if gaps:
            top = max(acked)
            spans = sorted(gaps.overlap(0, top), key=lambda x: x.begin)
            if spans:
                filled: list[int] = []
                for span in spans:
                    filled.extend(range(span.begin, span.end))
                acked.extend(filled)
                gaps.chop(0, max(filled[-1], top + 1))
        acked.sort()
        committed = self._committed_offset[tp]
        if committed is not None and acked[0] > committed:
            return None  # the message at the committed offset is not acknowledged yet
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1

    async def add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        # Faust's own clamps at ``committed + 1`` and takes ``offset_to`` (the message
        # that revealed the gap) in too: the offsets from ``offset_from`` up to, not
        # including, ``offset_to`` are absent from the topic, and none below ``committed``
        # matters
        committed = self._committed_offset[tp]
        if committed is not None:
            offset_from = max(offset_from, committed)
        if offset_from < offset_to:
            gaps = self._gap[tp]
            gaps.addi(offset_from, offset_to)
            await asyncio.sleep(0)
            gaps.merge_overlaps()

    base = faust_consumer.Consumer
    _once(base, "_new_offset", new_offset)
    _once(base, "_add_gap", add_gap)


def no_skipped_acks() -> None:
    """A message no stream took (``tracked`` is set when one does) is never acknowledged.

    ``Stream`` skips a message that was fetched while the flow was stopped, or for an
    older generation, and then acknowledges it "so that the lag does not grow": its offset
    is committed with the others, and the message is lost. Left unacknowledged, it holds
    the partition's commits back until it is read again (after the rebalance's seek)."""
    from faust.transport import consumer as faust_consumer

    base = faust_consumer.Consumer
    ack = base.ack

    def ack_taken(self: Any, message: Any) -> bool:
        if not message.tracked:
            return False
        return bool(ack(self, message))

    _once(base, "ack", ack_taken)


@dataclass
class _Seeks:
    """The seeks of one consumer: how many, and each partition's latest."""

    count: int = 0
    #: partition -> (the seek's number, the read offset it set)
    last: dict[Any, tuple[int, int | None]] = field(default_factory=dict)

    def record(self, reads: Mapping[Any, int | None]) -> None:
        self.count += 1
        for tp, read in reads.items():
            self.last[tp] = (self.count, read)

    def since(self, count: int, tp: Any) -> bool:
        """Whether ``tp`` was sought after seek number ``count``."""
        seek = self.last.get(tp)
        return seek is not None and seek[0] > count


def _seeks(consumer: Any) -> _Seeks:
    seeks = consumer.__dict__.get("_neardup_seeks")
    if seeks is None:
        seeks = consumer.__dict__["_neardup_seeks"] = _Seeks()
    return seeks  # type: ignore[no-any-return]


def _read_offset(next_offset: int | None) -> int | None:
    """The read offset (the last offset read, as the fetch loop keeps it) before
    ``next_offset``."""
    return next_offset - 1 if next_offset is not None and next_offset > 0 else None


def authoritative_seeks() -> None:
    """Seeks reset what the fetch loop has read, and nothing fetched before them passes.

    * ``perform_seek`` (the end of every rebalance) seeks every partition the streams
      read, those without a committed offset to their beginning (the worker's
      ``auto_offset_reset``), and sets read offsets as the fetch loop keeps them: the last
      offset read, one below the committed offset. (Faust set the committed offset itself,
      so an offset missing from the topic right there was never counted as a gap.)
    * ``getmany`` does not deliver a record of a partition sought after the record was
      fetched, and undoes the read offset the fetch loop set, after such a seek, for the
      record it was delivering."""
    from aiokafka import TopicPartition  # type: ignore[import-untyped]
    from faust.transport import consumer as faust_consumer
    from faust.types import TP

    base = faust_consumer.Consumer

    async def perform_seek(self: Any) -> None:
        committed = await self.seek_to_committed()
        streamed = {
            tp
            for tp in self.assignment()
            if self.app.topics.acks_enabled_for(tp.topic) and not self._is_changelog_tp(tp)
        }
        fresh = [TopicPartition(tp.topic, tp.partition) for tp in streamed if not committed.get(tp)]
        if fresh:
            await self._thread.seek_to_beginning(*fresh)
        reads = {TP(tp.topic, tp.partition): _read_offset(committed.get(tp)) for tp in streamed}
        self._read_offset.update(reads)
        _seeks(self).record(reads)
        self._committed_offset.update(
            {
                TP(tp.topic, tp.partition): offset if offset else None
                for tp, offset in committed.items()
                if offset is not None
            }
        )

    async def seek(self: Any, partition: Any, offset: int) -> None:
        await self._seek(partition, offset)
        reads = {TP(partition.topic, partition.partition): _read_offset(offset)}
        self._read_offset.update(reads)
        _seeks(self).record(reads)

    getmany = base.getmany

    def fetched_since_seek(self: Any, timeout: float) -> AsyncIterator[tuple[Any, Any]]:
        return _deliver_unsought(self, getmany(self, timeout))

    _once(base, "perform_seek", perform_seek)
    _once(base, "seek", seek)
    _once(base, "getmany", fetched_since_seek)


async def _deliver_unsought(
    consumer: Any, batch: AsyncIterator[tuple[Any, Any]]
) -> AsyncIterator[tuple[Any, Any]]:
    seeks = _seeks(consumer)
    count = -1
    try:
        async for tp, message in batch:
            if count < 0:
                # the batch was fetched after this seek (a fetch returns nothing fetched
                # from before a seek), and no other task ran since
                count = seeks.count
            elif seeks.since(count, tp):
                continue  # fetched before its partition was sought: it comes again
            yield tp, message
            if seeks.since(count, tp):
                # the fetch loop set the read offset to this record's after the seek
                consumer._read_offset[tp] = seeks.last[tp][1]
    finally:
        aclose = getattr(batch, "aclose", None)
        if aclose is not None:
            await aclose()


def stuck_partitions(consumer: Any) -> dict[Any, int]:
    """Partitions whose commits are held back by a message that no stream holds: the
    message at the committed offset was never taken (acknowledged messages lie beyond
    it, and none of the messages in progress is it). Returns each one's committed offset.

    A stream takes a partition's messages in offset order, so a message not yet taken
    has no acknowledged message after it, except one that was dropped on the way."""
    taken = {(m.tp, m.offset) for m in list(consumer.unacked)}
    stuck = {}
    for tp, acked in list(consumer._acked.items()):
        committed = consumer._committed_offset.get(tp)
        if not acked or committed is None or min(acked) <= committed:
            continue
        gaps = consumer._gap.get(tp)
        if gaps is not None and gaps.overlaps(committed):
            continue
        if (tp, committed) not in taken:
            stuck[tp] = int(committed)
    return stuck


async def acked_when_done(
    stream: Any, events: list[Any], handle: Callable[[list[Any]], Awaitable[None]]
) -> None:
    """Handle a batch from ``take_events`` and acknowledge it only once handled.

    ``Stream.take_events`` acknowledges a batch in a ``finally``: when the agent is
    cancelled halfway through it (the worker stopping, at a leave or a restart), the
    messages not yet handled are acknowledged too, their offsets committed, and they are
    never seen again. Holding one more reference on each message until its outputs went
    to the producer leaves them unacknowledged in that case, to be read again."""
    for event in events:
        event.message.incref()
    await handle(events)
    for event in events:
        await stream.ack(event)
