"""The routed topology: the index partitioned by bucket, gathered per page, decided once.

The sequencer releases pages in their one order (``neardup.kafka.sequence``) and gives each
a sequence number. For a page it sends, in that order,

* to every probes partition that owns one of the page's buckets (SimHash blocks, period
  strings: ``KVIndex.keys``), one probe: answer what the buckets hold from pages before
  this one, and add this page's entry (``probe_bucket``);
* to the records partition of the page, its sketch (``RecordMsg``).

One producer writes all probes in sequence order, so every bucket partition sees the pages
in that order, and a probe that adds on arrival gives each page exactly the buckets the
sequential engine would read. Each bucket keeps the sequence number of every entry, in
its value beside the entry (``pack_bucket``), so a probe sent again (after a restart)
answers the same.

When a page's answers are all in, ``Engine.decide`` runs over ``RoutedKV``: bucket reads
are served from the answers; the first sketch read raises ``NeedKeys``, the sketches are
fetched from their records partitions (``VerifyMsg``) and the decision runs again. Pages
are decided strictly in sequence order (the clusters need it), while many are in flight.
Bucket and sketch writes of the engine are dropped: the probes and records made them.

Nothing here knows Kafka; the agents in ``neardup.kafka.app`` carry the messages.
"""

from __future__ import annotations

import logging
import math
import struct
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from neardup.config import EngineConfig
from neardup.decide import candidates
from neardup.engine import Analysed, for_decision
from neardup.fingerprint import Fingerprints
from neardup.index import ENTRY, KVIndex, make_entry
from neardup.kafka.journal import JournalKV
from neardup.kafka.sequence import Key
from neardup.kafka.stage import DecideStage, Emit, pid_bytes
from neardup.kafka.tablekv import ScanKV, StateInconsistentError
from neardup.kafka.wire import (
    AnswerMsg,
    ProbeMsg,
    RecordMsg,
    SequenceMsg,
    SketchMsg,
    VerifyMsg,
    analysed_from_json,
    analysed_to_json,
    encode,
)
from neardup.store import KV, BufferedKV

log = logging.getLogger(__name__)

_FLIGHT = b"\x01I"  # + seq (8 bytes) -> a page in flight: {"a", "ts", "repeat"}
_NEXT_SEQ = b"\x01S"  # -> the next sequence number
_SEQ = struct.Struct("<Q")  # a bucket entry's sequence number
#: A bucket's value: this tag, then each entry (``ENTRY``) followed by the sequence number
#: of the page that added it, so that adding an entry appends to the value. Its length is
#: odd. A bucket written before the numbers moved into it holds its entries alone (an even
#: length) and its numbers under ``key + _SEQS``, until a probe adds to it.
_PACKED_TAG = b"\x01"
_ROW = ENTRY.itemsize + _SEQ.size
_SEQS = b"\x00seq"
#: Buckets of up to this many entries are probed without numpy (``_probe_small``).
_SMALL_BUCKET = 16
_PID = struct.Struct("<Q")  # an entry's first field
assert ENTRY.itemsize % 2 == 0 and _ROW % 2 == 0  # the lengths tell the layouts apart


def route(key: bytes, partitions: int) -> int:
    """The probes or records partition that owns ``key`` (a stable hash, not Python's)."""
    return zlib.crc32(key) % partitions


class NeedKeys(Exception):  # noqa: N818 - a request, not an error
    """The engine read keys that are elsewhere: fetch them, then run it again."""

    def __init__(self, keys: list[bytes]) -> None:
        super().__init__(f"{len(keys)} keys are not here yet")
        self.keys = keys


def index_for(cfg: EngineConfig) -> KVIndex:
    """The index's key and bucket functions, without a store behind them."""
    return KVIndex(_NoKV(), cfg)


def _remote_prefixes(cfg: EngineConfig) -> tuple[bytes, ...]:
    """First bytes of the index's bucket and sketch keys, learned from the index itself."""
    index = index_for(cfg)
    # a short page with one period string: one key of every kind
    sim, postings = index.keys(Fingerprints(0, 0, (0,), 0, 1, bytes(4)))
    return tuple({k[:1] for k in sim + postings} | {index.sketch_key(0)[:1]})


class _NoKV:
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        raise AssertionError("not used")

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        raise AssertionError("not used")

    def delete_many(self, keys: Iterable[bytes]) -> None:
        raise AssertionError("not used")

    def delete_prefix(self, prefix: bytes) -> None:
        raise AssertionError("not used")

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


class RoutedKV:
    """The engine's ``KV`` in the routed topology: index keys come from ``remote`` (the
    current page's answers and sketches), everything else from ``local``."""

    def __init__(self, local: KV, cfg: EngineConfig) -> None:
        self.local = local
        self.prefixes = _remote_prefixes(cfg)
        self.remote: dict[bytes, bytes | None] = {}

    def _is_remote(self, key: bytes) -> bool:
        return key[:1] in self.prefixes

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        local = [k for k in keys if not self._is_remote(k)]
        missing = [k for k in keys if self._is_remote(k) and k not in self.remote]
        if missing:
            raise NeedKeys(missing)
        values = dict(zip(local, self.local.get_many(local), strict=True)) if local else {}
        return [self.remote[k] if self._is_remote(k) else values[k] for k in keys]

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.local.put_many((k, v) for k, v in items if not self._is_remote(k))

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self.local.delete_many(k for k in keys if not self._is_remote(k))

    def delete_prefix(self, prefix: bytes) -> None:
        self.write((), (prefix,))

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        if any(p[:1] in self.prefixes for p in prefixes):
            raise ValueError("the routed index is not deleted by prefix")
        self.local.write([(k, v) for k, v in records if not self._is_remote(k)], prefixes)

    def close(self) -> None:
        self.local.close()


# -- the probes and records partitions -----------------------------------------------------


@dataclass
class ProbeCounts:
    """What this worker's probes partitions did (full buckets are counted where the
    engine decides, in ``KVIndex.capped``)."""

    probes: int = 0


def probe_bucket(
    index: KVIndex, stored: bytes | None, seqs: bytes | None, probe: ProbeMsg
) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """One bucket, one probe: what the bucket held before page ``probe.seq``, and the
    bucket's new value and sequence numbers (None: unchanged).

    The answer leaves out entries of later pages, so a probe sent again answers the
    same; the page's entry is added once (``KVIndex.appended``: expired entries go, a
    full bucket takes nothing)."""
    if not stored:  # most buckets a page probes are empty: answered without numpy
        if not probe.append:
            return None, None
        new = index.appended(None, probe.entry)
        if new is None:
            return None, None
        return None, (new, _SEQ.pack(probe.seq) * (len(new) // ENTRY.itemsize))
    if len(stored) <= _SMALL_BUCKET * ENTRY.itemsize:
        return _probe_small(index, stored, seqs, probe)
    return _probe_filled(index, stored, seqs, probe)


def _probe_small(
    index: KVIndex, stored: bytes, seqs: bytes | None, probe: ProbeMsg
) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """``_probe_filled`` for a bucket of a few entries, on bytes and lists: a numpy call
    costs more than a few entries do (0.12 ms a page went to ``_probe_filled`` on the dev
    pages, most buckets that hold anything holding one or two entries)."""
    size = ENTRY.itemsize
    n = len(stored) // size
    if seqs is None or len(stored) != n * size or len(seqs) != n * _SEQ.size:
        return _probe_filled(index, stored, seqs, probe)  # (which says what is wrong)
    rows = [stored[at : at + size] for at in range(0, len(stored), size)]
    order_seqs = struct.unpack(f"<{n}Q", seqs)
    before = [s < probe.seq for s in order_seqs]
    answer = b"".join(row for row, b in zip(rows, before, strict=True) if b) or None
    pids = [_PID.unpack_from(row)[0] for row in rows]
    if not probe.append or probe.pid in pids:
        return answer, None
    new = index.appended(answer, probe.entry)
    if new is None:
        return answer, None
    seq_of = dict(zip(pids, order_seqs, strict=True))
    seq_of[probe.pid] = probe.seq
    later = [i for i, b in enumerate(before) if not b]  # only after a restart, as there
    value = new + b"".join(rows[i] for i in later)
    new_seqs = [seq_of[_PID.unpack_from(new, at)[0]] for at in range(0, len(new), size)]
    new_seqs += [order_seqs[i] for i in later]
    return answer, (value, struct.pack(f"<{len(new_seqs)}Q", *new_seqs))


def _probe_filled(
    index: KVIndex, stored: bytes | None, seqs: bytes | None, probe: ProbeMsg
) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """``probe_bucket`` for any bucket, empty ones too (with numpy: 10 times slower on an
    empty one, ``bench/probe.py``)."""
    entries = np.frombuffer(stored or b"", dtype=ENTRY)
    order_seqs = np.frombuffer(seqs or b"", dtype="<u8")
    before = order_seqs < probe.seq
    prior = entries[before]
    answer = prior.tobytes() if len(prior) else None
    if not probe.append or probe.pid in set(entries["pid"].tolist()):
        return answer, None
    entry = np.frombuffer(probe.entry, dtype=ENTRY)
    new = index.appended(answer, entry)
    if new is None:
        return answer, None
    seq_of = dict(zip(entries["pid"].tolist(), order_seqs.tolist(), strict=True))
    seq_of[probe.pid] = probe.seq
    kept = np.frombuffer(new, dtype=ENTRY)
    later = entries[~before]  # only after a restart: pages the first probe did not see
    value = new + later.tobytes()
    new_seqs = [seq_of[int(p)] for p in kept["pid"]] + order_seqs[~before].tolist()
    return answer, (value, np.array(new_seqs, dtype="<u8").tobytes())


def pack_bucket(entries: bytes, seqs: bytes) -> bytes:
    """A bucket's value from its entries and their sequence numbers (see ``_PACKED_TAG``)."""
    n = len(entries) // ENTRY.itemsize
    if n == 1:  # nearly every bucket a page adds to
        return _PACKED_TAG + entries + seqs
    rows = np.empty((n, _ROW), dtype=np.uint8)
    rows[:, : ENTRY.itemsize] = np.frombuffer(entries, dtype=np.uint8).reshape(n, ENTRY.itemsize)
    rows[:, ENTRY.itemsize :] = np.frombuffer(seqs, dtype=np.uint8).reshape(n, _SEQ.size)
    return _PACKED_TAG + rows.tobytes()


def unpack_bucket(value: bytes) -> tuple[bytes, bytes]:
    """A bucket's entries and their sequence numbers, from its value (``pack_bucket``)."""
    if len(value) == 1 + _ROW:
        return value[1 : 1 + ENTRY.itemsize], value[1 + ENTRY.itemsize :]
    rows = np.frombuffer(value, dtype=np.uint8, offset=1).reshape(-1, _ROW)
    return rows[:, : ENTRY.itemsize].tobytes(), rows[:, ENTRY.itemsize :].tobytes()


def probe_store(
    index: KVIndex, kv: KV, probe: ProbeMsg, counts: ProbeCounts | None = None
) -> AnswerMsg:
    """A probe against the buckets kept in ``kv`` (the probes partition's table)."""
    keys = list(dict.fromkeys(probe.keys))
    raw = kv.get_many(keys)
    # buckets written before the numbers moved into them: the numbers are beside them
    old = [
        key
        for key, value in zip(keys, raw, strict=True)
        if value is not None and not len(value) % 2
    ]
    beside = dict(zip(old, kv.get_many([k + _SEQS for k in old]), strict=True)) if old else {}
    answers, writes, gone = [], [], []
    for key, value in zip(keys, raw, strict=True):
        if value is None:
            stored, seqs = None, None
        elif key in beside:
            stored, seqs = value, beside[key]
        else:
            stored, seqs = unpack_bucket(value)
        answer, new = probe_bucket(index, stored, seqs, probe)
        answers.append((key, answer))
        if new is None and key in beside and probe.append:
            # one that takes nothing (full, or holding the page already) changes layout
            # all the same: a full bucket would otherwise keep its numbers beside it
            new = (value or b"", beside[key] or b"")
        if new is not None:
            writes.append((key, pack_bucket(*new)))
            if key in beside:
                gone.append(key + _SEQS)
    if counts is not None:
        counts.probes += 1
    if writes:
        kv.put_many(writes)
    if gone:
        kv.delete_many(gone)
    return AnswerMsg(probe.seq, tuple(answers))


def records_store(kv: KV, msg: RecordMsg | VerifyMsg) -> SketchMsg | None:
    """Keep a sketch, or answer a verification from the sketches kept in ``kv``."""
    if isinstance(msg, RecordMsg):
        kv.put_many([(pid_bytes(msg.pid), msg.value)])
        return None
    values = kv.get_many([pid_bytes(p) for p in msg.pids])
    return SketchMsg(msg.seq, tuple(zip(msg.pids, values, strict=True)))


def route_step(
    index: KVIndex,
    kv: KV,
    msgs: Iterable[ProbeMsg | RecordMsg | VerifyMsg],
    counts: ProbeCounts | None = None,
) -> list[AnswerMsg | SketchMsg]:
    """The answers to one event's messages (one partition's), in their order, with all
    their writes in one batch: a message reads what the ones before it wrote, as one by
    one, but the partition writes once an event, not once a probe (about four a page, each
    with its undo record and changelog bookkeeping in the worker's tables)."""
    step = BufferedKV(kv)
    answers: list[AnswerMsg | SketchMsg] = []
    for msg in msgs:
        if isinstance(msg, ProbeMsg):
            answers.append(probe_store(index, step, msg, counts))
        elif (sketches := records_store(step, msg)) is not None:
            answers.append(sketches)
    step.commit()
    return answers


# -- the sequencer's side ------------------------------------------------------------------


@dataclass
class Flight:
    """A released page waiting for its answers, then its sketches, then its turn."""

    seq: int
    page: Analysed  # after the template filter
    since: float
    repeat: bool  # its page id was decided, or is in flight: answered from the state
    keys: set[bytes] = field(default_factory=set)
    answers: dict[bytes, bytes | None] = field(default_factory=dict)
    asked: set[int] = field(default_factory=set)  # pids whose sketches were asked for
    sketches: dict[int, bytes | None] = field(default_factory=dict)
    sent_at: float = field(default_factory=time.monotonic)

    @property
    def answered(self) -> bool:
        return self.keys <= self.answers.keys()


class RoutedStage(DecideStage):
    """``DecideStage`` with the index in the probes and records partitions."""

    #: Pages released but not yet decided, at most: the rest waits in the pending set.
    MAX_IN_FLIGHT = 1000
    #: A page waiting this long for answers has them sent for again (answers are
    #: idempotent; this only matters if a message was lost to a bug).
    STALLED_S = 60.0

    def __init__(
        self,
        kv: ScanKV,
        cfg: EngineConfig,
        partitions: int,
        *,
        order_wait: float = math.inf,
        hold: bool = False,
    ) -> None:
        self.partitions = partitions
        self.flights: dict[int, Flight] = {}
        self.flying: Counter[int] = Counter()  # pids in flight
        self.flying_keys: set[Key] = set()
        self.next_seq = 0
        super().__init__(kv, cfg, order_wait=order_wait, hold=hold)

    def _engine_kv(self, journal: JournalKV, cfg: EngineConfig) -> KV:
        self.routed = RoutedKV(journal, cfg)
        return self.routed

    @property
    def index(self) -> KVIndex:
        return self.engine.index

    # -- state -----------------------------------------------------------------------

    def _resume(self) -> list[Emit]:
        (raw,) = self.journal.get_many([_NEXT_SEQ])
        self.next_seq = int(raw) if raw else 0
        self.flights, self.flying, self.flying_keys = {}, Counter(), set()
        out: list[Emit] = []
        for k, v in self.journal.scan(_FLIGHT):
            obj = orjson.loads(v)
            seq = int.from_bytes(k[len(_FLIGHT) :], "big")
            flight = Flight(seq, analysed_from_json(obj["a"]), float(obj["ts"]), obj["repeat"])
            self._fly(flight)
            out += self._launch(flight)  # what was on its way was lost with the memory
        if self.flights:
            log.info("resuming %d pages in flight", len(self.flights))
        return out

    def unload(self) -> None:
        super().unload()
        self.flights, self.flying, self.flying_keys = {}, Counter(), set()

    def _in_progress(self, key: Key) -> bool:
        return key in self.flying_keys

    def _head(self) -> Flight:
        """The page in flight with the lowest sequence number (flights are added in
        sequence order, at release and when resumed from the store's key order)."""
        return next(iter(self.flights.values()))

    def _fly(self, flight: Flight) -> None:
        if flight.seq in self.flights:  # it would take the other page's place, unanswered
            other = self.flights[flight.seq].page.page.page_id
            raise StateInconsistentError(
                f"two pages in flight under sequence number {flight.seq} ({other} and "
                f"{flight.page.page.page_id}): the stored next number is behind the pages "
                "in flight"
            )
        self.flights[flight.seq] = flight
        self.flying[flight.page.pid] += 1
        self.flying_keys.add(_key(flight.page))

    def _land(self, flight: Flight) -> None:
        del self.flights[flight.seq]
        self.flying[flight.page.pid] -= 1
        if not self.flying[flight.page.pid]:
            del self.flying[flight.page.pid]
        self.flying_keys.discard(_key(flight.page))

    # -- release: probes and records ---------------------------------------------------

    def release(self, limit: int = 100) -> list[Emit]:
        """Release what may be released (sending its probes), then decide the pages in
        flight whose answers are in, in sequence order."""
        room = max(0, min(limit, self.MAX_IN_FLIGHT - len(self.flights)))
        return super().release(room) + self._conclude_ready(limit)

    def busy(self) -> bool:
        if self.flights and self._ready(self._head()):
            return True
        return len(self.flights) < self.MAX_IN_FLIGHT and super().busy()

    def _released(self, a: Analysed, since: float) -> list[Emit]:
        repeat = a.pid in self.flying or self.engine.clusters.page(a.pid) is not None
        page = a
        if not repeat:
            try:
                page = self.engine.filter_template(a)
            except Exception as exc:  # a bug: logged once, the page is dead-lettered
                return self._failed(a, exc)
            self.engine.kv.commit()  # the template counts, in this page's step
        # stored and resumed without what only the filter read: a quarter of the bytes
        page = for_decision(page)
        flight = Flight(self.next_seq, page, since, repeat)
        self.next_seq += 1
        body = {"a": analysed_to_json(page), "ts": since, "repeat": repeat}
        self.journal.put_many(
            [
                (_flight_key(flight.seq), orjson.dumps(body)),
                (_NEXT_SEQ, str(self.next_seq).encode()),
            ]
        )
        self._fly(flight)
        return self._launch(flight)

    def _launch(self, flight: Flight) -> list[Emit]:
        """The probes and the record of a page (none for a repeat)."""
        if flight.repeat:
            return []
        a = flight.page
        sim, strings = self.index.keys(a.fps)
        flight.keys = set(sim + strings)
        by_partition: dict[int, list[bytes]] = {}
        for key in dict.fromkeys(sim + strings):
            by_partition.setdefault(route(key, self.partitions), []).append(key)
        entry = make_entry(a.pid, a.fps, a.order).tobytes()
        append = not a.template_only
        out = [
            Emit(
                "probes",
                keys[0],
                encode(ProbeMsg(flight.seq, a.pid, append, entry, tuple(keys))),
                p,
            )
            for p, keys in sorted(by_partition.items())
        ]
        if append:  # the engine keeps no sketch of a template-only page either
            key = pid_bytes(a.pid)
            record = RecordMsg(a.pid, self.index.sketch_value(a.fps))
            out.append(Emit("records", key, encode(record), route(key, self.partitions)))
        return out

    # -- answers and decisions -----------------------------------------------------------

    def resend_stalled(self) -> list[Emit]:
        """Probe again for the head page if it has waited too long (see ``STALLED_S``)."""
        if not self.flights:
            return []
        flight = self._head()
        if time.monotonic() - flight.sent_at < self.STALLED_S or self._ready(flight):
            return []
        log.warning(
            "page %s waited %.0f s for its answers: probing again",
            flight.page.page.page_id,
            time.monotonic() - flight.sent_at,
        )
        flight.sent_at = time.monotonic()
        return self._launch(flight) + self._verify(flight)

    def _accept_other(self, msg: SequenceMsg) -> list[Emit]:
        flight = self.flights.get(msg.seq) if isinstance(msg, AnswerMsg | SketchMsg) else None
        if flight is None:
            return []  # an answer for no page in flight: sent twice, the page is decided
        if isinstance(msg, SketchMsg):
            flight.sketches.update(msg.values)
            return []
        if isinstance(msg, AnswerMsg) and not flight.answered:
            flight.answers.update(msg.values)
            if flight.answered:
                return self._prefetch(flight)
        return []

    def _prefetch(self, flight: Flight) -> list[Emit]:
        """Ask for the sketches a page will be verified against as soon as its answers are
        in, not when its turn comes: its candidates depend on its answers only. (Should
        the decision want others, ``NeedKeys`` asks again.)"""
        a = flight.page
        if a.template_only:
            return []
        self.routed.remote = dict(flight.answers)
        try:
            found = self.index.lookup(a.fps, a.order)
            flight.asked |= set(candidates(a.fps, found, self.engine.cfg, a.pid))
        except Exception:  # the decision itself will fail on it, and say so
            log.exception("prefetching sketches failed for page %s", a.page.page_id)
            return []
        finally:
            self.routed.remote = {}
        return self._verify(flight) if flight.asked else []

    @staticmethod
    def _ready(flight: Flight) -> bool:
        if flight.repeat:
            return True
        return flight.answered and flight.asked <= flight.sketches.keys()

    def _conclude_ready(self, limit: int) -> list[Emit]:
        out: list[Emit] = []
        for _ in range(limit):
            if not self.flights:
                break
            flight = self._head()
            if not self._ready(flight):
                break
            emits = self._try_conclude(flight)
            if emits is None:
                out += self._verify(flight)
                break
            out += emits
            self.journal.delete_many([_flight_key(flight.seq)])
            self.journal.apply(flight.page.pid)
            self._land(flight)
        return out

    def _try_conclude(self, flight: Flight) -> list[Emit] | None:
        """Decide the head page, or None when it needs sketches it has not got."""
        a = flight.page
        if flight.repeat:
            self.counts.repeated += 1
            stored = self._stored(a.pid)
            if stored is None:  # its first occurrence was dead-lettered
                log.warning("repeated page %s has no stored decision", a.page.page_id)
                return []
            return stored
        self.routed.remote = dict(flight.answers)
        self.routed.remote.update((self.index.sketch_key(p), v) for p, v in flight.sketches.items())
        try:
            outcome = self.engine.decide(a)
        except NeedKeys as need:
            self.engine.kv.rollback()
            sketch = self.index.sketch_key(0)[:1]
            if any(k[:1] != sketch for k in need.keys):
                return self._failed(a, AssertionError("the engine read buckets not probed"))
            flight.asked |= {int.from_bytes(k[1:9], "big") for k in need.keys}
            return None
        except Exception as exc:  # a bug: logged once, the page is dead-lettered
            return self._failed(a, exc)
        finally:
            self.routed.remote = {}
        return self._conclude(a, outcome, flight.since)

    def _verify(self, flight: Flight) -> list[Emit]:
        """Ask the records partitions for the sketches the head page waits for."""
        by_partition: dict[int, list[int]] = {}
        for pid in sorted(flight.asked - flight.sketches.keys()):
            by_partition.setdefault(route(pid_bytes(pid), self.partitions), []).append(pid)
        return [
            Emit("records", pid_bytes(pids[0]), encode(VerifyMsg(flight.seq, tuple(pids))), p)
            for p, pids in sorted(by_partition.items())
        ]


def _key(a: Analysed) -> Key:
    return (a.order, a.page.page_id)


def _flight_key(seq: int) -> bytes:
    return _FLIGHT + seq.to_bytes(8, "big")
