"""Retention in the partitioned tasks: state listed by the day it last mattered, deleted
once the stream has moved ``retention_days`` past that day.

``neardup dedup`` forgets a page by fetch time, against the page it decides: an index
entry more than ``retention_days`` older than that page is not read (``KVIndex._live``),
and is dropped when its bucket is next written. A task here sees its items in key order
behind its watermark, so the greatest key it has released bounds every key still to
come (late items aside, which are outside the equivalence guarantee anyway): state that
no page at or after that key can read may go, and deciding stays as ``neardup dedup``
decides. ``DayList`` keeps, for each day, the keys written that day, so that a sweep reads
the keys that may have expired instead of scanning the whole store.

A page record is read by pages of other partitions too (their sketch asks), so a decide
task cannot tell from its own keys when no page will ask any more. The order task can:
its watermark is the least key any decide task may still compute matches for. It tells
every decide task the day that watermark reaches (``Horizon``: a ``Mark`` from
``ORDER_SOURCE``, once a day of the stream).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from neardup.flow.codec import encode
from neardup.flow.messages import (
    Key,
    Mark,
)

DAY_MS = 86_400_000
_DAY = struct.Struct(">I")
#: Keys a sweep takes in one step: the rest of a large day waits for the next step, so
#: that no step (one transaction) grows with a day's traffic.
SWEEP_LIMIT = 10_000
#: The source of the order task's marks on the pages partitions (``Horizon``).
ORDER_SOURCE = 0xFFFF_FFFF


class _Store(Protocol):
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None: ...

    def delete_many(self, keys: Iterable[bytes]) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


def day_of(order: int) -> int:
    """The day (since the epoch, UTC) of a fetch time in milliseconds
    (``neardup.template.fetch_day``'s rule)."""
    return max(0, order // DAY_MS)


class DayList:
    """Members (byte strings) listed under the days they were noted on, in ``store``
    under ``prefix`` (one empty value a member and day: noting costs a write, no read)."""

    def __init__(self, store: _Store, prefix: bytes) -> None:
        self.store, self.prefix = store, prefix
        #: Days before this one are known to hold nothing (in this process).
        self.clear_before = 0

    def note(self, day: int, members: Iterable[bytes]) -> None:
        self.clear_before = min(self.clear_before, day)  # (a late item's day)
        at = self.prefix + _DAY.pack(day)
        self.store.put_many((at + m, b"") for m in members)

    def unnote(self, day: int, members: Iterable[bytes]) -> None:
        """Unlist members from ``day`` (listed again on a later day)."""
        at = self.prefix + _DAY.pack(day)
        self.store.delete_many(at + m for m in members)

    def take(self, before_day: int, limit: int = SWEEP_LIMIT) -> list[bytes]:
        """Up to ``limit`` members listed on days before ``before_day``, unlisted (a member
        listed on several days comes once for each). Each day is read on its own, up to
        the limit: a step reads no more than it takes, whatever a day holds."""
        if before_day <= self.clear_before:
            return []
        n = len(self.prefix)
        day = self.clear_before
        if day == 0:  # (a new process: from the first day listed)
            first = next(iter(self.store.scan(self.prefix)), None)
            day = before_day if first is None else _DAY.unpack_from(first[0], n)[0]
        keys: list[bytes] = []
        while day < before_day and len(keys) < limit:
            for key, _ in self.store.scan(self.prefix + _DAY.pack(day)):
                keys.append(key)
                if len(keys) == limit:
                    break
            else:
                day += 1  # every member of the day taken
        self.clear_before = min(day, before_day)
        self.store.delete_many(keys)
        return [k[n + _DAY.size :] for k in keys]


class Horizon:
    """The order task's news for the decide tasks: the day its watermark has reached, a
    ``Mark`` for every pages partition whenever that day moves (none without retention)."""

    def __init__(self, retention_days: int, partitions: int) -> None:
        self.retention_days, self.partitions = retention_days, partitions
        self.day: int | None = None

    def marks(self, w: Key | None) -> list[tuple[int, bytes]]:
        """(pages partition, record) to send for the order task's watermark ``w``."""
        if not self.retention_days or w is None or day_of(w[0]) == self.day:
            return []
        self.day = day_of(w[0])
        raw = encode(Mark(ORDER_SOURCE, (self.day * DAY_MS, ""), None))
        return [(p, raw) for p in range(self.partitions)]
