"""The worker's internal messages as JSON: analysed pages and partition progress marks.

An ``Analysed`` page travels without its body (the stateful stages never read it); its
other fields go by their types: bytes as base64, 64-bit values as JSON integers, which
Python reads back exactly. ``decode(encode(m)) == m`` for every message (bodies aside).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, overload

import numpy as np
import orjson
import pybase64

from neardup.engine import Analysed
from neardup.fingerprint import Fingerprints, piece_chars_from_owners
from neardup.records import RawPage

#: Bump when a field changes meaning; a reader refuses messages of another version.
WIRE_VERSION = 1


class WireError(ValueError):
    """An internal message this version cannot read: a bug or a mixed deployment."""


# pybase64 (SIMD): a fifth of the standard library's time for the same strings, and the
# same binascii.Error on a malformed one. A page's message carries a few dozen values.
@overload
def _b64(b: bytes) -> str: ...
@overload
def _b64(b: None) -> None: ...
def _b64(b: bytes | None) -> str | None:
    return None if b is None else pybase64.b64encode_as_string(b)


@overload
def _unb64(s: str) -> bytes: ...
@overload
def _unb64(s: None) -> None: ...
def _unb64(s: str | None) -> bytes | None:
    return None if s is None else pybase64.b64decode(s, validate=True)


def _codec(annotation: object) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Encoder and decoder of a field of a simple type, from its annotation."""
    kind = str(annotation).split("[", 1)[0].strip()
    if kind == "bytes":
        return _b64, _unb64
    if kind == "tuple":  # tuple[int, ...]
        return list, (lambda v: tuple(int(x) for x in v))
    if kind in _SCALARS:
        cast = _SCALARS[kind]
        return (lambda v: v), cast
    raise TypeError(f"the wire format cannot carry a field of type {annotation!r}")


_SCALARS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "str": str}

# Every field of Fingerprints, and every field of Analysed but the page and the
# fingerprints, travels by its type: a field the engine adds travels without a change here.
_FPS_FIELDS = [(f.name, *_codec(f.type)) for f in fields(Fingerprints)]
_ANALYSED_FIELDS = [
    (f.name, *_codec(f.type)) for f in fields(Analysed) if f.name not in ("page", "fps")
]


def analysed_to_json(a: Analysed) -> dict[str, Any]:
    page = a.page
    out: dict[str, Any] = {
        "page_id": page.page_id,
        "url": page.url,
        "fetched_at": page.fetched_at,
        "content_type": page.content_type,
        "site": page.site,
    }
    out.update((name, enc(getattr(a, name))) for name, enc, _ in _ANALYSED_FIELDS)
    out["fps"] = {name: enc(getattr(a.fps, name)) for name, enc, _ in _FPS_FIELDS}
    return out


def analysed_from_json(obj: dict[str, Any]) -> Analysed:
    try:
        page = RawPage(
            page_id=str(obj["page_id"]),
            url=str(obj["url"]),
            fetched_at=str(obj["fetched_at"]),
            content_type=str(obj["content_type"]),
            body="",
            site=obj["site"],
        )
        fps_obj = obj["fps"]
        if "shingle_pieces" in fps_obj:  # written before piece_chars replaced it
            fps_obj = _with_piece_chars(fps_obj)
        # (a field added since the message was written takes its default, if it has one)
        fps = Fingerprints(
            **{name: dec(fps_obj[name]) for name, _, dec in _FPS_FIELDS if name in fps_obj}
        )
        # A field missing from a message or pending page of an older version takes its
        # default (Analysed refuses the record if the field has none).
        rest = {name: dec(obj[name]) for name, _, dec in _ANALYSED_FIELDS if name in obj}
        return Analysed(page=page, fps=fps, **rest)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"not an analysed page: {exc!r}") from exc


def _with_piece_chars(fps: dict[str, Any]) -> dict[str, Any]:
    """Fingerprints as this version carries them, from a message or a stored pending page
    or flight of the version before: each 5-gram's piece index becomes each piece's
    length (``piece_chars_from_owners``), 4 bytes a piece instead of 4 bytes a 5-gram."""
    rest = {k: v for k, v in fps.items() if k != "shingle_pieces"}
    owners = np.frombuffer(_unb64(fps["shingle_pieces"]), dtype="<u4")
    pieces = len(_unb64(fps["piece_strings"])) // 8
    chars = piece_chars_from_owners(owners, pieces)
    rest["piece_chars"] = _b64(chars)
    return rest


@dataclass(frozen=True, slots=True)
class PageMsg:
    """An analysed page and where it came from: raw partition and offset."""

    partition: int
    offset: int
    partitions: int  # the raw topic's partition count as the sender saw it
    page: Analysed
    timestamp: float = 0.0  # the raw message's timestamp, seconds since the epoch
    #: Every message of the partition below this offset had been handled by the sender
    #: (None: every one below ``offset``; ``neardup.kafka.sequence`` holds the page if not).
    clear: int | None = None
    #: The page as it was read (``analysed_to_json``), kept to be stored without encoding
    #: it again.
    as_read: dict[str, Any] | None = field(default=None, compare=False, repr=False)


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
    #: When the marks were made (Unix seconds, taken before the end offsets were read):
    #: they vouch for the pages forwarded to the sequencer before then. (Infinity: for
    #: every page, as marks without a time did.)
    at: float = float("inf")


# -- the routed topology (neardup.kafka.route) -------------------------------------------


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


def _body(msg: AnyMsg) -> dict[str, Any]:  # noqa: PLR0911 - one branch per type
    if isinstance(msg, PageMsg):
        return {
            "t": "page",
            "p": msg.partition,
            "o": msg.offset,
            "n": msg.partitions,
            "ts": msg.timestamp,
            **({"c": msg.clear} if msg.clear is not None else {}),
            "a": analysed_to_json(msg.page),
        }
    if isinstance(msg, MarksMsg):
        return {
            "t": "marks",
            "n": msg.partitions,
            "m": [[m.partition, m.through] for m in msg.marks],
            **({"at": msg.at} if msg.at != float("inf") else {}),
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


def encode(msg: AnyMsg) -> bytes:
    body = {"v": WIRE_VERSION, **_body(msg)}
    return orjson.dumps(body)


def _bytes(s: str | None) -> bytes:
    b = _unb64(s)
    if b is None:
        raise ValueError("a value is missing")
    return b


def _from(obj: dict[str, Any]) -> AnyMsg:  # noqa: PLR0911 - one branch per type
    t = obj["t"]
    if t == "page":
        return PageMsg(
            int(obj["p"]),
            int(obj["o"]),
            int(obj["n"]),
            analysed_from_json(obj["a"]),
            float(obj.get("ts", 0.0)),
            None if obj.get("c") is None else int(obj["c"]),
            obj["a"],
        )
    if t == "marks":
        marks = tuple(Mark(int(p), int(x)) for p, x in obj["m"])
        return MarksMsg(int(obj["n"]), marks, float(obj.get("at", float("inf"))))
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


def decode_any(raw: bytes) -> AnyMsg:
    """Any internal message; ``WireError`` if it cannot be read."""
    try:
        obj = orjson.loads(raw)
    except ValueError as exc:
        raise WireError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("v") != WIRE_VERSION:
        raise WireError(f"wire version {obj.get('v') if isinstance(obj, dict) else None!r}")
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

#: The first bytes of a framed batch (a JSON message never starts with a NUL byte).
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
