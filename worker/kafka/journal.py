"""One page's state writes as a redo journal, so that a crash never leaves half a page.

The worker's state lives in one table with one changelog partition. Kafka keeps the
writes of one producer to one partition in order, so after a crash the changelog holds a
prefix of everything written: every page before the cut entirely, the page at the cut
partly. Each page's writes are therefore preceded by one journal value holding all of
them, tagged with the page's pid. The page record, which marks a page as decided, is
written last. A page found without its record but named by the journal is redone from
the journal (absolute writes, so redoing is idempotent) instead of being decided again:
decided again, it would count in its host's template statistics twice.

The one exception is ``put_unjournaled``: a value written just before a journal value
and left out of it (a pending page, several KiB that the journal would otherwise hold a
second time), for a write that its input, read again after a crash, makes again.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from worker.kafka.tablekv import ScanKV

JOURNAL_KEY = b"\x00journal"
#: The engine's page record (``worker.cluster``): written last.
_RECORD_PREFIX = b"M"

_PUT, _DELETE, _DELETE_PREFIX = 0, 1, 2
_HEAD = struct.Struct(">Q")
_OP = struct.Struct(">BI")
_LEN = struct.Struct(">I")

Op = tuple[int, bytes, bytes | None]


def _ordered(ops: list[Op]) -> list[Op]:
    # the page record last: once it is in the changelog, so is everything else of the page
    return [op for op in ops if not op[1].startswith(_RECORD_PREFIX) or op[0] != _PUT] + [
        op for op in ops if op[1].startswith(_RECORD_PREFIX) and op[0] == _PUT
    ]


def encode_ops(tag: int, ops: Sequence[Op]) -> bytes:
    out = [_HEAD.pack(tag)]
    for kind, key, value in ops:
        out.append(_OP.pack(kind, len(key)))
        out.append(key)
        if kind == _PUT:
            assert value is not None
            out.append(_LEN.pack(len(value)))
            out.append(value)
    return b"".join(out)


def decode_ops(raw: bytes) -> tuple[int, list[Op]]:
    (tag,) = _HEAD.unpack_from(raw)
    pos, ops = _HEAD.size, []
    while pos < len(raw):
        kind, klen = _OP.unpack_from(raw, pos)
        pos += _OP.size
        key = raw[pos : pos + klen]
        pos += klen
        value = None
        if kind == _PUT:
            (vlen,) = _LEN.unpack_from(raw, pos)
            pos += _LEN.size
            value = raw[pos : pos + vlen]
            pos += vlen
        ops.append((kind, key, value))
    return tag, ops


class JournalKV:
    """Reads go to ``inner``; writes are held until ``apply`` journals and writes them."""

    def __init__(self, inner: ScanKV) -> None:
        self.inner = inner
        self._ops: list[Op] = []
        self._early: list[tuple[bytes, bytes | None]] = []

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.get_many(keys)

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self._ops.extend((_PUT, k, v) for k, v in items)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self._ops.extend((_DELETE, k, None) for k in keys)

    def put_unjournaled(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Puts held until ``apply``, which writes them before the journal value and
        leaves them out of it: a large value is then not written twice. A crash may leave
        them in the changelog without the rest of their step, and ``redo_last`` never
        writes them again, so this is only for a write that the input which caused it,
        not committed until the step is flushed, makes again when it is read again (the
        sequencer's pending pages)."""
        self._early.extend(items)

    def delete_prefix(self, prefix: bytes) -> None:
        self._ops.append((_DELETE_PREFIX, prefix, None))

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        """Held like the calls above, prefixes first: ``apply`` writes them."""
        self._ops.extend((_DELETE_PREFIX, p, None) for p in prefixes)
        self._ops.extend((_DELETE, k, None) if v is None else (_PUT, k, v) for k, v in records)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(prefix)

    def close(self) -> None:
        self.discard()
        self.inner.close()

    def discard(self) -> None:
        self._ops.clear()
        self._early.clear()

    def apply(self, tag: int) -> None:
        """Write the unjournaled puts, the journal, then the held writes (the page record
        last), in one batch."""
        ops = _ordered(self._ops)
        early, self._ops, self._early = self._early, [], []
        if ops or early:
            # a journal value even with no ops: the last one is never older than a write
            # made without one, which ``redo_last`` would otherwise undo
            self._write(ops, [*early, (JOURNAL_KEY, encode_ops(tag, ops))])

    def redo_last(self) -> bool:
        """Rewrite the last journalled step (at start-up: a crash may have cut it short).

        Every write to the store goes through the journal or comes just before a journal
        value in the same batch (``put_unjournaled``), so nothing has overwritten the last
        step's keys since, and its writes, being absolute, can be made again."""
        (raw,) = self.inner.get_many([JOURNAL_KEY])
        if raw is None:
            return False
        _, ops = decode_ops(raw)
        self._write(ops)
        return True

    def _write(self, ops: list[Op], first: list[tuple[bytes, bytes | None]] | None = None) -> None:
        """``ops`` (after ``first``) as one ``write`` of the inner store: a prefix deleted
        becomes the deletes of the keys under it, those stored and those put before it."""
        records = first or []
        for kind, key, value in ops:
            if kind == _PUT:
                records.append((key, value))
            elif kind == _DELETE:
                records.append((key, None))
            else:
                under = [k for k, _ in self.inner.scan(key)]
                under += [k for k, v in records if v is not None and k.startswith(key)]
                records.extend((k, None) for k in dict.fromkeys(under))
        self.inner.write(records)
