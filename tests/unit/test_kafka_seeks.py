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

from worker.kafka import faustfix

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
        self.assigned = {RAW, OTHER}
        self.delivered: list[int] = []
        self.events: list[str] = []
        self._thread = self

    def assignment(self) -> set[Any]:
        return self.assigned

    async def seek(self, tp: Any, offset: int) -> None:  # Faust's Consumer.seek
        if tp not in self.assigned:
            raise RuntimeError("not assigned")  # aiokafka's IllegalStateError
        self.events.append(f"seek {tp.partition} {offset}")
        self.position = offset
        self._read_offset[tp] = offset

    async def getmany(self, active: Any, timeout: float) -> dict[Any, list[int]]:
        self.events.append("fetch")
        batch = list(range(self.position, min(self.position + FETCH, END)))
        self.position += len(batch)
        return {RAW: batch}

    async def drain(self, during: Any = None) -> None:
        """Fetch and deliver until the partition's end; ``during(offset)`` after each
        record delivered."""
        fetch = ThreadDelegateConsumer._getmany  # with the worker's wrap (installed below)
        for _ in range(10):
            records = await fetch(self, None, 1.0)  # type: ignore[arg-type]
            for offset in records.get(RAW, []):
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


def test_the_same_seek_made_at_once_loses_what_it_was_for() -> None:
    """The model shows the stall this fixes: sought at once, the rest of the batch in
    hand moves the read offset on, and the records fetched again are dropped."""
    loop = _Loop()

    async def read_again(offset: int) -> None:
        if offset == 5 and loop.delivered.count(5) == 1:
            await loop.seek(RAW, 3)

    asyncio.run(loop.drain(read_again))
    assert loop.delivered == [*range(8), *range(7, END)]  # 3 to 6 never came again


def test_a_seek_asked_for_before_a_rebalance_or_of_a_partition_gone_is_not_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _Loop()
    faustfix.request_seek(loop, RAW, 3)
    loop.app.consumer_generation_id += 1  # a rebalance sought to the committed offsets
    faustfix.request_seek(loop, OTHER, 4)
    loop.assigned = {RAW}  # ... and took partition 1 away
    with caplog.at_level(logging.INFO, logger="worker.kafka"):
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
    with caplog.at_level(logging.INFO, logger="worker.kafka"):
        asyncio.run(ThreadDelegateConsumer._getmany(loop, None, 1.0))  # type: ignore[arg-type]
    assert loop.events == ["seek 0 3", "fetch"]
    assert "no seek of raw[1] to 4: RuntimeError('not assigned')" in caplog.text
