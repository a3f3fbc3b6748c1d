"""What a decide task keeps (``neardup.flow.decide``): page records with their decisions,
what has come so far for a page not decided yet (each answer and sketch reply under a key
of its own, as it came: a page's held messages are written once, not again with each
one that comes), and the hosts tasks' marks. Values are
packed for the task's store; messages inside them keep their wire encoding. Their layout
is part of the store's format (``neardup.flow.storeformat``): a change to it bumps that.
A stored value that does not unpack is ``StateError``, which stops the worker: replaying
the step would read it again."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from neardup.analysis import Analysed
from neardup.decide import Kind, Match
from neardup.facts import with_facts
from neardup.flow.codec import decode, encode
from neardup.flow.messages import (
    Answer,
    Edge,
    EdgeMatch,
    Key,
    Mark,
    PageRecord,
    SketchReply,
    ToDecide,
    WireError,
)
from neardup.flow.storeformat import unreadable
from neardup.flow.watermark import key_bytes, key_from_bytes
from neardup.store import StateError

_REC_HEAD = struct.Struct("<qqIIII")  # order, touched, shingles; page id, url, sketch lengths
_PAGE_HEAD = struct.Struct("<iII?")  # replies to expect (-1: not asked), answers to drop,
# messages after it, an edge sent (then its Edge and a SketchReply of names)
_U32 = struct.Struct("<I")

#: Where a page's answers and sketch replies are kept: ``heard_key``.
HEARD = b"N"
#: A held message's kind, after its page's key.
ANSWER, REPLY = b"a", b"r"
_N = struct.Struct(">I")


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
            raise unreadable("page record", raw, exc) from exc
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
        """All but its answers and replies (``heard_key``)."""
        msgs: list[Any] = []
        if self.edge is not None:
            msgs += [self.edge, SketchReply(self.edge.key, self.edge.pid, (*self.names.items(),))]
        asked = -1 if self.asked is None else self.asked
        parts = [_PAGE_HEAD.pack(asked, self.drop, len(msgs), self.edge is not None)]
        for raw in map(encode, msgs):
            parts += (_U32.pack(len(raw)), raw)
        return b"".join(parts)

    @classmethod
    def unpack(
        cls,
        todo: ToDecide | None,
        raw: bytes,
        answers: Sequence[bytes] = (),
        replies: Sequence[bytes] = (),
    ) -> Pending:
        """The page ``pack`` made ``raw`` of, with the records of its answers and replies
        (``load_heard``)."""
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
            msgs += [decode(r) for r in (*answers, *replies)]
            if has_edge:
                edge, names, *msgs = msgs
                if not (isinstance(edge, Edge) and isinstance(names, SketchReply)):
                    raise ValueError("no edge and names where its flag says")
                page.edge, page.names = edge, dict(names.records)
        except (struct.error, ValueError) as exc:  # (WireError is a ValueError)
            raise unreadable("pending page", raw, exc) from exc
        page.answers = [m for m in msgs if isinstance(m, Answer)]
        page.replies = [m for m in msgs if isinstance(m, SketchReply)]
        return page


def heard_key(key: Key, kind: bytes, n: int) -> bytes:
    """Where page ``key``'s ``n``-th answer (``kind`` ``ANSWER``) or sketch reply
    (``REPLY``) is kept."""
    return HEARD + key_bytes(key) + kind + _N.pack(n)


def heard_keys(key: Key, page: Pending) -> list[bytes]:
    """Where ``page``'s answers and replies are kept."""
    return [heard_key(key, ANSWER, n) for n in range(len(page.answers))] + [
        heard_key(key, REPLY, n) for n in range(len(page.replies))
    ]


def load_heard(
    items: Iterable[tuple[bytes, bytes]],
) -> dict[Key, tuple[list[bytes], list[bytes]]]:
    """The records of the answers and replies kept under ``HEARD`` (a scan, in key
    order), by page: (answers, replies), each in the order they came."""
    out: dict[Key, tuple[list[bytes], list[bytes]]] = {}
    tail = 1 + _N.size
    for k, v in items:
        key, kind = key_from_bytes(k[len(HEARD) : -tail]), k[-tail : -_N.size]
        answers, replies = out.setdefault(key, ([], []))
        if kind not in (ANSWER, REPLY):
            raise StateError(f"a held message of kind {kind!r} under page {key}")
        (answers if kind == ANSWER else replies).append(v)
    return out


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


def page_record(a: Analysed) -> PageRecord:
    """What later pages read of ``a`` (its fingerprints after the host step): its sketch
    with its facts, as the engine's index keeps them (``KVIndex.sketch_value``)."""
    sketch = with_facts(a.fps.sketch, a.fps.facts)
    return PageRecord(a.page.page_id, a.page.url, a.order, a.fps.shingles, sketch)


def name_of(r: PageRecord) -> PageRecord:
    """What a decision reads of a matched page: its page id and URL."""
    return PageRecord(r.page_id, r.url, r.order, r.shingles, b"")
