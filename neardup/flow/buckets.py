"""The buckets task: a share of the fingerprint index, probed in key order.

Buckets task b reads partition b of the probes topic: from every hosts task, one ``Probe``
for each page that has buckets here (SimHash blocks, period strings, the smallest 5-gram
hashes of a short page: ``KVIndex.keys``, owned by ``partition_of_bucket``), with each
hosts task's marks. It holds the probes behind its watermark and applies them in key
order, so that every bucket sees the pages in the order ``neardup dedup`` adds them. A
probe's answer is what its buckets held before the page (their values as
``KVIndex.lookup`` reads them, None for an empty one); then the page's entry is added
(``KVIndex.appended``: expired entries go, a full bucket takes nothing). The answer goes
to the page's decide task.

The buckets are kept under the index's own keys, with the index's values: a bucket here
is the bucket ``neardup dedup`` would hold. Exactly-once delivery means a probe is applied
once, so no per-entry sequence numbers are needed to answer a probe sent again.

Under ``retention_days`` a bucket whose newest entry is older than that before the
greatest key released is deleted (``sweep``): every probe still to come reads it as
empty, as the index does (``KVIndex._live``), so the answer decides alike, and an absent
bucket and one of expired entries take the next entry alike (``KVIndex.appended``). A
bucket with a live entry is left as it is: its length decides whether a posting list is
full, as in ``neardup dedup``. So the task keeps the buckets of the last
``retention_days`` of pages, each listed under the day of its newest entry
(``neardup.flow.expiry``).
"""

from __future__ import annotations

import math
import struct
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from neardup.config import EngineConfig
from neardup.flow.codec import decode, encode
from neardup.flow.expiry import DayList, day_of
from neardup.flow.messages import (
    PAGES,
    Answer,
    Mark,
    Out,
    Probe,
    WireError,
)
from neardup.flow.storeformat import decode_stored
from neardup.flow.watermark import ScanKV, Watermark
from neardup.index import ENTRY, KVIndex

#: Where the probes waiting for the watermark are kept (bucket keys start with a letter).
PREFIX = b"\x01b"
#: Where buckets are listed by the day of their newest entry (``sweep``).
EXPIRY = b"\x01x"
_ORDER = struct.Struct("<q")
_ORDER_AT = ENTRY.itemsize - 24  # the order's offset in an entry, from its end


def last_day(raw: bytes | None) -> int:
    """The fetch day of a bucket's last entry (-1: empty); entries go in in key order."""
    if not raw:
        return -1
    return day_of(_ORDER.unpack_from(raw, len(raw) - _ORDER_AT)[0])


def index_part(key: bytes) -> str:
    """The part of the index a bucket key belongs to, as ``KVIndex.capped`` counts it."""
    return {b"P": "simhash", b"S": "simhash", b"C": "strings", b"B": "minhash"}[key[:1]]


def probe_buckets(index: KVIndex, probe: Probe) -> Answer:
    """Answer ``probe`` from the buckets in ``index.kv``, then add its entry to them.
    A full bucket is counted in ``index.capped``."""
    keys = list(dict.fromkeys(probe.keys))
    before = dict(zip(keys, index.kv.get_many(keys), strict=True))
    writes: list[tuple[bytes, bytes]] = []
    for key in keys:
        new = index.appended(before[key], probe.entry)
        if new is None:
            index.capped[index_part(key)] += 1
        else:
            writes.append((key, new))
    if writes:
        index.kv.put_many(writes)
    return Answer(probe.key, probe.pid, probe.keys, tuple(before[k] for k in probe.keys))


class BucketsTask:
    """Partition ``partition`` of the probes topic, with its buckets in ``store``."""

    def __init__(
        self,
        store: ScanKV,
        cfg: EngineConfig,
        partition: int,
        partitions: int,
        *,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``partitions``: the number of hosts tasks (the sources of marks). ``wait``:
        ``order_wait`` (``neardup.flow.watermark``)."""
        self.partition = partition
        self.store = store
        self.index = KVIndex(store, cfg)
        self.watermark = Watermark(store, PREFIX, partitions, wait, clock)
        self.listed = DayList(store, EXPIRY)
        #: probes, late, expired (buckets deleted by ``sweep``), in this process; full
        #: buckets are in ``index.capped``
        self.counts: Counter[str] = Counter()
        self.load()

    def load(self) -> None:
        """Read the state from the store: at the start, and after an aborted step."""
        self.watermark.load()
        self.listed = DayList(self.store, EXPIRY)

    def step(self, raw: bytes, arrived: float = -math.inf) -> list[Out]:
        """Take one record of the task's probes partition, which reached it at ``arrived``
        (its timestamp, Unix seconds); the answers to send."""
        msg = decode(raw)
        if isinstance(msg, Mark):
            self.watermark.on_mark(msg)
        elif isinstance(msg, Probe):
            if not self.watermark.add(msg.key, raw, arrived, msg):
                self.counts["late"] += 1
        else:
            raise WireError(f"a {type(msg).__name__} does not belong on a probes partition")
        return self.release()

    def release(self) -> list[Out]:
        """The answers of every probe the watermark lets go now, in key order."""
        out: list[Out] = []
        for _, probe, _ in self.watermark.release_decoded(decode_stored):
            assert isinstance(probe, Probe)  # (only probes are held)
            answer = probe_buckets(self.index, probe)
            if self.index.retention_ms:
                self._list(day_of(probe.key[0]), answer)
            self.counts["probes"] += 1
            out.append(Out(PAGES, probe.page_partition, probe.key[1].encode(), encode(answer)))
        self.watermark.flush()  # what is still held, into the store before the commit
        return out

    def _list(self, day: int, answer: Answer) -> None:
        """List the probe's buckets under ``day``, the day of their newest entry now (one
        listing a bucket: it moves from the day of the entry that was newest)."""
        moved: dict[int, list[bytes]] = {}
        for key, value in zip(answer.keys, answer.values, strict=True):
            last = last_day(value)
            if last < day:
                moved.setdefault(last, []).append(key)
        for last, keys in moved.items():
            if last >= 0:
                self.listed.unnote(last, keys)
            self.listed.note(day, keys)

    def tick(self) -> list[Out]:
        """What the step ends with: the answers of the probes a wait over lets go, then
        the ``sweep``."""
        out = self.release()
        self.sweep()
        return out

    def sweep(self) -> int:
        """Delete the buckets whose every entry is older than ``retention_days`` before the
        greatest key released (as many as one step takes: ``DayList.take``); how many."""
        released = self.watermark.released
        if not self.index.retention_ms or released is None:
            return 0
        cutoff = released[0] - self.index.retention_ms
        keys = list(dict.fromkeys(self.listed.take(day_of(cutoff))))
        if not keys:
            return 0
        dead = [
            k
            for k, v in zip(keys, self.store.get_many(keys), strict=True)
            if v is not None and int(np.frombuffer(v, dtype=ENTRY)["order"].max()) < cutoff
        ]
        self.store.delete_many(dead)
        self.counts["expired"] += len(dead)
        return len(dead)
