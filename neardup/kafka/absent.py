"""Which offsets of a partition hold no message: asked of the broker, never guessed.

A topic may lack offsets: a transactional producer's commit markers take an offset each,
and compaction removes records. A consumer's commits must pass over them, or they stop
there for good. Faust guesses them in its fetch loop: a message whose offset is more than
one past the last one read means the offsets between are absent. Around a seek or a
rebalance that guess is wrong (a batch fetched before the seek arrives after it), and
messages that exist were committed past without ever being handled: pages lost (seen in
the join-then-kill fault test: offsets 14 to 28 of a raw partition taken as absent right
after a seek to 13). So the worker no longer takes Faust's word for it
(``faustfix.strict_commits``) and asks the broker instead, with a consumer of its own
that belongs to no group, once for each offset that holds a partition's commits back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("neardup.kafka")

#: How long one question may take.
ASK_TIMEOUT_S = 5.0
#: The most offsets one question covers.
MAX_SPAN = 1000


class Absent:
    """Answers "which of these offsets hold no message?" with a fetch from the first."""

    def __init__(self, bootstrap: str, client: dict[str, Any]) -> None:
        self.bootstrap = bootstrap
        self.client = client
        self._consumer: Any = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _ensure(self) -> Any:
        if self._closed:
            raise RuntimeError("closed")
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_uncommitted",  # as the worker's own consumer
                # an offset below the log's start (retention deleted it) is absent: read
                # from the start; never jump to the end (what exists would seem absent)
                auto_offset_reset="earliest",
                **self.client,
            )
            try:
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            if self._consumer is not None:
                consumer, self._consumer = self._consumer, None
                await consumer.stop()

    async def between(
        self, topic: str, partition: int, start: int, stop: int
    ) -> list[tuple[int, int]] | None:
        """The runs ``[begin, end)`` of offsets from ``start`` up to ``stop`` (at most
        ``MAX_SPAN`` of them) that hold no message; None if the broker did not say in
        time."""
        from aiokafka import TopicPartition

        stop = min(stop, start + MAX_SPAN)
        async with self._lock:
            try:
                present, stop = await asyncio.wait_for(
                    self._present(TopicPartition(topic, partition), start, stop), ASK_TIMEOUT_S
                )
            except Exception as exc:  # unknown now: the caller asks again later
                log.debug("no answer for %s[%d] %d..%d: %r", topic, partition, start, stop, exc)
                return None
        return runs_missing(present, start, stop)

    async def _present(self, tp: Any, start: int, stop: int) -> tuple[list[int], int]:
        """The offsets from ``start`` up to ``stop`` that hold a message, and ``stop``
        lowered to the partition's end offset (what is not written yet is not absent)."""
        consumer = await self._ensure()
        consumer.assign([tp])
        end = int((await consumer.end_offsets([tp]))[tp])
        stop = min(stop, end)
        present: list[int] = []
        if start >= stop:
            return present, stop
        consumer.seek(tp, start)
        while True:
            batch = await consumer.getmany(tp, timeout_ms=100, max_records=MAX_SPAN)
            present += [r.offset for r in batch.get(tp) or () if r.offset < stop]
            # the fetch position passes over offsets without a message too (a fetch of a
            # marker alone returns no record: wait briefly, the caller is a timer)
            if int(await consumer.position(tp)) >= stop:
                return present, stop


def runs_missing(present: list[int], start: int, stop: int) -> list[tuple[int, int]]:
    """The runs ``[begin, end)`` of offsets from ``start`` up to ``stop`` not in
    ``present``."""
    runs, at = [], start
    for offset in sorted(set(present)):
        if offset >= stop:
            break
        if offset > at:
            runs.append((at, offset))
        at = max(at, offset + 1)
    if at < stop:
        runs.append((at, stop))
    return runs
