"""The partitioned topology's messages, one a Kafka record, and where each one goes.

A record's first byte names the message's type, its second the format version; the rest
is packed with ``struct`` (little-endian; strings UTF-8 and bytes behind a 4-byte length).
Marks, edges and verdicts cross the one partition of the order topic, so they are
encoded without JSON. ``decode(encode(m)) == m`` for every message, except that an
analysed page travels without its body (no stage after analysis reads it).

Keys are ``(order, page_id)``: the one order in which the stages must see the pages.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import orjson

from neardup.analysis import Analysed
from neardup.kafka.wire import analysed_from_json, analysed_to_json

#: Bump when a message's layout changes; a reader refuses records of another version.
VERSION = 1

Key = tuple[int, str]  # (order, page_id)


class WireError(ValueError):
    """A record this version cannot read: a bug, or a mixed deployment."""


@dataclass(frozen=True, slots=True)
class Mark:
    """``source`` will send no more data with a key below ``frontier`` (None: it has sent
    nothing yet); ``drained_at``: when the mark was made, if the source had read all of
    its input then (Unix seconds), else None."""

    source: int
    frontier: Key | None
    drained_at: float | None


@dataclass(frozen=True, slots=True)
class PageIn:
    """An analysed page, analyse -> hosts."""

    key: Key
    analysed: Analysed


@dataclass(frozen=True, slots=True)
class Probe:
    """Page ``key``'s buckets in one probes partition: answer what ``keys`` hold from
    earlier pages, then add ``entry`` (``neardup.index.make_entry``'s bytes)."""

    key: Key
    pid: int
    page_partition: int
    keys: tuple[bytes, ...]
    entry: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """What ``keys`` held before page ``key`` (None: nothing)."""

    key: Key
    pid: int
    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class PageRecord:
    """What later pages read of a page: to verify against it and to name it."""

    page_id: str
    url: str
    order: int
    shingles: int
    sketch: bytes


@dataclass(frozen=True, slots=True)
class ToDecide:
    """A page for decision (``for_decision`` of the host step's page), the number of
    answers to expect, its record, and whether its hosts task had seen it before."""

    key: Key
    analysed: Analysed
    probes: int
    record: PageRecord
    repeat: bool


@dataclass(frozen=True, slots=True)
class SketchAsk:
    """Send page ``asker`` the records of ``pids``."""

    asker: Key
    asker_pid: int
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SketchReply:
    """Records of the pids asked for that are kept (pid, record)."""

    asker: Key
    asker_pid: int
    records: tuple[tuple[int, PageRecord], ...]


@dataclass(frozen=True, slots=True)
class EdgeMatch:
    """A ``neardup.decide.Match``, with the matched page's page id."""

    pid: int
    order: int
    page_id: str
    kind: str
    distance: int
    similarity: float
    share: float
    by_simhash: bool


@dataclass(frozen=True, slots=True)
class Edge:
    """Page ``key``'s verified matches, best first, and the shares it has with pages
    (``matches``' ``covered``)."""

    key: Key
    pid: int
    matches: tuple[EdgeMatch, ...]
    covered: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The cluster step's answer for page ``key``: the pids of the matches kept (best
    first), the cluster's root and the roots merged into it, as (pid, order, page_id)."""

    key: Key
    pid: int
    kept: tuple[int, ...]
    root: tuple[int, int, str]
    merged: tuple[tuple[int, int, str], ...]


Msg = Mark | PageIn | Probe | Answer | ToDecide | SketchAsk | SketchReply | Edge | Verdict


# -- where messages go ------------------------------------------------------------------

#: Logical topics of the tasks' outputs (the runtime names them ``<app>-...``).
HOSTS, PROBES, PAGES, ORDER = "hosts", "probes", "pages", "order"


class Out(NamedTuple):
    """A record to send: a logical topic, its partition (None: by key), key and value."""

    topic: str
    partition: int | None
    key: bytes
    value: bytes


def partition_of_pid(pid: int, n: int) -> int:
    """The pages partition of page ``pid`` (a 64-bit hash already: spread evenly)."""
    return pid % n


def partition_of_host(host: str, n: int) -> int:
    """The hosts partition of ``host`` (a stable hash, not Python's)."""
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % n


def partition_of_bucket(key: bytes, n: int) -> int:
    """The probes partition that owns bucket ``key`` (``neardup.kafka.route.route``'s rule)."""
    return zlib.crc32(key) % n


# -- the records: a type's tag, the version, then its fields, each by a codec that writes
# a value as bytes and reads it back ---------------------------------------------------------

_HEAD = struct.Struct("<BB")  # type tag, version
_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_I64, _F64 = struct.Struct("<q"), struct.Struct("<d")
#: ``EdgeMatch.kind`` on the wire: its index here (a kind is never removed nor moved).
_KINDS = ("unique", "duplicate", "contained", "contains")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, _HEAD.size

    def fixed(self, s: struct.Struct) -> tuple[Any, ...]:
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise WireError(f"cut short: {n} bytes wanted at {self.pos} of {len(self.buf)}")
        out, self.pos = self.buf[self.pos : end], end
        return out


class _Codec(NamedTuple):
    write: Callable[[list[bytes], Any], None]
    read: Callable[[_Reader], Any]


def _number(s: struct.Struct) -> _Codec:
    return _Codec(lambda out, v: out.append(s.pack(v)), lambda r: r.fixed(s)[0])


def _read_flag(r: _Reader) -> bool:
    (v,) = r.fixed(_U8)
    if v > 1:
        raise WireError(f"a flag of {v}")
    return bool(v)


def _write_bytes(out: list[bytes], v: bytes) -> None:
    out += (_U32.pack(len(v)), v)


def _read_bytes(r: _Reader) -> bytes:
    return r.take(r.fixed(_U32)[0])


def _with_text(s: struct.Struct) -> _Codec:
    """A tuple of numbers then a text, as ``s`` (which ends with the text's length) and
    the text."""

    def write(out: list[bytes], v: tuple[Any, ...]) -> None:
        text = v[-1].encode("utf-8")
        out += (s.pack(*v[:-1], len(text)), text)

    def read(r: _Reader) -> tuple[Any, ...]:
        *numbers, n = r.fixed(s)
        return (*numbers, r.take(n).decode("utf-8"))

    return _Codec(write, read)


def _write_u64s(out: list[bytes], v: tuple[int, ...]) -> None:
    out += (_U32.pack(len(v)), struct.pack(f"<{len(v)}Q", *v))


def _read_u64s(r: _Reader) -> tuple[int, ...]:
    (n,) = r.fixed(_U32)
    return struct.unpack(f"<{n}Q", r.take(8 * n))


# A match goes as one struct (an edge carries several, and the order task reads every
# edge): a field codec apiece would cost twice the time.
_MATCH = struct.Struct("<QqBiddBI")  # pid, order, kind, distance, similarity, share,
# by_simhash, the page id's length (then the page id)


def _write_match(out: list[bytes], x: EdgeMatch) -> None:
    if x.kind not in _KINDS:
        raise ValueError(f"no match is of kind {x.kind!r}")
    page_id = x.page_id.encode("utf-8")
    kind = _KINDS.index(x.kind)
    head = (x.pid, x.order, kind, x.distance, x.similarity, x.share, x.by_simhash, len(page_id))
    out += (_MATCH.pack(*head), page_id)


def _read_match(r: _Reader) -> EdgeMatch:
    pid, order, kind, distance, similarity, share, by_simhash, n = r.fixed(_MATCH)
    if by_simhash > 1:
        raise WireError(f"a flag of {by_simhash}")
    page_id = r.take(n).decode("utf-8")
    return EdgeMatch(
        pid, order, page_id, _KINDS[kind], distance, similarity, share, by_simhash == 1
    )


def _optional(c: _Codec) -> _Codec:
    def write(out: list[bytes], v: Any) -> None:
        out.append(b"\x00" if v is None else b"\x01")
        if v is not None:
            c.write(out, v)

    return _Codec(write, lambda r: c.read(r) if _read_flag(r) else None)


def _many(c: _Codec) -> _Codec:
    def write(out: list[bytes], v: tuple[Any, ...]) -> None:
        out.append(_U32.pack(len(v)))
        for x in v:
            c.write(out, x)

    return _Codec(write, lambda r: tuple(c.read(r) for _ in range(r.fixed(_U32)[0])))


def _tuple(*cs: _Codec) -> _Codec:
    def write(out: list[bytes], v: tuple[Any, ...]) -> None:
        for c, x in zip(cs, v, strict=True):
            c.write(out, x)

    return _Codec(write, lambda r: tuple(c.read(r) for c in cs))


def _record(cls: type[Any], *cs: _Codec) -> _Codec:
    """A dataclass, by its fields in order."""
    names = [f.name for f in fields(cls)]
    assert len(names) == len(cs), cls

    def write(out: list[bytes], v: Any) -> None:
        for c, name in zip(cs, names, strict=True):
            c.write(out, getattr(v, name))

    return _Codec(write, lambda r: cls(*[c.read(r) for c in cs]))


U32, U64, I64, F64 = map(_number, (_U32, _U64, _I64, _F64))
FLAG = _Codec(lambda out, v: out.append(b"\x01" if v else b"\x00"), _read_flag)
BYTES = _Codec(_write_bytes, _read_bytes)
TEXT = _Codec(
    lambda out, v: _write_bytes(out, v.encode("utf-8")), lambda r: _read_bytes(r).decode()
)
KEY = _with_text(struct.Struct("<qI"))  # order, page id
U64S = _Codec(_write_u64s, _read_u64s)
# An analysed page goes as its JSON (``neardup.kafka.wire``), which carries every field of
# ``Analysed`` and ``Fingerprints`` by its type: a field the engine adds travels with no
# change here. It crosses a hosts or pages partition, never the order topic.
ANALYSED = _Codec(
    lambda out, a: _write_bytes(out, orjson.dumps(analysed_to_json(a))),
    lambda r: analysed_from_json(orjson.loads(_read_bytes(r))),
)
RECORD = _record(PageRecord, TEXT, TEXT, I64, U32, BYTES)
PAGE_KEY = _with_text(struct.Struct("<QqI"))  # pid, order, page id

#: Every message type; a type's tag is its place here, from 1. Never reuse a tag.
_TYPES: list[tuple[type[Any], _Codec]] = [
    (Mark, _record(Mark, U32, _optional(KEY), _optional(F64))),
    (PageIn, _record(PageIn, KEY, ANALYSED)),
    (Probe, _record(Probe, KEY, U64, U32, _many(BYTES), BYTES)),
    (Answer, _record(Answer, KEY, U64, _many(BYTES), _many(_optional(BYTES)))),
    (ToDecide, _record(ToDecide, KEY, ANALYSED, U32, RECORD, FLAG)),
    (SketchAsk, _record(SketchAsk, KEY, U64, U64S)),
    (SketchReply, _record(SketchReply, KEY, U64, _many(_tuple(U64, RECORD)))),
    (
        Edge,
        _record(
            Edge,
            KEY,
            U64,
            _many(_Codec(_write_match, _read_match)),
            _many(_tuple(U64, F64)),
        ),
    ),
    (Verdict, _record(Verdict, KEY, U64, U64S, PAGE_KEY, _many(PAGE_KEY))),
]
_BY_TYPE = {cls: (_HEAD.pack(tag, VERSION), c.write) for tag, (cls, c) in enumerate(_TYPES, 1)}


def encode(msg: Msg) -> bytes:
    """The record of ``msg``. ``struct.error`` or ``ValueError`` for a message no record
    can hold (a pid beyond 64 bits, a lone surrogate): a bug in the sender."""
    if isinstance(msg, Answer) and len(msg.keys) != len(msg.values):
        raise ValueError(f"an answer has {len(msg.keys)} keys and {len(msg.values)} values")
    head, write = _BY_TYPE[type(msg)]
    out = [head]
    write(out, msg)
    return b"".join(out)


def decode(raw: bytes) -> Msg:
    """The message in record ``raw``; ``WireError`` if this version cannot read it."""
    if len(raw) < _HEAD.size:
        raise WireError(f"a record of {len(raw)} bytes holds no message")
    tag, version = _HEAD.unpack_from(raw)
    if version != VERSION:
        raise WireError(f"message format version {version}; this version reads {VERSION}")
    if not 0 < tag <= len(_TYPES):
        raise WireError(f"unknown message type {tag}")
    cls, codec = _TYPES[tag - 1]
    r = _Reader(raw)
    try:
        msg: Msg = codec.read(r)
    except WireError:
        raise
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise WireError(f"malformed {cls.__name__}: {exc}") from exc
    if r.pos != len(raw):
        raise WireError(f"{len(raw) - r.pos} bytes left over after a {cls.__name__}")
    return msg
