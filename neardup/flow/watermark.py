"""The watermark of one partition: which of the items it holds may go on, in key order.

A stage that must see its input in key order (``(order, page_id)``) receives, in the same
partition as the items, a ``Mark`` from each upstream task (*source*): "I will send no
more items with a key below ``frontier``". A source writes its mark in the transaction
of its items, after them, so that a mark read vouches for every item before it. The
partition's watermark W is the least frontier over the sources; an item below W can
have no earlier item still to come, and is released, in key order.

A source may also say it is *drained*: it had read all of its input and held nothing
back when it made the mark (``drained_at``, Unix seconds). Such a mark vouches for the
items that reached this partition ``skew`` seconds or more before it was made, whatever
its frontier: an item that arrived at ``a`` is not held back by a source whose latest
mark is drained and was made at or after ``a + skew``. An idle source (an empty raw
partition, a quiet host) then holds nothing back. A drained mark made before that says
nothing of the item (the source may have read new input since, of an earlier key); the
item waits for a newer mark, or, after ``wait`` seconds (``order_wait``), takes the last
marks as they are. The wait also counts from ``load``: after a restart the items
restored and those read again wait for fresh marks again (a crash may have cut off a
source's step before its items).

Only the hosts stage has a skew (``NEARDUP_RAW_SKEW_MS``): its sources read the raw
topic, whose partitions are each written in key order but not in step with each other
(a producer sends each partition's batches in turn; clocks differ), so a source that
has read all of its partition may still get a page with a key below one that another
source sent on up to the skew earlier. Downstream stages need none: a task passes on
the oldest of its sources' drained times as they are (``drained_at``), and whatever it
sends later comes from raw pages written after those times, which is more than the skew
after the pages of anything that such a mark let go upstream.

An item whose key is not above the greatest key released is *late*: a source broke its
order (a raw partition not written in fetch-time order). It is released at once, in
arrival order, and counted. (One below W but above that key broke its source's promise
too, but goes on in order here; a downstream partition that was promised W counts it.)

Exactly-once delivery keeps this small: a task reads its partition in order, and its
outputs, state and input offsets commit together, so there are no offsets, redeliveries
or skipped messages to account for here.

State lives in the task's store, under a prefix: each source's latest mark, the greatest
key released, and each pending item with its payload. The object keeps a copy in memory
(but the payloads); after a step is aborted, ``load`` it again from the store. An item may
be added with its payload decoded already: the object keeps that message (for up to
``cached`` items) and gives it back at release, so that a stage decodes an item once,
not again when it goes on; an item restored by ``load`` is decoded at release.
"""

from __future__ import annotations

import heapq
import math
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from neardup.flow.messages import Key, Mark
from neardup.store import KV

_ORDER_BIAS = 1 << 63  # orders are signed milliseconds; biased they sort as unsigned bytes
_SOURCE = struct.Struct("<Bqd")  # flags, frontier's order, drained_at (then the page id)
_HAS_FRONTIER, _HAS_DRAINED = 1, 2
_SEQ = struct.Struct(">Q")  # an item's arrival number, after its key
_ARRIVED = struct.Struct("<d")  # an item's arrival time, before its payload
T = TypeVar("T")
#: Decoded items kept in memory at most: a bound on what a long wait can hold there (the
#: payloads of the items beyond it are read back from the store and decoded at release).
CACHED = 1024


class Store(Protocol):
    """What the watermark needs of the task's store (``neardup.store.MemoryKV`` and
    ``RocksKV`` have it): batched reads and writes, and a prefix scan to load."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None: ...

    def delete_many(self, keys: Iterable[bytes]) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


class ScanKV(KV, Protocol):
    """A task's whole store, as the hosts task's template filter needs it too."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


def _raw(payload: bytes) -> bytes:
    return payload


def key_bytes(key: Key) -> bytes:
    """A byte string that sorts like ``key``."""
    order, page_id = key
    return (order + _ORDER_BIAS).to_bytes(8, "big") + page_id.encode("utf-8")


def key_from_bytes(raw: bytes) -> Key:
    return int.from_bytes(raw[:8], "big") - _ORDER_BIAS, raw[8:].decode("utf-8")


def after(key: Key) -> Key:
    """The least key greater than ``key``."""
    return key[0], key[1] + "\x00"


@dataclass(slots=True)
class Source:
    """A source's latest mark."""

    frontier: Key | None = None
    drained_at: float | None = None

    def to_bytes(self) -> bytes:
        flags = (_HAS_FRONTIER if self.frontier is not None else 0) | (
            _HAS_DRAINED if self.drained_at is not None else 0
        )
        order, page_id = self.frontier or (0, "")
        return _SOURCE.pack(flags, order, self.drained_at or 0.0) + page_id.encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Source:
        flags, order, drained_at = _SOURCE.unpack_from(raw)
        frontier = (order, raw[_SOURCE.size :].decode("utf-8")) if flags & _HAS_FRONTIER else None
        return cls(frontier, drained_at if flags & _HAS_DRAINED else None)


class Watermark:
    """Pending items of one partition behind the marks of ``sources`` upstream tasks
    (numbered from 0), kept in ``store`` under ``prefix``."""

    def __init__(
        self,
        store: Store,
        prefix: bytes,
        sources: int,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
        *,
        skew: float = 0.0,
        cached: int = CACHED,
    ) -> None:
        self.store = store
        self.cached = cached
        self.prefix = prefix
        self.sources = sources
        #: Seconds before a drained mark was made after which it no longer vouches for
        #: what arrived (its sources' inputs may be that far out of step).
        self.skew = skew
        #: Seconds after its arrival (and after ``load``) after which an item is released
        #: on the sources' last marks even if they were made before it arrived.
        self.wait = wait
        self.clock = clock
        #: Items released late (their key below what was promised), in this process.
        self.late = 0
        self._marks: dict[int, Source] = {}
        self._w: Key | None = None
        self._heap: list[tuple[Key, int]] = []
        self._arrived: dict[tuple[Key, int], float] = {}
        self._late: list[tuple[Key, int]] = []
        #: Items added since the last ``flush``, not in the store yet: one released before
        #: then never reaches it (no write, no delete, no changelog record).
        self._fresh: dict[tuple[Key, int], bytes] = {}
        #: The messages of held items that came decoded (at most ``cached``).
        self._msgs: dict[tuple[Key, int], Any] = {}
        self._next = 0
        #: The greatest key released in order.
        self.released: Key | None = None
        self.since = -math.inf
        self.last_release = -math.inf

    # -- state ---------------------------------------------------------------------------

    def _mark_key(self, source: int) -> bytes:
        return self.prefix + b"s" + source.to_bytes(4, "big")

    def _item_key(self, item: tuple[Key, int]) -> bytes:
        return self.prefix + b"p" + key_bytes(item[0]) + _SEQ.pack(item[1])

    def load(self) -> None:
        """Read the state from the store (at the start of the task, and after an aborted
        step). Every pending item waits ``wait`` from now before old marks count for it."""
        self.since = self.clock()
        self._marks = {
            int.from_bytes(k[-4:], "big"): Source.from_bytes(v)
            for k, v in self.store.scan(self.prefix + b"s")
        }
        (raw,) = self.store.get_many([self.prefix + b"r"])
        self.released = key_from_bytes(raw) if raw else None
        self._w = self._compute_w()
        self._heap, self._late, self._arrived, self._next = [], [], {}, 0
        self._fresh, self._msgs = {}, {}
        at = len(self.prefix) + 1
        for k, v in self.store.scan(self.prefix + b"p"):
            item = (key_from_bytes(k[at : -_SEQ.size]), _SEQ.unpack(k[-_SEQ.size :])[0])
            self._arrived[item] = _ARRIVED.unpack_from(v)[0]
            self._next = max(self._next, item[1] + 1)
            self._queue(item)
        self._late.sort(key=lambda item: item[1])  # in arrival order

    def __len__(self) -> int:
        return len(self._arrived)

    # -- input -----------------------------------------------------------------------------

    def on_mark(self, mark: Mark) -> None:
        """Take ``source``'s latest mark. A frontier never goes back: an earlier mark's
        promise still holds."""
        self.sources = max(self.sources, mark.source + 1)
        old = self._marks.get(mark.source)
        frontier = mark.frontier
        if old is not None and old.frontier is not None:
            frontier = old.frontier if frontier is None else max(frontier, old.frontier)
        drained_at = mark.drained_at
        if drained_at is None and old is not None and old.frontier == frontier:
            # nothing sent since that drained mark: its time still vouches for what came
            # before it (a later mark that is not drained takes nothing back)
            drained_at = old.drained_at
        new = Source(frontier, drained_at)
        if new != old:
            self._marks[mark.source] = new
            self.store.put_many([(self._mark_key(mark.source), new.to_bytes())])
            self._w = self._compute_w()

    def add(self, key: Key, payload: bytes, arrived: float = -math.inf, msg: object = None) -> bool:
        """Hold an item (its payload kept in the store until released), which reached this
        partition at ``arrived`` (its record's timestamp, Unix seconds; -inf: before any
        mark); ``msg``: the payload decoded, if it was (``release_decoded`` gives it
        back). False if it is late (not above the greatest key released): ``release``
        gives it at once."""
        item = (key, self._next)
        self._next += 1
        self._arrived[item] = arrived
        self._fresh[item] = _ARRIVED.pack(arrived) + payload
        if msg is not None and len(self._msgs) < self.cached:
            self._msgs[item] = msg
        return self._queue(item)

    def flush(self) -> None:
        """Write the items added since the last flush and still held to the store: call it
        before the task commits (the end of each step does)."""
        if self._fresh:
            self.store.put_many((self._item_key(i), v) for i, v in self._fresh.items())
            self._fresh = {}

    def _queue(self, item: tuple[Key, int]) -> bool:
        if self.released is not None and item[0] <= self.released:
            self._late.append(item)
            return False
        heapq.heappush(self._heap, item)
        return True

    # -- output ----------------------------------------------------------------------------

    @property
    def w(self) -> Key | None:
        """The least frontier over the sources (None: a source has promised nothing)."""
        return self._w

    def _compute_w(self) -> Key | None:
        fronts = [self._marks.get(s, Source()).frontier for s in range(self.sources)]
        if not fronts or any(f is None for f in fronts):
            return None
        return min(f for f in fronts if f is not None)

    def frontier(self) -> Key | None:
        """The key below which this partition releases nothing more (but late items): a
        downstream mark's frontier, once the items released are sent."""
        nxt = after(self.released) if self.released is not None else None
        front = nxt if self._w is None else (self._w if nxt is None else max(self._w, nxt))
        if front is not None and self._heap and self._heap[0][0] < front:
            # an item still held (a second one of a key released) must not be promised past
            front = self._heap[0][0]
        return front

    def drained_at(self) -> float | None:
        """The oldest of the sources' drained times, if every source's latest mark says it
        was drained (else None): what a drained mark of this task may vouch for."""
        times = [self._marks.get(s, Source()).drained_at for s in range(self.sources)]
        if not times or any(t is None for t in times):
            return None
        return min(t for t in times if t is not None)

    def _blockers(self, item: tuple[Key, int]) -> Iterator[int]:
        """The sources that may still send an item with a key below ``item``'s."""
        key, arrived = item[0], self._arrived[item]
        if self._w is not None and key < self._w:
            return
        # waited long enough for fresh marks, since it came and since the load: the last
        # ones are taken as they are
        stale_ok = self.clock() - max(arrived, self.since) >= self.wait
        for s in range(self.sources):
            src = self._marks.get(s)
            if src is None:
                yield s
            elif src.frontier is not None and src.frontier > key:
                continue
            elif src.drained_at is None or (src.drained_at - self.skew < arrived and not stale_ok):
                yield s

    def release(self) -> list[tuple[Key, bytes]]:
        """The items that may go on now, with their payloads: late ones first, in arrival
        order, then the others in key order (ties in arrival order)."""
        out = []
        for key, _, payload in self.release_decoded(_raw, payloads=True):
            assert payload is not None  # (asked for)
            out.append((key, payload))
        return out

    def release_decoded(
        self, decode: Callable[[bytes], T], *, payloads: bool = False
    ) -> list[tuple[Key, T, bytes | None]]:
        """The items ``release`` gives, each with its message (as ``add`` was given it,
        else ``decode`` of its payload) and its payload: if ``payloads``, or if it was at
        hand (else None: not read back from the store)."""
        items, self._late = self._late, []
        self.late += len(items)
        heap, w = self._heap, self._w
        while heap and (
            (w is not None and heap[0][0] < w) or next(self._blockers(heap[0]), None) is None
        ):
            items.append(heapq.heappop(heap))
        if not items:
            return []
        fresh, msgs = self._fresh, self._msgs
        stored = [i for i in items if i not in fresh]
        if stored:
            keys = [self._item_key(i) for i in stored]
            wanted = [k for i, k in zip(stored, keys, strict=True) if payloads or i not in msgs]
            found = dict(zip(wanted, self.store.get_many(wanted), strict=True)) if wanted else {}
            self.store.delete_many(keys)
        out: list[tuple[Key, T, bytes | None]] = []
        for item in items:
            del self._arrived[item]
            value = fresh.pop(item, None)
            if value is None and (payloads or item not in msgs):
                value = found[self._item_key(item)]
                if value is None:
                    raise RuntimeError(f"pending item {item[0]} is missing from the store")
            payload = None if value is None else value[_ARRIVED.size :]
            if item in msgs:
                msg = msgs.pop(item)
            else:
                assert payload is not None  # (read back: not kept decoded)
                msg = decode(payload)
            out.append((item[0], msg, payload))
        last = items[-1][0]
        if self.released is None or last > self.released:
            self.released = last
            self.store.put_many([(self.prefix + b"r", key_bytes(last))])
        self.last_release = self.clock()
        return out

    # -- what holds it back (for the stall log and the metrics) ----------------------------

    def newest(self) -> Key | None:
        """The greatest key held (None: nothing held)."""
        return max(self._arrived)[0] if self._arrived else None

    def oldest(self) -> Key | None:
        """The key of the next item to go in key order (None: nothing held)."""
        return self._heap[0][0] if self._heap else None

    def fronts(self) -> dict[int, Key | None]:
        """Each source's latest frontier (None: it has promised nothing)."""
        return {s: self._marks.get(s, Source()).frontier for s in range(self.sources)}

    def blocking(self) -> list[int]:
        """The sources that hold back the next pending item."""
        return list(self._blockers(self._heap[0])) if self._heap else []

    def waiting(self) -> float:
        """Seconds the next pending item has held the partition back (0: none): since it
        arrived, the item before it was released, or the state was loaded, whichever came
        last."""
        if not self._heap:
            return 0.0
        since = max(self._arrived[self._heap[0]], self.last_release, self.since)
        return max(0.0, self.clock() - since) if math.isfinite(since) else 0.0
