"""The worker's seeks are made between two fetches (``faustfix.seeks_between_fetches``).

A model of Faust's fetch loop over a partition of 20 messages: each fetch takes up to 8
records from aiokafka's position and moves it on; the loop delivers a record when its
offset is at or above the loop's read offset, and then sets the read offset to it
(``Consumer._drain_messages``). A seek moves both back (``Consumer.seek``)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import ThreadDelegateConsumer
from faust.types import TP

from neardup.kafka import faustfix

RAW = TP("raw", 0)
OTHER = TP("raw", 1)
END = 20
FETCH = 8


class _Loop:
    """Faust's consumer as the fetch loop and the seeks see it."""

    def __init__(self) -> None:
        self.app = SimpleNamespace(consumer_generation_id=1)
        self.position = 0  # aiokafka's
        self._read_offset: dict[Any, int | None] = {RAW: None}
        self._committed_offset: dict[Any, int | None] = {}
        self.assigned = {RAW, OTHER}
        self.delivered: list[int] = []
        self.events: list[str] = []
        self._thread = self

    def assignment(self) -> set[Any]:
        return self.assigned

    def _is_changelog_tp(self, tp: Any) -> bool:
        return bool(tp.topic.endswith("-changelog"))

    async def seek(self, tp: Any, offset: int) -> None:  # Faust's Consumer.seek
        if tp not in self.assigned:
            raise RuntimeError("not assigned")  # aiokafka's IllegalStateError
        self.events.append(f"seek {tp.partition} {offset}")
        self.position = offset
        self._read_offset[tp] = offset

    async def getmany(self, active: Any, timeout: float) -> dict[Any, list[Any]]:
        self.events.append("fetch")
        batch = [SimpleNamespace(offset=o) for o in range(self.position, END)][:FETCH]
        self.position += len(batch)
        return {RAW: batch}

    async def drain(self, during: Any = None, wrapped: bool = True) -> None:
        """Fetch and deliver until the partition's end; ``during(offset)`` after each
        record delivered. ``wrapped``: through the worker's wrap (installed below)."""
        fetch = ThreadDelegateConsumer._getmany if wrapped else _Loop.getmany
        for _ in range(10):
            records = await fetch(self, None, 1.0)  # type: ignore[arg-type]
            for offset in (r.offset for r in records.get(RAW, [])):
                read = self._read_offset[RAW]
                if read is None or offset >= read:
                    self.delivered.append(offset)
                    self._read_offset[RAW] = offset
                    if during is not None:
                        await during(offset)
            if self.position >= END and (self._read_offset[RAW] or 0) >= END - 1:
                return


@pytest.fixture(autouse=True)
def _installed() -> None:
    faustfix.seeks_between_fetches()


def test_the_worker_installs_it() -> None:
    faustfix.install()
    assert getattr(ThreadDelegateConsumer._getmany, "neardup_fix", False)


def test_a_seek_asked_for_mid_batch_is_made_before_the_next_fetch() -> None:
    loop = _Loop()

    async def read_again(offset: int) -> None:
        if offset == 5 and loop.delivered.count(5) == 1:  # 3 was dropped: read again
            faustfix.request_seek(loop, RAW, 3)
            assert loop.position == FETCH  # not yet: the batch in hand comes first

    asyncio.run(loop.drain(read_again))
    assert loop.events[:3] == ["fetch", "seek 0 3", "fetch"]
    assert loop.delivered == [*range(8), *range(3, END)]  # every record from 3 again
    assert faustfix.requested_seeks(loop) == {}


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_seek_made_at_once_mid_batch_brings_its_records_only_with_the_wrap(
    wrapped: bool,
) -> None:
    """Faust's own seek to the committed offsets at an assignment is made at once. The
    rest of the batch in hand moves the read offset on (to 7), and Faust's loop alone
    drops the records fetched again from 3 (the stall this fixes); the wrap delivers
    them (``deliver_what_a_seek_brought``), 6 and 7 for the third time."""
    loop = _Loop()

    async def read_again(offset: int) -> None:
        if offset == 5 and loop.delivered.count(5) == 1:
            await loop.seek(RAW, 3)

    asyncio.run(loop.drain(read_again, wrapped=wrapped))
    if wrapped:
        assert loop.delivered == [*range(8), *range(3, END)]
    else:
        assert loop.delivered == [*range(8), *range(7, END)]  # 3 to 6 never came again


def test_what_a_seek_brought_is_delivered_from_the_committed_offset_not_below() -> None:
    loop = _Loop()
    log_tp = TP("t-changelog", 0)
    loop._read_offset = {RAW: 153, OTHER: 40, log_tp: 90}
    loop._committed_offset = {RAW: 14, OTHER: None}

    def batch(start: int) -> list[Any]:
        return [SimpleNamespace(offset=o) for o in range(start, start + 3)]

    records = {RAW: batch(10), OTHER: batch(12), log_tp: batch(50)}
    faustfix.deliver_what_a_seek_brought(loop, records)
    # 10 to 13 were handled (committed 14); nothing is known of OTHER's commits; a
    # changelog's read offset is Faust's recovery's
    assert loop._read_offset == {RAW: 14, OTHER: 12, log_tp: 90}
    faustfix.deliver_what_a_seek_brought(loop, {RAW: batch(160), OTHER: []})
    assert loop._read_offset == {RAW: 14, OTHER: 12, log_tp: 90}  # not a seek: as it was
    # commits ahead of the read offset (offsets the broker said hold no message), and a
    # partition the loop has read nothing of since its assignment: left as they are
    loop._read_offset, loop._committed_offset = {RAW: 20, OTHER: None}, {RAW: 25}
    faustfix.deliver_what_a_seek_brought(loop, {RAW: batch(10), OTHER: batch(0)})
    assert loop._read_offset == {RAW: 20, OTHER: None}


def test_a_seek_asked_for_before_a_rebalance_or_of_a_partition_gone_is_not_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _Loop()
    faustfix.request_seek(loop, RAW, 3)
    loop.app.consumer_generation_id += 1  # a rebalance sought to the committed offsets
    faustfix.request_seek(loop, OTHER, 4)
    loop.assigned = {RAW}  # ... and took partition 1 away
    with caplog.at_level(logging.INFO, logger="neardup.kafka"):
        asyncio.run(ThreadDelegateConsumer._getmany(loop, None, 1.0))  # type: ignore[arg-type]
    assert loop.events == ["fetch"]
    assert "no seek of raw[0] to 3" in caplog.text and "no seek of raw[1] to 4" in caplog.text
    assert faustfix.requested_seeks(loop) == {}


def test_a_seek_that_fails_is_logged_and_the_fetch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _Loop()
    faustfix.request_seek(loop, OTHER, 4)
    faustfix.request_seek(loop, RAW, 2)
    faustfix.request_seek(loop, RAW, 3)  # the last one asked for counts
    assert faustfix.requested_seeks(loop) == {OTHER: 4, RAW: 3}
    loop.assigned = {RAW, OTHER}

    async def seek(tp: Any, offset: int) -> None:
        if tp == OTHER:
            raise RuntimeError("not assigned")
        await _Loop.seek(loop, tp, offset)

    loop.seek = seek  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="neardup.kafka"):
        asyncio.run(ThreadDelegateConsumer._getmany(loop, None, 1.0))  # type: ignore[arg-type]
    assert loop.events == ["seek 0 3", "fetch"]
    assert "no seek of raw[1] to 4: RuntimeError('not assigned')" in caplog.text
