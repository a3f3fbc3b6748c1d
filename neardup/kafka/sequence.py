"""Sequencing: release analysed pages in one order that does not depend on partitions.

Pages reach the sequencer from every raw partition, interleaved however the analysers'
timing falls. The stateful stages must see them in one deterministic order, so that N
workers decide what one worker decides. That order is the order key ``(order, page_id)``:
fetch time, then page id.

A pending page with order ``K`` is released once no raw partition can still deliver a
page with an order up to ``K``. For each partition either

* a page with a later order has come from it, every message before which its sender had
  handled (pages of one partition arrive in offset order, and a partition is taken to
  be written in non-decreasing fetch time; a message skipped on the way comes back
  later, and the pages after it are *held* until it has), or
* it is *drained*: a mark promised that every page below some offset was delivered, and
  no page at or beyond that offset has come since; and that mark was made after the page
  to release reached the sequencer topic. (A mark vouches for the pages produced before
  it, not after: when a worker dies, its partitions' last marks say nothing of pages
  produced into them since, and the release waits for their new owner's marks.)

Ties on ``K`` wait for a strictly later page, so pages of one partition with the same
fetch time may come in any page-id order.

A page that arrives after a greater key was released (its partition broke the fetch-time
order, or it was produced into a drained partition after the mark) is *late*: it is
released at once, in arrival order, and counted.

This module knows nothing of Kafka: partitions and offsets are plain integers, and the
state lives in memory; the caller persists it (``Progress.to_bytes``, the pending keys).
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from neardup.kafka.wire import Mark

Key = tuple[int, str]  # (order, page_id)

_ORDER_BIAS = 1 << 63  # orders are signed milliseconds; biased they sort as unsigned bytes


def key_bytes(key: Key) -> bytes:
    """A byte string that sorts like ``key``."""
    order, page_id = key
    return (order + _ORDER_BIAS).to_bytes(8, "big") + page_id.encode("utf-8")


def key_from_bytes(raw: bytes) -> Key:
    return int.from_bytes(raw[:8], "big") - _ORDER_BIAS, raw[8:].decode("utf-8")


@dataclass(slots=True)
class Progress:
    """What the sequencer knows of one raw partition."""

    #: Offset of the latest page received from the partition (-1: none yet).
    last_page: int = -1
    #: Greatest order received from the partition (None: none yet).
    high: int | None = None
    #: Every page below this offset has been delivered (from the latest mark).
    through: int = -1
    #: When the latest mark that said so was made (Unix seconds).
    vouched: float = -math.inf
    #: Pages received while an earlier message of the partition was not handled yet
    #: (``[offset, order]``): their orders do not count in ``high`` until it was.
    held: list[list[int]] = field(default_factory=list)

    @property
    def drained(self) -> bool:
        """Nothing can come from the partition that is not here already."""
        return self.through > self.last_page

    def count(self, order: int) -> None:
        self.high = order if self.high is None else max(self.high, order)

    def clear(self, below: int) -> bool:
        """Every message below offset ``below`` was handled: the held pages at or below
        it count now. True if any did."""
        ready = [h for h in self.held if h[0] <= below]
        if not ready:
            return False
        self.held = [h for h in self.held if h[0] > below]
        for _, order in ready:
            self.count(order)
        return True

    def to_bytes(self) -> bytes:
        row = [self.last_page, self.high, self.through, self.vouched]
        return json.dumps([*row, self.held] if self.held else row).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Progress:
        last_page, high, through, *rest = json.loads(raw)
        # (stored before marks had a time: they vouched for every page)
        at = float(rest[0]) if rest else math.inf
        held = [[int(o), int(k)] for o, k in rest[1]] if len(rest) > 1 else []
        return cls(int(last_page), None if high is None else int(high), int(through), at, held)


class Sequencer:
    """Pending page keys and per-partition progress; decides what may be released."""

    def __init__(self, wait: float = math.inf, clock: Callable[[], float] = time.time) -> None:
        #: Seconds after its arrival (on ``clock``) after which a page is released on
        #: partitions' last marks even if they were made before it (``_may_release``).
        self.wait = wait
        self.clock = clock
        #: Partitions of the raw topic (0 until a message says).
        self.partitions = 0
        self.progress: dict[int, Progress] = {}
        self._heap: list[Key] = []
        #: Pending keys, and when each page reached the sequencer topic (Unix seconds).
        self._pending: dict[Key, float] = {}
        #: The greatest key released so far.
        self.released: Key | None = None
        self.late = 0
        #: When the state was last restored (``restore``, at every start of the stage,
        #: on ``clock``): a page waits ``wait`` from then at least.
        self.since = -math.inf
        #: When a page was last released (on ``clock``): the next one is held back from
        #: then on, not from its arrival (``waiting``).
        self.last_release = -math.inf

    def __len__(self) -> int:
        return len(self._pending)

    def restore(
        self,
        partitions: int,
        progress: Iterable[tuple[int, Progress]],
        pending: Iterable[tuple[Key, float]],
        released: Key | None,
    ) -> None:
        """Load persisted state (after a restart or a rebalance): ``pending`` is each
        pending key with the time its page reached the sequencer topic.

        From now on every page waits ``wait`` from now at least before the last marks
        are taken for it (``_blockers``): after a restart, the pages restored and those
        read again wait for fresh marks again, up to ``wait``. Counted from their
        arrival only, a restart later than ``wait`` released a restored page on the last
        marks at once, before a page of lower order that the message read next brings
        back (one a crash had cut off before its step was written), which then came
        late. The price: each restore (also the reload at a rebalance) gives a page held
        only by a partition whose owner is gone or hung up to ``wait`` again."""
        self.since = self.clock()
        self.partitions = partitions
        self.progress = dict(progress)
        self._pending = dict(pending)
        self._heap = sorted(self._pending)
        self.released = released

    def observe(
        self, partition: int, offset: int, partitions: int, order: int, clear: int | None = None
    ) -> bool:
        """Record that a page of ``order`` came from ``partition`` at ``offset``, its
        sender having handled every message of the partition below ``clear`` (None: below
        ``offset``); True if the partition's progress moved.

        A page whose sender had not handled every message before it (``clear < offset``:
        one was skipped, and will be read again) is *held*: its order counts only once a
        later page or mark says the messages before it were handled. Otherwise the
        skipped page would come after pages that its partition's later pages let go. A
        page at or below the partition's last page offset is a redelivery, or the skipped
        message read again: it counts, and clears held pages, but is no later page."""
        self.partitions = max(self.partitions, partitions)
        prog = self.progress.setdefault(partition, Progress())
        below = offset if clear is None else clear
        if offset <= prog.last_page:  # the page itself may be one that was skipped
            before = prog.high
            if below >= offset:
                prog.count(order)
            return prog.clear(below) or prog.high != before
        prog.last_page = offset
        if below >= offset:
            prog.count(order)
        else:
            prog.held.append([offset, order])
        prog.clear(below)
        return True

    def add(self, key: Key, arrived: float = -math.inf) -> bool:
        """Make ``key`` pending, its page having reached the sequencer topic at
        ``arrived``; False if it already is (a redelivered page)."""
        if key in self._pending:
            return False
        self._pending[key] = arrived
        heapq.heappush(self._heap, key)
        return True

    def on_marks(
        self, partitions: int, marks: Iterable[Mark], at: float = math.inf
    ) -> tuple[list[int], list[int]]:
        """Apply marks made at ``at``. Returns the partitions whose progress moved (a new
        offset, or held pages that count now), and those whose mark time alone moved on."""
        self.partitions = max(self.partitions, partitions)
        moved: list[int] = []
        retimed: list[int] = []
        for mark in marks:
            prog = self.progress.setdefault(mark.partition, Progress())
            if mark.through < prog.through:
                continue
            cleared = prog.clear(mark.through)
            # (a time replaces the infinity of marks stored before marks had one)
            vouched = at if prog.vouched == math.inf else max(prog.vouched, at)
            # (a first time after the infinity is stricter, not newer: it moves too)
            stricter = prog.vouched == math.inf and vouched != math.inf
            if mark.through != prog.through or cleared or stricter:
                moved.append(mark.partition)
            elif vouched != prog.vouched:
                retimed.append(mark.partition)
            prog.through, prog.vouched = mark.through, vouched
        return moved, retimed

    def _blockers(self, key: Key) -> Iterator[int]:
        """The partitions that can still deliver a page at or before ``key``."""
        order, arrived = key[0], self._pending[key]
        # waited long enough for fresh marks, since it came and since the start: the
        # last ones are taken as they are
        stale_ok = self.clock() - max(arrived, self.since) >= self.wait
        for p in range(self.partitions):
            prog = self.progress.get(p)
            if prog is None:
                yield p
            elif prog.high is not None and prog.high > order:
                continue
            elif not prog.drained or (prog.vouched < arrived and not stale_ok):
                yield p

    def _may_release(self, key: Key) -> bool:
        return self.partitions > 0 and next(self._blockers(key), None) is None

    def peek(self) -> Key | None:
        """The next key that may be released now, without releasing it."""
        if not self._heap:
            return None
        key = self._heap[0]
        late = self.released is not None and key < self.released
        return key if late or self._may_release(key) else None

    def pop(self) -> Key:
        """Release the key ``peek`` returned."""
        key = heapq.heappop(self._heap)
        self._pending.pop(key, None)
        self.last_release = self.clock()
        if self.released is not None and key < self.released:
            self.late += 1
        else:
            self.released = key
        return key

    def release(self) -> Iterator[Key]:
        """Release every key that may be released now, in order."""
        while self.peek() is not None:
            yield self.pop()

    def blocking(self) -> list[int]:
        """Partitions that hold back the next pending page (for the stall log)."""
        return list(self._blockers(self._heap[0])) if self._heap else []

    def waiting(self) -> float:
        """Seconds the next pending page has held the sequencer back (0: none): since it
        arrived, the page before it was released, or the state was restored, whichever
        came last. A page that waited its turn behind a backlog the sequencer was
        working through has not held anything back."""
        if not self._heap:
            return 0.0
        since = max(self._pending[self._heap[0]], self.last_release, self.since)
        return max(0.0, self.clock() - since) if math.isfinite(since) else 0.0
