"""What a decide task keeps (``neardup.flow.decide``): page records with their decisions,
what has come so far for a page not decided yet, and the hosts tasks' marks. Values are
packed for the task's store; messages inside them keep their wire encoding. Their layout
is part of the store's format (``neardup.flow.storeformat``): a change to it bumps that.
A stored value that does not unpack is ``StateError``, which stops the worker: replaying
the step would read it again."""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from typing import Any

from neardup.decide import Kind, Match
from neardup.flow.codec import decode, encode
from neardup.flow.messages import (
    Answer,
    Edge,
    EdgeMatch,
    Mark,
    PageRecord,
    SketchReply,
    ToDecide,
    WireError,
)
from neardup.flow.storeformat import current, describe
from neardup.store import StateError

_REC_HEAD = struct.Struct("<qqIIII")  # order, touched, shingles; page id, url, sketch lengths
_PAGE_HEAD = struct.Struct("<iII?")  # replies to expect (-1: not asked), answers to drop,
# answers and replies held, an edge sent (then its Edge and a SketchReply of names)
_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Stored:
    """A page's record, and its decision as published (empty: not decided yet);
    ``touched``: the latest fetch time its id came with (None: the record's own), from
    which retention counts."""

    record: PageRecord
    decision: bytes
    touched: int | None = None

    @property
    def last(self) -> int:
        return self.record.order if self.touched is None else self.touched

    def pack(self) -> bytes:
        r = self.record
        page_id, url = r.page_id.encode(), r.url.encode()
        sizes = (len(page_id), len(url), len(r.sketch))
        head = _REC_HEAD.pack(r.order, self.last, r.shingles, *sizes)
        return b"".join((head, page_id, url, r.sketch, self.decision))

    @classmethod
    def unpack(cls, raw: bytes) -> Stored:
        try:
            order, touched, shingles, *sizes = _REC_HEAD.unpack_from(raw)
            cuts = [_REC_HEAD.size]
            for n in sizes:
                cuts.append(cuts[-1] + n)
            if cuts[-1] > len(raw):
                raise ValueError(f"its fields need {cuts[-1]} bytes")
            page_id, url, sketch = (raw[a:b] for a, b in itertools.pairwise(cuts))
            record = PageRecord(page_id.decode(), url.decode(), order, shingles, sketch)
        except (struct.error, ValueError) as exc:
            raise _unreadable("page record", raw, exc) from exc
        return cls(record, raw[cuts[-1] :], None if touched == order else touched)


@dataclass(slots=True)
class Pending:
    """What has come for a page not decided yet (a ToDecide, a page's answers, or both)."""

    todo: ToDecide | None = None
    answers: list[Answer] = field(default_factory=list)
    #: Sketch replies to expect (None: not asked yet).
    asked: int | None = None
    replies: list[SketchReply] = field(default_factory=list)
    #: Answers still to come for a repeated page id's probes: dropped, they decide nothing.
    drop: int = 0
    #: The edge sent to the order task, and the names (records without sketch) it matched.
    edge: Edge | None = None
    names: dict[int, PageRecord] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        """Its matches are still to compute: it holds the task's mark back."""
        return self.edge is None and not (self.todo is None and self.drop)

    def pack(self) -> bytes:
        msgs: list[Any] = [*self.answers, *self.replies]
        if self.edge is not None:
            msgs += [self.edge, SketchReply(self.edge.key, self.edge.pid, (*self.names.items(),))]
        asked = -1 if self.asked is None else self.asked
        parts = [_PAGE_HEAD.pack(asked, self.drop, len(msgs), self.edge is not None)]
        for raw in map(encode, msgs):
            parts += (_U32.pack(len(raw)), raw)
        return b"".join(parts)

    @classmethod
    def unpack(cls, todo: ToDecide | None, raw: bytes) -> Pending:
        try:
            asked, drop, n, has_edge = _PAGE_HEAD.unpack_from(raw)
            msgs, at = [], _PAGE_HEAD.size
            for _ in range(n):
                (size,) = _U32.unpack_from(raw, at)
                msgs.append(decode(raw[at + _U32.size : at + _U32.size + size]))
                at += _U32.size + size
            if at != len(raw):
                raise ValueError(f"{len(raw) - at} bytes after {n} messages")
            page = cls(todo, asked=None if asked < 0 else asked, drop=drop)
            if has_edge:
                *msgs, edge, names = msgs
                if not (isinstance(edge, Edge) and isinstance(names, SketchReply)):
                    raise ValueError("no edge and names where its flag says")
                page.edge, page.names = edge, dict(names.records)
        except (struct.error, ValueError) as exc:  # (WireError is a ValueError)
            raise _unreadable("pending page", raw, exc) from exc
        page.answers = [m for m in msgs if isinstance(m, Answer)]
        page.replies = [m for m in msgs if isinstance(m, SketchReply)]
        return page


def _unreadable(what: str, raw: bytes, exc: Exception) -> StateError:
    return StateError(
        f"a stored {what} of {len(raw)} bytes does not unpack ({exc}): the task's store is "
        f"damaged, or not of this version's {describe(current())} (docs/kafka.md, Upgrading)"
    )


class Sources:
    """The hosts tasks' latest marks: whether every one of them is drained, and since when."""

    def __init__(self, sources: int) -> None:
        self.sources = sources
        self.marks: dict[int, Mark] = {}

    def on_mark(self, mark: Mark) -> None:
        if not 0 <= mark.source < self.sources:
            raise WireError(f"a mark from source {mark.source}, not in 0..{self.sources - 1}")
        self.marks[mark.source] = mark

    def drained_at(self) -> float | None:
        """The oldest time a source was drained at, if every one was. A mark downstream
        vouches no later than its sources did: else an edge that reached the order task
        after that time would overtake a page still upstream."""
        times = [m.drained_at for m in self.marks.values()]
        if len(times) < self.sources or None in times:
            return None
        return min(t for t in times if t is not None)


def edge_match(m: Match, page_id: str) -> EdgeMatch:
    return EdgeMatch(
        m.pid, m.order, page_id, str(m.kind), m.distance, m.similarity, m.share, m.by_simhash
    )


def match_of(m: EdgeMatch) -> Match:
    return Match(m.pid, Kind(m.kind), m.distance, m.similarity, m.order, m.by_simhash, m.share)


def name_of(r: PageRecord) -> PageRecord:
    """What a decision reads of a matched page: its page id and URL."""
    return PageRecord(r.page_id, r.url, r.order, r.shingles, b"")
