"""The partitioned topology's messages as Kafka records: ``encode`` and ``decode``.

A record's first byte names the message's type, its second the format version; the rest
is packed with ``struct`` (little-endian; strings UTF-8 and bytes behind a 4-byte length).
Marks, edges and verdicts cross the one partition of the order topic, so they are
encoded by hand, without JSON. ``decode(encode(m)) == m`` for every message, except that
an analysed page travels without its body (no stage after analysis reads it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from neardup.analysis import Analysed
from neardup.flow.analysed_wire import analysed_join, analysed_split
from neardup.flow.messages import (
    Answer,
    Edge,
    EdgeMatch,
    Key,
    Mark,
    Msg,
    PageIn,
    PageRecord,
    Probe,
    SketchAsk,
    SketchReply,
    ToDecide,
    Verdict,
    WireError,
)

#: Bump when a message's layout changes; a reader refuses records of another version.
VERSION = 2


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
_MATCH_SIZE = _MATCH.size
_SHARE = struct.Struct("<Qd")  # an edge's ``covered`` pair: pid, share


def _write_match(out: list[bytes], x: EdgeMatch) -> None:
    if x.kind not in _KINDS:
        raise ValueError(f"no match is of kind {x.kind!r}")
    page_id = x.page_id.encode("utf-8")
    kind = _KINDS.index(x.kind)
    head = (x.pid, x.order, kind, x.distance, x.similarity, x.share, x.by_simhash, len(page_id))
    out += (_MATCH.pack(*head), page_id)


# Marks, edges and verdicts: each the order task reads or writes once a page, so each has
# a codec of its own, written out, that makes the same bytes as the field codecs would
# (the generic path took 3 to 5 times as long). Layouts, after the type's head:
# - Mark: source (u32); frontier (flag, then order i64, page id's length u32, page id);
#   drained_at (flag, then f64)
# - Edge: order i64, page id's length u32, page id; pid u64; matches (u32 count, each
#   ``_MATCH`` and its page id); covered (u32 count, each pid u64 and share f64)
# - Verdict: order, page id as in an edge; pid u64; kept (u32 count, u64 each); root
#   (``_PAGE_KEY`` and page id); merged (u32 count, each as root)
_KEY_HEAD = struct.Struct("<qI")
_PID_COUNT = struct.Struct("<QI")
_PAGE_KEY = struct.Struct("<QqI")
_FLAG_F64 = struct.Struct("<Bd")
_new_tuple = tuple.__new__
#: A verdict's pid, kept pids and root's head, by the number kept (a compiled ``Struct``
#: packs in a fifth of the time of ``struct.pack`` given the format).
_VERDICT_MIDDLE = [struct.Struct(f"<QI{n}QQqI") for n in range(16)]


def _text_at(buf: bytes, pos: int, n: int) -> str:
    end = pos + n
    if end > len(buf):
        raise WireError(f"cut short: {n} bytes wanted at {pos} of {len(buf)}")
    return buf[pos:end].decode("utf-8")


def _write_mark(out: list[bytes], v: Mark) -> None:
    out.append(_U32.pack(v.source))
    if v.frontier is None:
        out.append(b"\x00")
    else:
        order, page_id = v.frontier
        text = page_id.encode("utf-8")
        out += (b"\x01", _KEY_HEAD.pack(order, len(text)), text)
    out.append(b"\x00" if v.drained_at is None else _FLAG_F64.pack(1, v.drained_at))


def _read_mark(r: _Reader) -> Mark:
    buf = r.buf
    source, flag = struct.unpack_from("<IB", buf, r.pos)
    pos = r.pos + 5
    frontier: Key | None = None
    if flag == 1:
        order, n = _KEY_HEAD.unpack_from(buf, pos)
        frontier = (order, _text_at(buf, pos + 12, n))
        pos += 12 + n
    elif flag:
        raise WireError(f"a flag of {flag}")
    (flag,) = _U8.unpack_from(buf, pos)
    drained_at = None
    if flag == 1:
        (drained_at,) = _F64.unpack_from(buf, pos + 1)
        pos += 8
    elif flag:
        raise WireError(f"a flag of {flag}")
    r.pos = pos + 1
    return Mark(source, frontier, drained_at)


def _write_edge(out: list[bytes], v: Edge) -> None:
    order, page_id = v.key
    text = page_id.encode("utf-8")
    out += (_KEY_HEAD.pack(order, len(text)), text, _PID_COUNT.pack(v.pid, len(v.matches)))
    for m in v.matches:
        _write_match(out, m)
    covered = v.covered
    out.append(_U32.pack(len(covered)))
    if covered:
        out.append(struct.pack(f"<{'Qd' * len(covered)}", *(x for c in covered for x in c)))


def _read_edge(r: _Reader) -> Edge:
    buf, pos = r.buf, r.pos
    size = len(buf)
    order, n = _KEY_HEAD.unpack_from(buf, pos)
    page_id = _text_at(buf, pos + 12, n)
    pid, count = _PID_COUNT.unpack_from(buf, pos + 12 + n)
    pos += 24 + n
    matches = []
    unpack = _MATCH.unpack_from
    for _ in range(count):
        mpid, morder, kind, distance, similarity, share, by_simhash, n = unpack(buf, pos)
        if by_simhash > 1:
            raise WireError(f"a flag of {by_simhash}")
        pos += _MATCH_SIZE
        end = pos + n
        if end > size:
            raise WireError(f"cut short: {n} bytes wanted at {pos} of {size}")
        # the order task decodes every match: tuple.__new__ spares the named tuple's own
        # constructor, a Python call a match
        fields = (mpid, morder, buf[pos:end].decode("utf-8"), _KINDS[kind], distance,
                  similarity, share, by_simhash == 1)  # fmt: skip
        matches.append(_new_tuple(EdgeMatch, fields))
        pos = end
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    end = pos + _SHARE.size * count
    if end > size:
        raise WireError(f"cut short: {count} shares at {pos} of {size}")
    r.pos = end
    covered = tuple(_SHARE.iter_unpack(buf[pos:end]))
    return _new_tuple(Edge, ((order, page_id), pid, tuple(matches), covered))


def _write_page_key(out: list[bytes], k: tuple[int, int, str]) -> None:
    text = k[2].encode("utf-8")
    out += (_PAGE_KEY.pack(k[0], k[1], len(text)), text)


def _write_verdict(out: list[bytes], v: Verdict) -> None:
    order, page_id = v.key
    text = page_id.encode("utf-8")
    kept, (root_pid, root_order, root_id), merged = v.kept, v.root, v.merged
    root = root_id.encode("utf-8")
    # pid, kept and the root's head in one pack: a verdict is written for every edge
    n = len(kept)
    layout = _VERDICT_MIDDLE[n] if n < len(_VERDICT_MIDDLE) else struct.Struct(f"<QI{n}QQqI")
    middle = layout.pack(v.pid, n, *kept, root_pid, root_order, len(root))
    out += (_KEY_HEAD.pack(order, len(text)), text, middle, root, _U32.pack(len(merged)))
    for k in merged:
        _write_page_key(out, k)


def _read_page_key(buf: bytes, pos: int) -> tuple[tuple[int, int, str], int]:
    pid, order, n = _PAGE_KEY.unpack_from(buf, pos)
    pos += _PAGE_KEY.size
    return (pid, order, _text_at(buf, pos, n)), pos + n


def _read_verdict(r: _Reader) -> Verdict:
    buf, pos = r.buf, r.pos
    order, n = _KEY_HEAD.unpack_from(buf, pos)
    page_id = _text_at(buf, pos + 12, n)
    pid, count = _PID_COUNT.unpack_from(buf, pos + 12 + n)
    pos += 24 + n
    if pos + 8 * count > len(buf):
        raise WireError(f"cut short: {count} pids at {pos} of {len(buf)}")
    kept = struct.unpack_from(f"<{count}Q", buf, pos)
    root, pos = _read_page_key(buf, pos + 8 * count)
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    merged = []
    for _ in range(count):
        k, pos = _read_page_key(buf, pos)
        merged.append(k)
    r.pos = pos
    return Verdict((order, page_id), pid, kept, root, tuple(merged))


# Probes and answers: a page's buckets, some thirty keys each (and their values), which
# a field codec apiece would read in a Python call or three a key.
# - Probe: key as in an edge; pid u64; page partition u32; keys (u32 count, each as u32
#   length and bytes); entry (u32 length and bytes)
# - Answer: key, pid; keys as in a probe; values (u32 count, each a flag, then if set as
#   a key)
_PID_PART = struct.Struct("<QI")


def _write_key_pid(out: list[bytes], key: Key, pid: int) -> None:
    text = key[1].encode("utf-8")
    out += (_KEY_HEAD.pack(key[0], len(text)), text, _U64.pack(pid))


def _write_blobs(out: list[bytes], blobs: tuple[bytes, ...]) -> None:
    out.append(_U32.pack(len(blobs)))
    for b in blobs:
        out += (_U32.pack(len(b)), b)


def _read_key(buf: bytes, pos: int) -> tuple[Key, int]:
    order, n = _KEY_HEAD.unpack_from(buf, pos)
    return (order, _text_at(buf, pos + 12, n)), pos + 12 + n


def _read_blobs(buf: bytes, pos: int, optional: bool = False) -> tuple[tuple[Any, ...], int]:
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    size, unpack = len(buf), _U32.unpack_from
    out: list[bytes | None] = []
    for _ in range(count):
        if optional:
            flag = buf[pos]
            pos += 1
            if not flag:
                out.append(None)
                continue
            if flag > 1:
                raise WireError(f"a flag of {flag}")
        (n,) = unpack(buf, pos)
        pos += 4
        end = pos + n
        if end > size:
            raise WireError(f"cut short: {n} bytes wanted at {pos} of {size}")
        out.append(buf[pos:end])
        pos = end
    return tuple(out), pos


def _write_probe(out: list[bytes], v: Probe) -> None:
    _write_key_pid(out, v.key, v.pid)
    out.append(_U32.pack(v.page_partition))
    _write_blobs(out, v.keys)
    out += (_U32.pack(len(v.entry)), v.entry)


def _read_probe(r: _Reader) -> Probe:
    buf = r.buf
    key, pos = _read_key(buf, r.pos)
    pid, part = _PID_PART.unpack_from(buf, pos)
    keys, pos = _read_blobs(buf, pos + 12)
    (n,) = _U32.unpack_from(buf, pos)
    r.pos = pos + 4
    return _new_tuple(Probe, (key, pid, part, keys, r.take(n)))


def _write_answer(out: list[bytes], v: Answer) -> None:
    _write_key_pid(out, v.key, v.pid)
    _write_blobs(out, v.keys)
    out.append(_U32.pack(len(v.values)))
    for b in v.values:
        out += (b"\x00",) if b is None else (b"\x01", _U32.pack(len(b)), b)


def _read_answer(r: _Reader) -> Answer:
    buf = r.buf
    key, pos = _read_key(buf, r.pos)
    (pid,) = _U64.unpack_from(buf, pos)
    keys, pos = _read_blobs(buf, pos + 8)
    values, r.pos = _read_blobs(buf, pos, optional=True)
    return _new_tuple(Answer, (key, pid, keys, values))


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
    """A message, by its fields in order."""
    assert len(cls._fields) == len(cs), cls

    def write(out: list[bytes], v: Any) -> None:
        for c, x in zip(cs, v, strict=True):
            c.write(out, x)

    return _Codec(write, lambda r: cls(*[c.read(r) for c in cs]))


U32, U64, I64, F64 = map(_number, (_U32, _U64, _I64, _F64))
FLAG = _Codec(lambda out, v: out.append(b"\x01" if v else b"\x00"), _read_flag)
BYTES = _Codec(_write_bytes, _read_bytes)
TEXT = _Codec(
    lambda out, v: _write_bytes(out, v.encode("utf-8")), lambda r: _read_bytes(r).decode()
)
KEY = _with_text(struct.Struct("<qI"))  # order, page id
U64S = _Codec(_write_u64s, _read_u64s)
# An analysed page goes as its JSON (``neardup.flow.analysed_wire``), which carries every
# field of ``Analysed`` and ``Fingerprints`` by its type: a field the engine adds travels
# with no change here. It crosses a hosts or pages partition, never the order topic. The
# fingerprints' byte strings (most of it) follow the JSON as they are, as probe keys do.


def _write_analysed(out: list[bytes], a: Analysed) -> None:
    obj, blobs = analysed_split(a)
    _write_bytes(out, orjson.dumps(obj))
    _write_blobs(out, tuple(blobs))


def _read_analysed(r: _Reader) -> Analysed:
    obj = orjson.loads(_read_bytes(r))
    blobs, r.pos = _read_blobs(r.buf, r.pos)
    return analysed_join(obj, list(blobs))


ANALYSED = _Codec(_write_analysed, _read_analysed)
RECORD = _record(PageRecord, TEXT, TEXT, I64, U32, BYTES)
#: Probes and answers by the field codecs: the bytes their own codecs must make.
FIELD_CODECS = {
    Probe: _record(Probe, KEY, U64, U32, _many(BYTES), BYTES),
    Answer: _record(Answer, KEY, U64, _many(BYTES), _many(_optional(BYTES))),
}

#: Every message type; a type's tag is its place here, from 1. Never reuse a tag.
_TYPES: list[tuple[type[Any], _Codec]] = [
    (Mark, _Codec(_write_mark, _read_mark)),
    (PageIn, _record(PageIn, KEY, ANALYSED)),
    (Probe, _Codec(_write_probe, _read_probe)),
    (Answer, _Codec(_write_answer, _read_answer)),
    (ToDecide, _record(ToDecide, KEY, ANALYSED, U32, FLAG)),
    (SketchAsk, _record(SketchAsk, KEY, U64, U64S)),
    (SketchReply, _record(SketchReply, KEY, U64, _many(_tuple(U64, RECORD)))),
    (Edge, _Codec(_write_edge, _read_edge)),
    (Verdict, _Codec(_write_verdict, _read_verdict)),
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
