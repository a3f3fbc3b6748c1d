"""The worker's stages as plain objects: what the agents call, with no Kafka in them.

* ``analyse_messages``: raw messages to analysed pages or rejections (pure; runs on
  every worker, for the partitions it owns).
* ``DecideStage``: the sequencing stage and, after it, the stateful stages — template
  filter, index, decide, cluster — through ``Engine``. It turns sequencer messages into
  the messages to publish. Everything it remembers is in one ``ScanKV`` (a Faust table
  with one changelog partition in the worker, memory in tests), written in batches
  through a redo journal (``neardup.kafka.journal``), so that a crash leaves whole steps.
  ``neardup.kafka.route.RoutedStage`` keeps the index elsewhere, partitioned by bucket.

What a page's step publishes is returned only after its writes were handed to the store;
the agent flushes the changelog before publishing, so a published decision is always one
the state remembers, and a page seen again gets exactly that decision back.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import (
    Analysed,
    Engine,
    Merge,
    Outcome,
    Stats,
    analyse,
    internal_rejection,
    stored_decision,
)
from neardup.kafka.journal import JournalKV
from neardup.kafka.sequence import Key, Progress, Sequencer, key_bytes, key_from_bytes
from neardup.kafka.tablekv import ScanKV
from neardup.kafka.wire import (
    Mark,
    MarksMsg,
    PageMsg,
    SequenceMsg,
    analysed_from_json,
    analysed_to_json,
)
from neardup.records import RawMessage, RawPage, Reason, Rejected
from neardup.store import KV, check_marker

log = logging.getLogger(__name__)

# The stage's own keys beside the engine's (which never start with 0x01).
_PENDING = b"\x01Q"  # + key_bytes(order, page_id) -> {"ts", "a": analysed page}
_PROGRESS = b"\x01R"  # + partition (4 bytes) -> Progress
_PARTITIONS = b"\x01N"  # -> raw partition count
_RELEASED = b"\x01L"  # -> key_bytes of the greatest key released
_MERGES = b"\x01G"  # + pid -> the merges the page's decision caused (JSON list)
# + sequencer offset (8 bytes) -> the pids (8 bytes each) of the decisions made while
# handling that sequencer message, whose outputs may not have reached the broker yet (see
# ``DecideStage.confirm``). Also read: the older layout of a key a decision,
# + offset + pid -> b"1", which a state written by an older worker may hold.
_OUTBOX = b"\x01O"

#: A pending page that has waited this long is logged with what holds it back.
PENDING_STALLED_S = 60.0

Topic = Literal["decisions", "merges", "rejects", "probes", "records"]


@dataclass(frozen=True, slots=True)
class Emit:
    """One message to publish: topic, key, value, and (internal topics) partition."""

    topic: Topic
    key: bytes | None
    value: bytes
    partition: int | None = None
    #: The raw message's timestamp, for the end-to-end latency (0: unknown).
    since: float = 0.0

    @classmethod
    def json(cls, topic: Topic, key: str | None, value: dict[str, Any], since: float = 0.0) -> Emit:
        body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(topic, None if key is None else key.encode(), body, None, since)


def analyse_messages(
    raws: Iterable[bytes | None], cfg: EngineConfig, stats: Stats, sandbox: Any = None
) -> Generator[Analysed | Rejected, None, None]:
    """Raw-topic message values to analysed pages or rejections, in order; never raises
    for a message.

    ``sandbox`` is an ``Engine``'s sandbox (``neardup.sandbox``): the engine's ``analyse``
    bounded in time and memory, its child analysing the next pages while the caller
    handles one (``Sandbox.stream``, as ``Engine.process_many``; ``raws`` is read a few
    messages ahead). None runs ``analyse`` here."""
    if sandbox is None:
        pages = (_parse_message(raw, cfg) for raw in raws)
        stream = ((page, _analyse_here(page, cfg, stats)) for page in pages)
    else:  # its worker parses the messages too: this process never holds a body as text
        stream = sandbox.stream(map(_unparsed, raws), stats)
    try:
        for _, out in stream:
            stats.pages += 1
            if isinstance(out, Rejected):
                stats.rejects[str(out.reason)] += 1
            yield out
    finally:
        stream.close()  # left early: the sandbox's child drops the pages written ahead


def _parse_message(raw: bytes | None, cfg: EngineConfig) -> RawPage | Rejected:
    if raw is None:
        return _no_value()
    return parse_raw(raw, cfg.max_bytes)


def _unparsed(raw: bytes | None) -> RawMessage | Rejected:
    return _no_value() if raw is None else RawMessage(raw)


def _no_value() -> Rejected:
    return Rejected(Reason.BAD_JSON, "message has no value")


def _analyse_here(page: RawPage | Rejected, cfg: EngineConfig, stats: Stats) -> Analysed | Rejected:
    if isinstance(page, Rejected):
        return page
    try:
        return analyse(page, cfg, stats)
    except Exception as exc:  # a bug, not bad input: the page is dead-lettered
        return internal_rejection(page, exc)


def drained(
    ends: dict[int, int | None],
    committed: dict[int, int | None],
    earliest: dict[int, int | None],
) -> tuple[list[Mark], dict[int, int]]:
    """Marks for the raw partitions whose committed offset has reached their end offset
    (a partition with no committed offset counts when it is empty), and the lag of each."""
    marks, lag = [], {}
    for p, end in sorted(ends.items()):
        if end is None:
            continue
        done = committed.get(p)
        if done is None:
            done = earliest.get(p)
        if done is None:
            continue
        lag[p] = max(0, end - done)
        if done >= end:
            marks.append(Mark(p, end))
    return marks, lag


def backlogged(lag: int, paused: bool, limit: int) -> bool:
    """Whether a worker should hold its raw partitions paused, with ``lag`` messages in
    the sequencer topic not yet committed by the sequencer: from above ``limit`` until it
    is down to half of it (0: never). Analysis can outrun the stateful stages (a slow
    broker, a client quota); pausing its input leaves the bandwidth to the pages already
    started, and the backlog waits in the raw topic instead of as analysed pages."""
    if limit <= 0:
        return False
    return lag > limit // 2 if paused else lag > limit


def pid_bytes(pid: int) -> bytes:
    return pid.to_bytes(8, "big")


@dataclass
class DecideCounts:
    """What the sequencing and decide stages did, for the metrics."""

    decisions: dict[str, int] = field(default_factory=dict)
    repeated: int = 0
    redone: int = 0
    internal: int = 0
    merges: int = 0


class DecideStage:
    """Sequencer plus ``Engine`` over the state store; see the module docstring."""

    def __init__(
        self, kv: ScanKV, cfg: EngineConfig, *, order_wait: float = math.inf, hold: bool = False
    ) -> None:
        #: With ``hold``, a step's writes wait for ``commit`` (``JournalKV.hold``).
        self.journal = JournalKV(kv, hold=hold)
        self.engine = Engine(self._engine_kv(self.journal, cfg), cfg)
        #: ``Sequencer.wait``: how long a page waits for marks made after it arrived.
        self.order_wait = order_wait
        self.sequencer = Sequencer(order_wait)
        self.counts = DecideCounts()
        self.loaded = False
        #: Offset of the sequencer message being handled (set by the agent before
        #: ``accept``); after a restart, the first one is where the replay starts.
        self.offset = -1
        #: The sequencer topic (set by the agent with ``offset``), for the logs.
        self.topic = ""
        #: When the sequencer message being handled reached its topic (its Kafka
        #: timestamp, set by the agent with ``offset``; -inf: unknown).
        self.arrived = -math.inf
        #: When ``_log_stalled`` last logged (monotonic seconds).
        self._stall_logged = -math.inf
        #: Outbox keys written in this run, in offset order, not yet confirmed.
        self.unconfirmed: deque[bytes] = deque()
        #: Called with the seconds each page took in the stateful stages (the metrics).
        self.observe: Callable[[float], None] | None = None

    def _engine_kv(self, journal: JournalKV, cfg: EngineConfig) -> KV:
        """What the engine reads and writes: the journal over the state store."""
        return journal

    def commit(self) -> None:
        """Write the steps held since the last call (with ``hold``; see ``JournalKV``):
        before anything they led to is published, and before their input is acknowledged."""
        self.journal.flush()

    def busy(self) -> bool:
        """Whether ``release`` has more to do right away."""
        return self.sequencer.peek() is not None

    # -- state -----------------------------------------------------------------------

    def load(self) -> list[Emit]:
        """Complete a step a crash cut short, rebuild the in-memory sequencer from the
        store and check the state's marker. Returns what must be sent again."""
        if self.journal.redo_last():
            self.counts.redone += 1
        kv = self.journal
        raw_n, raw_released = kv.get_many([_PARTITIONS, _RELEASED])
        n = len(_PROGRESS)
        progress = [
            (int.from_bytes(k[n:], "big"), Progress.from_bytes(v)) for k, v in kv.scan(_PROGRESS)
        ]
        pending = [
            (key_from_bytes(k[len(_PENDING) :]), float(orjson.loads(v).get("in", -math.inf)))
            for k, v in kv.scan(_PENDING)
        ]
        self.sequencer = Sequencer(self.order_wait)
        self.sequencer.restore(
            int(raw_n) if raw_n else 0,
            progress,
            pending,
            key_from_bytes(raw_released) if raw_released else None,
        )
        check_marker(self.journal, self.engine.cfg, "the worker's state table")
        again = self._unpublished()
        self.journal.apply(0)
        self.loaded = True
        log.info(
            "sequencer loaded: %d pending pages, %d raw partitions, %d decisions sent again",
            len(self.sequencer),
            self.sequencer.partitions,
            sum(e.topic == "decisions" for e in again),
        )
        return again + self._resume()

    def _unpublished(self) -> list[Emit]:
        """The outputs of decisions made while handling sequencer messages from
        ``self.offset`` on: the previous owner stored them, but the input offset was not
        committed, so they may never have reached the broker (the replayed messages only
        find them decided). Older outbox entries were delivered: they are dropped."""
        out: list[Emit] = []
        self.unconfirmed = deque()
        n = len(_OUTBOX)
        for key, value in self.journal.scan(_OUTBOX):
            if int.from_bytes(key[n : n + 8], "big") < self.offset:
                self.journal.delete_many([key])
                continue
            pids = value if len(key) == n + 8 else key[n + 8 :]  # or the older layout
            for at in range(0, len(pids) - 7, 8):
                out += self._stored(int.from_bytes(pids[at : at + 8], "big")) or []
            self.unconfirmed.append(key)
        return out

    def confirm(self, committed: int | None) -> None:
        """Forget outbox entries below ``committed``, the sequencer offset committed last:
        the consumer commits only after the producer flushed, so their outputs are out."""
        if committed is None or not self.loaded:
            return
        n, done = len(_OUTBOX), []
        queue = self.unconfirmed
        while queue and int.from_bytes(queue[0][n : n + 8], "big") < committed:
            done.append(queue.popleft())
        if done:
            self.journal.delete_many(done)
            self.journal.apply(0)

    def _resume(self) -> list[Emit]:
        """After ``load``: what to send again (nothing here)."""
        return []

    def unload(self) -> None:
        """Forget the in-memory state (the partition was revoked)."""
        if self.journal.holding:  # a bug: the agent commits before it acknowledges
            log.error("steps never written were dropped at a revoke")
        self.journal.close_steps()
        self.loaded = False
        self.sequencer = Sequencer(self.order_wait)
        self.unconfirmed = deque()

    def _save_progress(self, partitions: Iterable[int]) -> None:
        seq = self.sequencer
        items = [(_PARTITIONS, str(seq.partitions).encode())]
        items += [
            (_PROGRESS + p.to_bytes(4, "big"), seq.progress[p].to_bytes()) for p in partitions
        ]
        self.journal.put_many(items)

    # -- messages --------------------------------------------------------------------

    def accept(self, msg: SequenceMsg) -> list[Emit]:
        """Take one sequencer message; returns what it answers at once (a page id decided
        before is answered with its stored decision). Call ``release`` next."""
        out = [] if self.loaded else self.load()
        if isinstance(msg, MarksMsg):
            before = self.sequencer.partitions
            moved, retimed = self.sequencer.on_marks(msg.partitions, msg.marks, msg.at)
            # A mark's time only ever releases pages that reached the sequencer before
            # it, so while none is pending a newer time alone is kept in memory: an idle
            # worker then writes nothing. The stored time stays older, which after a
            # restart only makes restored pages wait for fresh marks (as they would
            # anyway for a partition that moved to another worker).
            changed = moved + retimed if len(self.sequencer) else moved
            if changed or self.sequencer.partitions != before:
                self._save_progress(changed)
                self.journal.apply(0)
            out += self.resend_stalled()  # marks come every few hundred ms: a clock
            self._log_stalled()
        elif isinstance(msg, PageMsg):
            out += self._accept_page(msg)
        else:
            out += self._accept_other(msg)
        return out

    def resend_stalled(self) -> list[Emit]:
        """What to send again for work that waits too long (nothing here)."""
        return []

    def _log_stalled(self) -> None:
        """A ``WARNING`` (at most once a ``PENDING_STALLED_S``) naming the raw partitions
        that hold the next pending page back, once it has waited that long."""
        seq = self.sequencer
        waited = seq.waiting()
        now = time.monotonic()
        if waited < PENDING_STALLED_S or now - self._stall_logged < PENDING_STALLED_S:
            return
        self._stall_logged = now
        held_back = {
            p: (prog.last_page, prog.high, prog.through, prog.vouched, len(prog.held))
            if (prog := seq.progress.get(p)) is not None
            else None
            for p in seq.blocking()
        }
        log.warning(
            "the next pending page has waited %.0f s; raw partitions holding it back "
            "(last page offset, greatest order, marked through, mark time, held pages): %s",
            waited,
            held_back,
        )

    def _in_progress(self, key: Key) -> bool:
        """Whether the page ``key`` was released and is still being decided."""
        return False

    def _accept_other(self, msg: SequenceMsg) -> list[Emit]:
        log.warning("ignoring a %s: this worker does not route its index", type(msg).__name__)
        return []

    def _accept_page(self, msg: PageMsg) -> list[Emit]:
        a = msg.page
        if self.sequencer.observe(msg.partition, msg.offset, msg.partitions, a.order, msg.clear):
            self._save_progress([msg.partition])
        stored = self._stored(a.pid)
        key: Key = (a.order, a.page.page_id)
        arrived = self.arrived
        if stored is None and not self._in_progress(key) and self.sequencer.add(key, arrived):
            pending = {"ts": msg.timestamp, "a": msg.as_read or analysed_to_json(a)}
            if math.isfinite(arrived):
                pending["in"] = arrived
            value = orjson.dumps(pending)
            # the sequencer message is read again if a crash cuts this step short
            self.journal.put_unjournaled([(_PENDING + key_bytes(key), value)])
        self.journal.apply(0)
        if stored is not None:  # decided before: redelivered, or crawled again
            self.counts.repeated += 1
            return stored
        return []

    def release(self, limit: int = 100) -> list[Emit]:
        """Take up to ``limit`` pages that may now be released, in order."""
        out: list[Emit] = []
        seq = self.sequencer
        for _ in range(limit):
            if seq.peek() is None:
                break
            key = seq.pop()
            kb = key_bytes(key)
            (raw,) = self.journal.get_many([_PENDING + kb])
            if raw is None:  # cannot happen unless the store lost a write
                log.error(
                    "pending page %s vanished from the sequencer's store topic=%s partition=0 "
                    "offset=%s",
                    key,
                    self.topic,
                    self.offset,
                )
                continue
            pending = orjson.loads(raw)
            a = analysed_from_json(pending["a"])
            t0 = time.perf_counter()
            out.extend(self._released(a, float(pending["ts"])))
            # leaving the pending set is part of the page's step: one journal batch
            self.journal.delete_many([_PENDING + kb])
            self.journal.put_many([(_RELEASED, key_bytes(seq.released or key))])
            self.journal.apply(a.pid)
            if self.observe is not None:
                self.observe(time.perf_counter() - t0)
        return out

    # -- decide ----------------------------------------------------------------------

    def _released(self, a: Analysed, since: float) -> list[Emit]:
        """A page's turn has come: decide it now. Its writes are left in the journal, for
        the caller to apply with the rest of the page's step."""
        stored = self._stored(a.pid)
        if stored is not None:
            self.counts.repeated += 1
            return stored
        try:
            outcome = self.engine.decide_analysed(a)
            return self._conclude(a, outcome, since)
        except Exception as exc:  # a bug: logged once, the page is dead-lettered
            return self._failed(a, exc)

    def _conclude(self, a: Analysed, outcome: Outcome, since: float) -> list[Emit]:
        """Hand a decided page's writes to the journal; returns what it publishes."""
        engine = self.engine
        if outcome.merges:
            value = json.dumps([m.to_json() for m in outcome.merges], ensure_ascii=False)
            engine.kv.put_many([(_MERGES + pid_bytes(a.pid), value.encode())])
        # one key a sequencer message: its decisions' pids appended, one changelog record
        # for the message's steps (``JournalKV.hold``) instead of one a decision
        outbox = _OUTBOX + max(self.offset, 0).to_bytes(8, "big")
        (pids,) = engine.kv.get_many([outbox])
        engine.kv.put_many([(outbox, (pids or b"") + pid_bytes(a.pid))])
        if pids is None:
            self.unconfirmed.append(outbox)
        engine.kv.commit()
        kind = str(outcome.decision["decision"])
        self.counts.decisions[kind] = self.counts.decisions.get(kind, 0) + 1
        self.counts.merges += len(outcome.merges)
        return self._outputs(outcome.decision, outcome.merges, since)

    def _failed(self, a: Analysed, exc: Exception) -> list[Emit]:
        self.engine.kv.rollback()
        self.journal.discard()
        log.error(
            "decide failed on page %s (%s), released while handling topic=%s partition=0 offset=%s",
            a.page.page_id,
            a.page.url,
            self.topic,
            self.offset,
            exc_info=exc,
        )
        self.counts.internal += 1
        detail = f"{type(exc).__name__}: {exc}"[:500]
        rej = Rejected(Reason.INTERNAL, detail, a.page.page_id, a.page.url)
        return [Emit.json("rejects", rej.page_id, rej.to_json())]

    @staticmethod
    def _outputs(
        decision: dict[str, Any], merges: Iterable[Merge | dict[str, Any]], since: float = 0.0
    ) -> list[Emit]:
        out = [Emit.json("decisions", str(decision["page_id"]), decision, since)]
        for m in merges:
            body = m.to_json() if isinstance(m, Merge) else m
            out.append(Emit.json("merges", str(body["from_cluster"]), body))
        return out

    def _stored(self, pid: int) -> list[Emit] | None:
        """The messages published for a page decided before, or None."""
        rec = self.engine.clusters.page(pid)
        if rec is None:
            return None
        decision = stored_decision(self.engine.clusters, rec)
        (raw,) = self.journal.get_many([_MERGES + pid_bytes(pid)])
        return self._outputs(decision, json.loads(raw) if raw else [])
