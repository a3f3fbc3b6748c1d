"""The sequencer's partition, taken strictly in offset order.

The sequencer's decisions depend on the order of its messages: a mark handled before a
page it does not vouch for releases the pages after that page too early, and the page
then comes late (a different match named, or none). Faust hands a partition's messages
over in offset order, but not always all of them: one skipped around a rebalance, or
passed over as read when a batch fetched before a seek comes after it, leaves a hole,
and the messages after the hole arrive first (``Worker.unstick`` reads the partition
again from the hole later). Seen once in CI: the message at offset 2 of the sequencer
topic came after those from 3 on, and 8 pages named a different match.

So the sequencer takes a message only if it is the next one: the offset after the last
one it took, or past offsets that hold no message (the broker said so:
``faustfix.mark_absent``; the sequencer topic is not transactional, so only retention
makes those). A message past a hole is left unacknowledged, to come again, in order,
when the partition is read again from the hole. A message below the next offset was
taken already (a copy read again): it is acknowledged and not taken twice.

Before the sequencer's partition has a committed offset (the group's first seconds:
Faust also keeps a commit of offset 0 as none), where reading began is not known here:
the first message taken is where the order starts, and a message below it is taken
late, as before this check, rather than passed over.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple


class Order(enum.Enum):
    """What to do with a message, by its offset."""

    TAKE = "take"  # the next one: handle it
    AGAIN = "again"  # taken before: acknowledge it, nothing else
    AHEAD = "ahead"  # past a hole: leave it unacknowledged, to be read again
    LATE = "late"  # below where taking began, with no committed offset: handle it late


class Hole(NamedTuple):
    """An open hole of a partition: from the first message left for being past it to the
    next message taken."""

    at: int  # the offset waited for: the message there was dropped on the way
    left: int  # the first message left past it
    since: float  # when it opened (``time.monotonic``)


def in_order(
    expected: int | None,
    offset: int,
    absent: Callable[[int, int], bool],
    start: int | None = None,
) -> Order:
    """Whether the message at ``offset`` comes next, after the last one taken (the next
    offset expected: ``expected``; None: nothing taken yet and no commit to start from).
    ``absent(begin, end)`` says whether every offset from ``begin`` up to ``end`` holds no
    message, or was committed past. ``start``: where taking began with no committed
    offset to check it against (Faust keeps a commit of offset 0 as none), so that a
    message below it may never have been taken; None: taking began at the committed
    offset, and every offset below ``expected`` was taken or committed past."""
    if expected is None or offset == expected:
        return Order.TAKE
    if offset < expected:
        return Order.LATE if start is not None and offset < start else Order.AGAIN
    return Order.TAKE if absent(expected, offset) else Order.AHEAD
