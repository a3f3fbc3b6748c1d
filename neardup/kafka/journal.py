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

With ``hold`` on, ``apply`` ends a step without writing it, and ``flush`` writes the
steps applied since the last one as one step: every unjournaled put of theirs, in step
order (also one that a later step deletes: a cut among them then leaves the pending
pages of a prefix of the steps, never a later page without an earlier one), one journal
value holding all their other writes, then those writes, each key once with its last
value, page records last. Reads see the steps held; ``discard`` drops only the step
under way. The worker's sequencer flushes once a message (a framed batch of pages and
answers, whose release loop may decide hundreds of pages) and before it publishes
anything, so nothing is published or acknowledged before the steps that led to it are
written. A key that several of those steps write (the last released key, the next
sequence number, a host's record, the journal itself) then reaches the store and its
changelog once, in one RocksDB write a message rather than several a page.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from neardup.kafka.tablekv import ScanKV

JOURNAL_KEY = b"\x00journal"
#: The engine's page record (``neardup.cluster``): written last.
_RECORD_PREFIX = b"M"

_PUT, _DELETE, _DELETE_PREFIX = 0, 1, 2
_HEAD = struct.Struct(">Q")
_OP = struct.Struct(">BI")
_LEN = struct.Struct(">I")

Op = tuple[int, bytes, bytes | None]


def _ordered(ops: list[Op]) -> list[Op]:
    """``ops`` with the page records' puts last: once one is in the changelog, so is
    everything else of its page. (A put of a key that a later op also writes or deletes
    keeps its place, or the reordering would change what the key ends as.)"""
    last = {op[1]: i for i, op in enumerate(ops)}
    moved = [
        i
        for i, (kind, key, _) in enumerate(ops)
        if kind == _PUT and key.startswith(_RECORD_PREFIX) and last[key] == i
    ]
    if not moved:
        return ops
    at = set(moved)
    return [op for i, op in enumerate(ops) if i not in at] + [ops[i] for i in moved]


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
    """Reads go to ``inner`` (and the steps held); writes are held until ``apply``
    journals and writes them (or, with ``hold``, until ``flush``)."""

    def __init__(self, inner: ScanKV, *, hold: bool = False) -> None:
        self.inner = inner
        #: Whether ``apply`` leaves its step to ``flush`` (see the module docstring).
        self.hold = hold
        self._ops: list[Op] = []
        self._early: list[tuple[bytes, bytes | None]] = []
        # the steps applied and held: what a read must see of them (a key's value, None
        # for deleted; the prefixes deleted, for keys not in ``_seen``), the keys their
        # journalled writes set, their unjournaled puts in step order, the last tag
        self._seen: dict[bytes, bytes | None] = {}
        self._gone: list[bytes] = []
        self._written: set[bytes] = set()
        self._held_early: dict[bytes, bytes | None] = {}
        self._held_tag = 0

    @property
    def holding(self) -> bool:
        """Whether steps wait for ``flush``."""
        return bool(self._seen or self._gone)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not self.holding:
            return self.inner.get_many(keys)
        seen, gone = self._seen, self._gone
        out: list[bytes | None] = []
        misses: list[int] = []
        for i, k in enumerate(keys):
            if k in seen:
                out.append(seen[k])
            else:
                out.append(None)
                if not any(k.startswith(p) for p in gone):
                    misses.append(i)
        if misses:
            found = self.inner.get_many([keys[i] for i in misses])
            for i, v in zip(misses, found, strict=True):
                out[i] = v
        return out

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
        if not self.holding:
            yield from self.inner.scan(prefix)
            return
        seen, gone = self._seen, self._gone
        items = {
            k: v
            for k, v in self.inner.scan(prefix)
            if k not in seen and not any(k.startswith(p) for p in gone)
        }
        items.update((k, v) for k, v in seen.items() if v is not None and k.startswith(prefix))
        yield from sorted(items.items())

    def close(self) -> None:
        self.close_steps()
        self.inner.close()

    def close_steps(self) -> None:
        """Drop the step under way and the steps held, unwritten."""
        self.discard()
        self._drop_held()

    def discard(self) -> None:
        """Drop the step under way (the steps applied and held stay)."""
        self._ops.clear()
        self._early.clear()

    def apply(self, tag: int) -> None:
        """End the step: write the unjournaled puts, the journal, then the held writes
        (the page record last), in one batch; with ``hold``, leave it to ``flush``."""
        ops, early = self._ops, self._early
        self._ops, self._early = [], []
        if not (ops or early):
            return
        if not self.hold:
            ordered = _ordered(ops)
            # a journal value even with no ops: the last one is never older than a write
            # made without one, which ``redo_last`` would otherwise undo
            self._write(ordered, [*early, (JOURNAL_KEY, encode_ops(tag, ordered))])
            return
        seen, gone = self._seen, self._gone
        if any(k in seen or any(k.startswith(p) for p in gone) for k, _ in early):
            # a key a held step wrote, or under a prefix one deleted: the steps held are
            # written first (the prefix's deletes would take a put written before the
            # journal; and the value stays out of the journal)
            self.flush()
            seen, gone = self._seen, self._gone
        for k, v in early:
            seen[k] = v
            self._held_early[k] = v
        written = self._written
        for kind, key, value in ops:
            if kind == _DELETE_PREFIX:
                for k in seen:
                    if k.startswith(key):
                        seen[k] = None
                        written.add(k)
                gone.append(key)
            else:
                seen[key] = value if kind == _PUT else None
                written.add(key)
        self._held_tag = tag

    def flush(self) -> None:
        """Write the steps held as one step: each key once, with its last value (see the
        module docstring)."""
        if not self.holding:
            return
        seen, written, tag = self._seen, self._written, self._held_tag
        # the prefixes first (each once, none inside another): a key written after one is
        # deleted with them, then put; a key deleted since needs no delete of its own
        gone = sorted(set(self._gone))
        gone = [p for i, p in enumerate(gone) if not any(p.startswith(q) for q in gone[:i])]
        ops: list[Op] = [(_DELETE_PREFIX, p, None) for p in gone]
        for k, v in seen.items():
            if k not in written:
                continue
            if v is not None:
                ops.append((_PUT, k, v))
            elif not any(k.startswith(p) for p in gone):
                ops.append((_DELETE, k, None))
        ops = _ordered(ops)
        # every unjournaled put, in the order of its steps, also one that a later held
        # step deletes (a page released in the same message): a cut among them then
        # leaves the pending pages of a prefix of the steps, as writing step by step
        # would, never a later step's page without an earlier one's (whose release,
        # among the ops, did not reach the changelog either)
        early = list(self._held_early.items())
        self._drop_held()
        self._write(ops, [*early, (JOURNAL_KEY, encode_ops(tag, ops))])

    def _drop_held(self) -> None:
        self._held_tag = 0
        self._seen, self._gone, self._written, self._held_early = {}, [], set(), {}

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
        becomes the deletes of the keys under it, those stored and those put before it
        (but those put again after it, which the put overwrites)."""
        records = first or []
        put_last = {key: i for i, (kind, key, _) in enumerate(ops) if kind == _PUT}
        for i, (kind, key, value) in enumerate(ops):
            if kind == _PUT:
                records.append((key, value))
            elif kind == _DELETE:
                records.append((key, None))
            else:
                under = [k for k, _ in self.inner.scan(key)]
                under += [k for k, v in records if v is not None and k.startswith(key)]
                records.extend((k, None) for k in dict.fromkeys(under) if put_last.get(k, -1) < i)
        self.inner.write(records)
