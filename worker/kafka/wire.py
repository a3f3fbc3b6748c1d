"""The worker's internal messages: analysed pages in a compact binary form, the small
messages (marks, probes, answers) as JSON.

An ``Analysed`` page travels without its body (the stateful stages never read it); its
other fields go by their types, in the order the dataclasses declare them: strings as
UTF-8, integers exactly (any size, any sign), bytes as they are, hash tuples as uint64
arrays. ``decode(encode(m)) == m`` for every message (bodies aside). The binary form is
about a third of the JSON-and-base64 one and several times cheaper to write and read; a
page's form is stored as received (the sequencer's pending pages) without a re-encoding.

Version 2 of the format; a reader refuses messages of another version, so internal topics
written by version 1 (JSON pages) must be drained or deleted before an upgrade.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import orjson

from worker.engine import Analysed
from worker.fingerprint import Fingerprints
from worker.records import RawPage

#: Bump when a field changes meaning; a reader refuses messages of another version.
WIRE_VERSION = 2


class WireError(ValueError):
    """An internal message this version cannot read: a bug or a mixed deployment."""


# -- analysed pages, binary ------------------------------------------------------------------

_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_NONE = 0xFFFFFFFF  # the length of a missing string
_U64_MAX = (1 << 64) - 1


class _Reader:
    """A cursor over a binary record; a short or malformed record raises ``WireError``."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise WireError("a binary record is cut short")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def byte(self) -> int:
        return self.take(1)[0]


def _put_bytes(out: list[bytes], v: bytes) -> None:
    out += (_U32.pack(len(v)), v)


def _get_bytes(r: _Reader) -> bytes:
    return r.take(r.u32())


def _put_str(out: list[bytes], v: str | None) -> None:
    if v is None:
        out.append(_U32.pack(_NONE))
    else:
        _put_bytes(out, v.encode("utf-8", "surrogatepass"))


def _get_str(r: _Reader) -> str | None:
    n = r.u32()
    return None if n == _NONE else r.take(n).decode("utf-8", "surrogatepass")


def _put_int(out: list[bytes], v: int) -> None:
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    out += (bytes((len(raw),)), raw)


def _get_int(r: _Reader) -> int:
    return int.from_bytes(r.take(r.byte()), "little", signed=True)


def _put_ints(out: list[bytes], v: tuple[int, ...]) -> None:
    # hashes: uint64 in a row when they all fit (they do), one by one otherwise
    if all(0 <= x <= _U64_MAX for x in v):
        out += (b"\x00", _U32.pack(len(v)), np.array(v, dtype="<u8").tobytes())
    else:
        out += (b"\x01", _U32.pack(len(v)))
        for x in v:
            _put_int(out, x)


def _get_ints(r: _Reader) -> tuple[int, ...]:
    kind, n = r.byte(), r.u32()
    if kind == 0:
        return tuple(np.frombuffer(r.take(8 * n), dtype="<u8").tolist())
    return tuple(_get_int(r) for _ in range(n))


def _put_pieces(out: list[bytes], v: bytes) -> None:
    # the piece of each 5-gram (uint32) only grows along the text: its run lengths, one
    # per piece, are a fraction of its size; any other array goes as it is
    owner = np.frombuffer(v, dtype="<u4")
    if len(owner) and bool(np.all(owner[1:] >= owner[:-1])):
        out.append(b"\x01")
        _put_bytes(out, np.bincount(owner).astype("<u4").tobytes())
    else:
        out.append(b"\x00")
        _put_bytes(out, v)


def _get_pieces(r: _Reader) -> bytes:
    kind, raw = r.byte(), _get_bytes(r)
    if kind == 0:
        return raw
    counts = np.frombuffer(raw, dtype="<u4")
    return np.repeat(np.arange(len(counts), dtype="<u4"), counts).tobytes()


_Put = Callable[[list[bytes], Any], None]
_Get = Callable[[_Reader], Any]


def _put_bool(out: list[bytes], v: bool) -> None:
    out.append(b"\x01" if v else b"\x00")


def _get_bool(r: _Reader) -> bool:
    return r.byte() != 0


def _put_float(out: list[bytes], v: float) -> None:
    out.append(_F64.pack(v))


def _get_float(r: _Reader) -> float:
    return float(_F64.unpack(r.take(8))[0])


_BY_KIND: dict[str, tuple[_Put, _Get]] = {
    "bytes": (_put_bytes, _get_bytes),
    "tuple": (_put_ints, _get_ints),  # tuple[int, ...]
    "int": (_put_int, _get_int),
    "bool": (_put_bool, _get_bool),
    "float": (_put_float, _get_float),
    "str": (_put_str, _get_str),
}


def _codec(name: str, annotation: object) -> tuple[str, _Put, _Get]:
    """Writer and reader of a field of a simple type, from its annotation."""
    if name == "shingle_pieces":
        return name, _put_pieces, _get_pieces
    kind = str(annotation).split("[", 1)[0].strip()
    if kind not in _BY_KIND:
        raise TypeError(f"the wire format cannot carry a field of type {annotation!r}")
    return name, *_BY_KIND[kind]


# Every field of Fingerprints, and every field of Analysed but the page and the
# fingerprints, travels by its type: a field the engine adds travels without a change here.
_FPS_FIELDS = [_codec(f.name, f.type) for f in fields(Fingerprints)]
_ANALYSED_FIELDS = [
    _codec(f.name, f.type) for f in fields(Analysed) if f.name not in ("page", "fps")
]
_PAGE_FIELDS = ("page_id", "url", "fetched_at", "content_type", "site")


def analysed_to_bytes(a: Analysed) -> bytes:
    """An analysed page, without its body, in the binary form."""
    out: list[bytes] = []
    page = a.page
    for name in _PAGE_FIELDS:
        _put_str(out, getattr(page, name))
    for name, put, _ in _ANALYSED_FIELDS:
        put(out, getattr(a, name))
    fps = a.fps
    for name, put, _ in _FPS_FIELDS:
        put(out, getattr(fps, name))
    return b"".join(out)


def analysed_from_bytes(raw: bytes, pos: int = 0) -> Analysed:
    """``analysed_to_bytes`` read back (from ``raw[pos:]``); ``WireError`` if malformed."""
    r = _Reader(raw, pos)
    try:
        page_id, url, fetched_at, content_type, site = (_get_str(r) for _ in _PAGE_FIELDS)
        if page_id is None or url is None or fetched_at is None or content_type is None:
            raise WireError("an analysed page lacks a field")
        page = RawPage(page_id, url, fetched_at, content_type, "", site)
        rest = {name: get(r) for name, _, get in _ANALYSED_FIELDS}
        fps = Fingerprints(**{name: get(r) for name, _, get in _FPS_FIELDS})
        if r.pos != len(raw):
            raise WireError("an analysed page has bytes left over")
        return Analysed(page=page, fps=fps, **rest)
    except (TypeError, ValueError, IndexError, struct.error) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"not an analysed page: {exc!r}") from exc


def decided_part(a: Analysed) -> Analysed:
    """The page without the per-piece data, which only the template filter reads: what a
    page in flight keeps once the filter has run."""
    fps = replace(a.fps, piece_strings=b"", shingle_hashes=b"", shingle_pieces=b"")
    return replace(a, fps=fps)


@dataclass(frozen=True, slots=True)
class PageMsg:
    """An analysed page and where it came from: raw partition and offset."""

    partition: int
    offset: int
    partitions: int  # the raw topic's partition count as the sender saw it
    page: Analysed
    timestamp: float = 0.0  # the raw message's timestamp, seconds since the epoch
    #: The page as it was read (``analysed_to_bytes``), kept to be stored without
    #: encoding it again.
    as_read: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Mark:
    """A promise about one raw partition: every page at an offset below ``through`` has
    been forwarded and flushed (the partition's committed offset had reached ``through``,
    its end offset, when the mark was made)."""

    partition: int
    through: int


@dataclass(frozen=True, slots=True)
class MarksMsg:
    partitions: int
    marks: tuple[Mark, ...]


# -- the routed topology (worker.kafka.route) -------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeMsg:
    """Page ``seq``'s buckets in one probes partition: answer what is in them from pages
    before ``seq``, and add ``entry`` (the index's packed entry) unless ``append`` is off."""

    seq: int
    pid: int
    append: bool
    entry: bytes
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class RecordMsg:
    """Keep page ``pid``'s sketch (the index's sketch value) for later verifications."""

    pid: int
    value: bytes


@dataclass(frozen=True, slots=True)
class VerifyMsg:
    """Send page ``seq`` the sketches of ``pids``."""

    seq: int
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AnswerMsg:
    """Bucket values for page ``seq`` (None: no earlier page in that bucket)."""

    seq: int
    values: tuple[tuple[bytes, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class SketchMsg:
    """Sketch values for page ``seq`` (None: no sketch kept for that page)."""

    seq: int
    values: tuple[tuple[int, bytes | None], ...]


SequenceMsg = PageMsg | MarksMsg | AnswerMsg | SketchMsg
RouteMsg = ProbeMsg | RecordMsg | VerifyMsg
AnyMsg = SequenceMsg | RouteMsg


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s, validate=True)


def _body(msg: RouteMsg | MarksMsg | AnswerMsg | SketchMsg) -> dict[str, Any]:
    if isinstance(msg, MarksMsg):
        return {
            "t": "marks",
            "n": msg.partitions,
            "m": [[m.partition, m.through] for m in msg.marks],
        }
    if isinstance(msg, ProbeMsg):
        return {
            "t": "probe",
            "s": msg.seq,
            "pid": msg.pid,
            "add": msg.append,
            "e": _b64(msg.entry),
            "k": [_b64(k) for k in msg.keys],
        }
    if isinstance(msg, RecordMsg):
        return {"t": "record", "pid": msg.pid, "x": _b64(msg.value)}
    if isinstance(msg, VerifyMsg):
        return {"t": "verify", "s": msg.seq, "pids": list(msg.pids)}
    if isinstance(msg, AnswerMsg):
        return {"t": "answer", "s": msg.seq, "x": [[_b64(k), _b64(v)] for k, v in msg.values]}
    return {"t": "sketch", "s": msg.seq, "x": [[p, _b64(v)] for p, v in msg.values]}


#: A page: the version, b"P", partition, offset, partition count, timestamp, the page.
_PAGE_HEAD = struct.Struct("<BcqqId")
#: Any other message: the version, then its JSON object.
_JSON_HEAD = bytes((WIRE_VERSION,))


def encode(msg: AnyMsg) -> bytes:
    if isinstance(msg, PageMsg):
        head = _PAGE_HEAD.pack(
            WIRE_VERSION, b"P", msg.partition, msg.offset, msg.partitions, msg.timestamp
        )
        return head + analysed_to_bytes(msg.page)
    return _JSON_HEAD + orjson.dumps(_body(msg))


def _bytes(s: str | None) -> bytes:
    b = _unb64(s)
    if b is None:
        raise ValueError("a value is missing")
    return b


def _from(obj: dict[str, Any]) -> AnyMsg:
    t = obj["t"]
    if t == "marks":
        return MarksMsg(int(obj["n"]), tuple(Mark(int(p), int(x)) for p, x in obj["m"]))
    if t == "probe":
        keys = tuple(_bytes(k) for k in obj["k"])
        return ProbeMsg(int(obj["s"]), int(obj["pid"]), bool(obj["add"]), _bytes(obj["e"]), keys)
    if t == "record":
        return RecordMsg(int(obj["pid"]), _bytes(obj["x"]))
    if t == "verify":
        return VerifyMsg(int(obj["s"]), tuple(int(p) for p in obj["pids"]))
    if t == "answer":
        return AnswerMsg(int(obj["s"]), tuple((_bytes(k), _unb64(v)) for k, v in obj["x"]))
    if t == "sketch":
        return SketchMsg(int(obj["s"]), tuple((int(p), _unb64(v)) for p, v in obj["x"]))
    raise WireError(f"unknown message type {t!r}")


def _page(raw: bytes) -> PageMsg:
    try:
        _, _, partition, offset, partitions, ts = _PAGE_HEAD.unpack_from(raw)
    except struct.error as exc:
        raise WireError(f"a page message is cut short: {exc}") from exc
    as_read = raw[_PAGE_HEAD.size :]
    return PageMsg(partition, offset, partitions, analysed_from_bytes(as_read), ts, as_read)


def decode_any(raw: bytes) -> AnyMsg:
    """Any internal message; ``WireError`` if it cannot be read."""
    if len(raw) < 2 or raw[0] != WIRE_VERSION:
        raise WireError(f"wire version {raw[0] if raw else None!r}, not {WIRE_VERSION}")
    if raw[1:2] == b"P":
        return _page(raw)
    try:
        obj = orjson.loads(raw[1:])
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise WireError("not a JSON object")
    try:
        return _from(obj)
    except WireError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"malformed {obj.get('t')!r} message: {exc!r}") from exc


def decode(raw: bytes) -> SequenceMsg:
    """A message of the sequencer's topic."""
    msg = decode_any(raw)
    if not isinstance(msg, PageMsg | MarksMsg | AnswerMsg | SketchMsg):
        raise WireError(f"{type(msg).__name__} does not belong on the sequencer's topic")
    return msg


def decode_route(raw: bytes) -> RouteMsg:
    """A message of the probes or records topic."""
    msg = decode_any(raw)
    if not isinstance(msg, ProbeMsg | RecordMsg | VerifyMsg):
        raise WireError(f"{type(msg).__name__} does not belong on a routing topic")
    return msg


# -- several messages in one -----------------------------------------------------------------

#: The first bytes of a framed batch (a message starts with its version, never 0).
_FRAMED = b"\x00nd1"
_LENGTH = struct.Struct(">I")


def frame(items: Sequence[bytes]) -> bytes:
    """Several encoded messages as one Kafka message (one item is sent as it is): the
    internal topics carry many small messages, and each costs more than its bytes."""
    if len(items) == 1:
        return items[0]
    return _FRAMED + b"".join(_LENGTH.pack(len(i)) + i for i in items)


def unframe(raw: bytes) -> list[bytes]:
    """The messages in ``raw``, in the order they were framed."""
    if not raw.startswith(_FRAMED):
        return [raw]
    out, pos = [], len(_FRAMED)
    try:
        while pos < len(raw):
            (n,) = _LENGTH.unpack_from(raw, pos)
            pos += _LENGTH.size
            if pos + n > len(raw):
                raise WireError("a framed message is cut short")
            out.append(raw[pos : pos + n])
            pos += n
    except struct.error as exc:
        raise WireError(f"a framed message is cut short: {exc}") from exc
    return out
