"""The Faust application: topics, tables, agents and a timer. They only move records; the
stages they call are in ``neardup.kafka.stage`` and ``neardup.kafka.route`` (and, through
them, ``neardup.engine``). ``NEARDUP_TOPOLOGY`` chooses between two layouts of the state:

``routed`` (the default): the index partitioned by bucket ::

    raw-pages (N, key url)
      │ analyse ×N: parse_raw → engine.analyse (pure)     ───rejected──▶ rejected-pages
      ▼
    <app>-sequencer (1)  ◀── marks (timer): raw partition p drained up to offset X
      │ sequence ×1: order (fetched_at, page_id) → template filter → seq no.
      │   ▲ answers, sketches              table "state" (1): pending pages, progress,
      │   │                                  template counts, pages in flight, clusters
      ├──▶ <app>-probes (N, key bucket) ── probe ×N: read bucket, add entry; table "buckets"
      ├──▶ <app>-records (N, key pid) ──── records ×N: keep, send sketches; table "sketches"
      │ decide in seq order: Engine.decide over the answers, union-find clusters
      ├──▶ decisions (N, key page_id)
      ├──▶ cluster-merges (N, key from_cluster)
      └──▶ rejected-pages (internal errors)

``sequential``: the same, with the whole index in the table "state" and no probes.

Delivery is at least once; outputs are idempotent: a page is decided once, its decision
and merges are stored with the state before they are published, and a page seen again is
answered with exactly what was published for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import faust

from neardup.engine import Analysed, Stats
from neardup.kafka import assign, crc, dump, faustfix, freshness, rocksmem, wire
from neardup.kafka.absent import Absent
from neardup.kafka.http import serve
from neardup.kafka.inorder import Hole, Order, in_order
from neardup.kafka.metrics import Metrics
from neardup.kafka.route import ProbeCounts, RoutedStage, index_for, route_step
from neardup.kafka.security import aiokafka_kwargs, faust_credentials
from neardup.kafka.stage import DecideStage, Emit, analyse_messages, backlogged, drained
from neardup.kafka.tablekv import Changelog, StateInconsistentError, TableKV, event_context
from neardup.kafka.topics import (
    BUCKETS_TABLE,
    SKETCHES_TABLE,
    STATE_MAX_MESSAGE_BYTES,
    STATE_TABLE,
    TopicNames,
)
from neardup.records import Rejected
from neardup.settings import Settings

log = logging.getLogger("neardup.kafka")

#: Pages taken in one go by the sequencer between two flushes of the changelog.
RELEASE_BATCH = 200
#: Events an agent takes at most in one batch, and how long it waits to fill one. A batch
#: costs one flush of the changelog before its outputs go out (a broker round trip).
EVENT_BATCH = 500
EVENT_WAIT_S = 0.01
#: Raw pages the analyse agent takes at most in one batch. Its sandbox child analyses the
#: next pages of a batch while the agent forwards one; the loop runs the other agents
#: between two pages.
ANALYSE_BATCH = 32
#: A batch's analysed pages go to the sequencer as one framed message (``wire.frame``) of
#: about this many bytes at most: one record to produce and one event to take, not one a
#: page. (The internal topics take messages up to ``STATE_MAX_MESSAGE_BYTES``.)
SEQUENCER_FRAME_BYTES = 1 << 20
PRODUCER_BATCH_BYTES = 1 << 20
#: How long a message that no agent took may hold a partition's commits back before the
#: partition is read again from it (``Worker.unstick``).
STUCK_S = 10.0
#: How long a partition may be held back at an offset before the broker is asked whether
#: the offset holds a message at all (``Worker.unstick``, ``neardup.kafka.absent``).
GAP_CHECK_S = 1.0
#: Events Faust holds for an agent before it stops fetching its partitions (its
#: ``stream_buffer_maxsize``, 4,096 by default). With outputs slower than inputs (a slow
#: downstream) the default let the worker hold about 300 MB more than 512, with no more
#: pages/s (side by side, bench/faults.py --only slow); capping the raw topic's buffer alone saved
#: nothing, so it is the internal topics' messages (frames of analysed pages) that pile up.
STREAM_BUFFER_EVENTS = 512
#: How often the analyse agent looks again while the raw pages are paused.
PAUSED_POLL_S = 0.05

#: Bytes a partition per fetch while the tables are restored from their changelogs
#: (aiokafka's default, 1 MiB, made restoring a table fetch-bound) ...
RESTORE_FETCH_BYTES = 16 << 20
#: ... and the rest of the time (``faustfix.set_fetch_size``). Fetches of 16 MiB of raw
#: pages cost the consumer thread about twice the CPU a page of fetches of 1 MiB (asyncio's
#: stream reader copies each response as it grows and again as it hands it over), but
#: with 1 MiB two workers made about 5% fewer pages/s; 4 MiB kept most of the saving and
#: not that loss (side by side, pinned: commit messages of this line's history).
STREAM_FETCH_BYTES = 4 << 20

#: Changelogs are compacted topics. Pages pending and in flight are written, then
#: deleted, a step later, so most of a changelog's bytes are values that compaction drops;
#: but Kafka never compacts the segment being written, 1 GiB by default. Smaller segments
#: and an eager cleaner keep what a restarted worker must read close to the live state.
#: (Tombstones stay a day, Kafka's default delete.retention.ms, set here because local
#: tables that catch up from their changelog rely on it: ``neardup.kafka.freshness``; a
#: restore that started from the beginning still sees every deletion.)
CHANGELOG_CONFIGS = {
    "delete.retention.ms": str(freshness.TOMBSTONE_RETENTION_MS),
    "max.message.bytes": str(STATE_MAX_MESSAGE_BYTES),
    "segment.bytes": str(64 << 20),
    "min.cleanable.dirty.ratio": "0.2",
}

Send = Callable[[Any, bytes | None, bytes, int | None], Awaitable[Any]]


def _unframed(event: Any, decode: Callable[[bytes], Any], what: str) -> list[Any] | None:
    """The messages framed in an internal event, or None (logged) if it is undecodable."""
    try:
        return [decode(item) for item in wire.unframe(event.value)]
    except wire.WireError as exc:
        msg = event.message
        log.error(
            "undecodable %s message topic=%s partition=%s offset=%s: %s",
            what,
            msg.topic,
            msg.partition,
            msg.offset,
            exc,
        )
        return None


def _raw_schema() -> faust.Schema[bytes, bytes]:
    return faust.Schema(
        key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class StateGate:
    """Agent steps that write the worker's tables, held back during a rebalance: from
    the moment partitions are revoked until Faust has restored the tables it assigns."""

    def __init__(self, timeout: float) -> None:
        #: How long ``close`` waits for the steps under way.
        self.timeout = timeout
        self._open = asyncio.Event()
        self._open.set()
        self._steps = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        """One step: it starts once the gate is open."""
        while not self._open.is_set():  # closed again before this step woke: wait again
            await self._open.wait()
        self._steps += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._steps -= 1
            if not self._steps:
                self._idle.set()

    async def close(self) -> None:
        """No new step starts; returns when the steps under way have finished. A step
        that does not finish within ``timeout`` is an error: the worker stops (Faust
        crashes it on an error at a revoke) and, restarted, undoes its local writes that
        the changelogs may lack and catches up from them; what was only written locally
        had not been published."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout)
        except TimeoutError:
            raise RuntimeError(
                f"a state step did not finish within {self.timeout:g} s of a revoke"
            ) from None

    def open(self) -> None:
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()


class Worker:
    """One worker process: the Faust app and the stages its agents call."""

    def __init__(
        self, settings: Settings, *, store: str = "rocksdb://", serve_http: bool = True
    ) -> None:
        if settings.processing_guarantee == "exactly_once":
            raise SystemExit(
                "neardup worker: NEARDUP_PROCESSING_GUARANTEE=exactly_once is not supported. "
                "Faust's transactions pick the producer by the output partition, so they "
                "cannot cover the sequencer topic or the outputs, which are not co-partitioned "
                "with the raw topic. Use at_least_once: the worker's outputs are idempotent "
                "(one decision per page; a redelivered page gets the same decision again)."
            )
        self.settings = settings
        self.cfg = settings.engine_config()
        self.names = TopicNames.of(settings)
        self.routed = settings.topology == "routed"
        self._init_unstick(settings)
        #: Whether this worker holds its raw partitions paused (``admit``), how often it
        #: paused them, and the sequencer topic's backlog when last looked at.
        self.paused = False
        self.pauses = 0
        self.backlog = 0
        faustfix.install()
        crc.install()
        if store.startswith("rocksdb"):
            rocksmem.bound(settings.rocksdb_memory_mb << 20)
        self.app = app = faust.App(
            settings.app_id,
            broker=[f"kafka://{h}" for h in settings.brokers.split(",")],
            broker_credentials=faust_credentials(settings),
            store=store,
            datadir=settings.state_dir,
            processing_guarantee="at_least_once",
            stream_buffer_maxsize=STREAM_BUFFER_EVENTS,
            topic_partitions=settings.partitions,
            topic_replication_factor=settings.replication,
            table_standby_replicas=settings.standby_replicas,
            broker_commit_interval=settings.commit_interval_ms / 1000,
            broker_session_timeout=settings.session_timeout_ms / 1000,
            consumer_group_instance_id=settings.group_instance_id,
            broker_heartbeat_interval=settings.session_timeout_ms / 1000 / 5,
            consumer_auto_offset_reset="earliest",
            producer_max_request_size=STATE_MAX_MESSAGE_BYTES,
            # aiokafka holds one batch per partition while another is in flight: with
            # Kafka's 16 KiB, each analysed page (~15 KiB) would wait for a round trip
            producer_max_batch_size=PRODUCER_BATCH_BYTES,
            # from the start: a worker's first assignment restores its tables
            consumer_max_fetch_size=RESTORE_FETCH_BYTES,
            PartitionAssignor=assign.assignor(
                self.names.raw, self.names.sequence, settings.sequencer_weight
            ),
            web_enabled=False,
            autodiscover=False,
            stream_wait_empty=False,
        )
        # one schema object each: Faust updates a schema in place from what uses it
        self.raw = app.topic(self.names.raw, schema=_raw_schema())
        self.sequence = app.topic(
            self.names.sequence, schema=_raw_schema(), partitions=1, internal=True
        )
        self.decisions = app.topic(self.names.decisions, schema=_raw_schema())
        self.merges = app.topic(self.names.merges, schema=_raw_schema())
        self.rejects = app.topic(self.names.rejects, schema=_raw_schema())
        self.changelog = Changelog(app)
        app.neardup_changelog = self.changelog  # type: ignore[attr-defined]  # guard_commits
        self.state_table = self._table(STATE_TABLE, 1)
        kv = TableKV(self.state_table, self.changelog)
        wait = settings.order_wait_ms / 1000 if settings.order_wait_ms else math.inf
        self.stage = (
            RoutedStage(kv, self.cfg, settings.partitions, order_wait=wait, hold=True)
            if self.routed
            else DecideStage(kv, self.cfg, order_wait=wait, hold=True)
        )
        self.analyse_stats = Stats()
        self.probe_counts = ProbeCounts()
        self.metrics = Metrics(self)
        self.stage.observe = self.metrics.observe_decide
        self.send: Send = self._send
        self.flush: Callable[[], Awaitable[None]] = self._flush
        self.ready = False
        self.gate = StateGate(settings.session_timeout_ms / 1000)
        #: Partitions were revoked and none assigned since (a rebalance under way).
        self.revoked = False

        async def analyse_agent(stream: Any) -> None:
            async for events in stream.take_events(ANALYSE_BATCH, within=EVENT_WAIT_S):
                await faustfix.acked_when_done(stream, events, self.on_raws)

        async def sequence_agent(stream: Any) -> None:
            async for events in stream.take_events(EVENT_BATCH, within=EVENT_WAIT_S):
                await faustfix.acked_when_done(stream, events, self.on_sequence)

        async def http_task() -> None:
            await serve(settings.http_host, settings.http_port, self.metrics.render, self.is_ready)

        self.analyse_agent = self._agent(self.raw, "neardup.analyse", analyse_agent)
        self.sequence_agent = self._agent(self.sequence, "neardup.sequence", sequence_agent)
        if self.routed:
            self._routing_agents()
        self._timers(settings.mark_interval_ms / 1000)
        self._signals()
        if serve_http:
            app.task(http_task)
        app.task(self._on_loop_start)

    def _signals(self) -> None:
        app = self.app

        async def before_shutdown(sender: Any, *args: Any, **kwargs: Any) -> None:
            self.ready = False
            await self.absent.close()

        # (cast: mode types a receiver with a keyword-only ``signal`` parameter)
        cast(Any, app.on_partitions_revoked).connect(self._on_revoked)
        cast(Any, app.on_partitions_assigned).connect(self._on_assigned)
        cast(Any, app.on_rebalance_complete).connect(self._on_rebalance_complete)
        cast(Any, app.on_before_shutdown).connect(before_shutdown)

    def _init_unstick(self, settings: Settings) -> None:
        #: Partitions seen stuck (``faustfix.stuck_partitions``): offset, since when.
        self.stuck: dict[Any, tuple[int, float]] = {}
        #: Partitions read again from a stuck offset: how many times, and last from
        #: which offset and when.
        self.rereads = 0
        self.reread: dict[Any, tuple[int, float]] = {}
        #: Stuck partitions whose offset the broker said holds a message, and that offset.
        self.present: dict[Any, int] = {}
        #: Runs of offsets the broker said hold no message (``mark_absent``).
        self.absent_runs = 0
        self.absent = Absent(settings.brokers, aiokafka_kwargs(settings))
        #: The sequencer's partitions (``neardup.kafka.inorder``): the next offset to
        #: take; where taking began, for a partition with no committed offset then; and
        #: each open hole (``unstick`` reads the partition again from it).
        self.seq_next: dict[Any, int] = {}
        self.seq_start: dict[Any, int] = {}
        self.holes: dict[Any, Hole] = {}
        #: Sequencer messages left unacknowledged for being past a hole.
        self.out_of_order = 0

    async def _on_loop_start(self) -> None:
        loop = asyncio.get_running_loop()
        kind = type(loop)
        log.info("event loop: %s.%s (NEARDUP_EVENT_LOOP)", kind.__module__, kind.__qualname__)
        # after mode's own signal handlers: the worker installs them before its app starts
        dump.install(loop, self.describe)

    def _timers(self, interval: float) -> None:
        async def marks_timer() -> None:
            await self.send_marks()
            await self.unstick()

        async def admit_timer() -> None:
            await self.admit()

        #: When the tables were last stamped as caught up (``stamp_tables``).
        self.stamped_at = -math.inf
        self.standby_marks = freshness.StandbyMarks()

        async def stamp_timer() -> None:
            # at once after a restore, then every STAMP_INTERVAL_S
            due = time.monotonic() - self.stamped_at >= freshness.STAMP_INTERVAL_S
            if due and self.is_ready():
                asked = time.time()
                ends = await self.standby_ends()
                if self.is_ready():  # and still, after asking the broker
                    self.stamp_tables(ends, asked)
                    self.stamped_at = time.monotonic()

        self.app.timer(interval, name="neardup.marks")(marks_timer)
        self.app.timer(interval, name="neardup.admit")(admit_timer)
        self.app.timer(interval, name="neardup.stamp")(stamp_timer)

    async def standby_ends(self) -> dict[Any, int]:
        """Where the changelog of each of this worker's standby partitions ends, from the
        broker (the consumer's own highwater is only as fresh as its last fetch of the
        partition); none if the broker cannot say now: they wait for the next tick."""
        standbys = self.app.assignor.assigned_standbys()
        if not standbys:
            return {}
        try:
            ends = await self.app.consumer.highwaters(*standbys)
        except Exception as exc:  # the stamps only wait
            log.info("cannot ask where the standby changelogs end: %s", exc)
            return {}
        return {tp: int(end) for tp, end in ends.items() if end is not None}

    def stamp_tables(self, ends: dict[Any, int], now: float) -> int:
        """Stamp the databases of the table partitions assigned to this worker as caught up
        with their changelogs (``neardup.kafka.freshness``): every active one at ``now``,
        each standby at the latest time its changelog ended (``ends``, asked of the broker
        at ``now``) where its applied offset has reached since. Call only when ready (no
        restore under way). How many were stamped."""
        consumer: Any = self.app.consumer
        assigned = consumer.assignment()
        standbys = self.app.assignor.assigned_standbys()
        self.standby_marks.keep(standbys)
        if standbys:
            # the standby records Faust's own path took (faustfix.bulk_standbys writes
            # the rest at once) wait until a table's buffer holds 1,000 of them (or a
            # rebalance, or a stop): a quiet standby would otherwise trail its
            # changelog's end indefinitely, and never be stamped
            cast(Any, self.app.tables).recovery.flush_buffers()
        stamped = failed = 0
        for table in list(self.app.tables.values()):
            store = table.data
            dbs = getattr(store, "_dbs", None)  # a RocksDB store's open partitions
            if not dbs:
                continue
            topic = table.changelog_topic.get_topic_name()
            for tp in (tp for tp in assigned if tp.topic == topic and tp.partition in dbs):
                at: float | None = now
                if tp in standbys:
                    applied = store.persisted_offset(tp)
                    at = self.standby_marks.caught_up_at(tp, ends.get(tp), applied, now)
                    if at is None:
                        continue
                try:
                    freshness.stamp(Path(store.partition_path(tp.partition)), at)
                except OSError as exc:  # a full disk: at worst a restore at the next start
                    failed += 1
                    error = exc
                    continue
                stamped += 1
        if failed:
            log.warning("cannot stamp %d local tables as caught up: %s", failed, error)
        return stamped

    def _table(self, name: str, partitions: int) -> Any:
        return self.app.Table(
            name,
            schema=_raw_schema(),
            key_type=bytes,
            value_type=bytes,
            partitions=partitions,
            extra_topic_configs=CHANGELOG_CONFIGS,
        )

    def _routing_agents(self) -> None:
        app, n = self.app, self.settings.partitions
        self.probes = app.topic(
            self.names.probes, schema=_raw_schema(), partitions=n, internal=True
        )
        self.records = app.topic(
            self.names.records, schema=_raw_schema(), partitions=n, internal=True
        )
        self.buckets_table = self._table(BUCKETS_TABLE, n)
        self.sketches_table = self._table(SKETCHES_TABLE, n)
        self.index = index_for(self.cfg)

        async def probe_agent(stream: Any) -> None:
            async for events in stream.take_events(EVENT_BATCH, within=EVENT_WAIT_S):
                await faustfix.acked_when_done(stream, events, self.on_probes)

        async def records_agent(stream: Any) -> None:
            async for events in stream.take_events(EVENT_BATCH, within=EVENT_WAIT_S):
                await faustfix.acked_when_done(stream, events, self.on_records)

        self.probe_agent = self._agent(self.probes, "neardup.probe", probe_agent)
        self.records_agent = self._agent(self.records, "neardup.records", records_agent)

    async def on_probes(self, events: list[Any]) -> None:
        await self.on_route(events, self.buckets_table)

    async def on_records(self, events: list[Any]) -> None:
        await self.on_route(events, self.sketches_table)

    def _agent(self, topic: Any, name: str, fun: Callable[[Any], Awaitable[None]]) -> Any:
        # An exception out of an agent is a bug: the worker stops (and is restarted, and
        # replays what it had not committed) rather than go on past a half-done step.
        from mode import CrashingSupervisor

        return self.app.agent(topic, name=name, supervisor_strategy=CrashingSupervisor)(fun)

    # -- agents ----------------------------------------------------------------------

    async def on_raws(self, events: list[Any]) -> None:
        """Raw pages, in order: each analysed, then forwarded to the sequencer or
        dead-lettered. The sandbox's child analyses the next pages meanwhile
        (``analyse_messages``)."""
        while self.paused:  # the pages fetched already wait too (``admit``)
            await asyncio.sleep(PAUSED_POLL_S)
        # Waiting for the child here, the loop blocked, costs less than handing the wait to
        # a thread (measured: 30% more CPU a page, and slower) or awaiting its pipe in the
        # loop (bench/worker.py: fewer pages/s and more CPU a page).
        sandbox = self.stage.engine.sandbox
        results = analyse_messages((e.value for e in events), self.cfg, self.analyse_stats, sandbox)
        handled: dict[Any, set[int]] = {}  # per partition: offsets forwarded in this batch
        framed: list[bytes] = []  # pages for the sequencer, sent as one message
        size = 0
        try:
            t0 = time.perf_counter()
            for event, result in zip(events, results, strict=True):
                self.metrics.observe_analyse(time.perf_counter() - t0)
                handled_here = handled.setdefault(event.message.tp, set())
                page = await self._forward(event, result, handled_here)
                if page is not None:
                    framed.append(page)
                    size += len(page)
                if size >= SEQUENCER_FRAME_BYTES:
                    await self.send(self.sequence, None, wire.frame(framed), None)
                    framed, size = [], 0
                await asyncio.sleep(0)  # what the other agents published goes out meanwhile
                t0 = time.perf_counter()
            if framed:
                await self.send(self.sequence, None, wire.frame(framed), None)
        finally:
            results.close()  # left early (stopping): the child drops the pages written ahead

    async def _forward(
        self, event: Any, result: Analysed | Rejected, handled: set[int]
    ) -> bytes | None:
        """A raw page's result: a dead letter sent now, or the page's sequencer message,
        returned to be sent before any later page; its offset added to ``handled``."""
        msg = event.message
        if isinstance(result, Rejected):
            log.info(
                "page rejected topic=%s partition=%s offset=%s reason=%s page_id=%s url=%s: %s",
                msg.topic,
                msg.partition,
                msg.offset,
                result.reason,
                result.page_id,
                result.url,
                result.detail,
            )
            key = result.page_id.encode() if result.page_id else None
            await self.send(self.rejects, key, _json(result.to_json()), None)
            out = None
        else:
            ts = float(msg.timestamp or 0.0)
            clear = faustfix.handled_below(self.app.consumer, msg.tp, msg.offset, handled)
            page = wire.PageMsg(msg.partition, msg.offset, self.raw_partitions(), result, ts, clear)
            out = wire.encode(page)
        handled.add(msg.offset)
        return out

    @contextlib.asynccontextmanager
    async def _state_step(self, events: list[Any]) -> AsyncIterator[list[Any]]:
        """An agent step that writes the tables (``StateGate.step``), with the events of
        ``events`` whose partitions are still assigned here: the others, taken before
        partitions moved, are their new owner's to handle (written here, they would go
        to a table partition this worker no longer keeps)."""
        async with self.gate.step():
            yield self._assigned(events)

    def _assigned(self, events: list[Any]) -> list[Any]:
        kept = faustfix.assigned(self.app, events)
        if len(kept) < len(events):
            log.info("%d events of partitions no longer assigned left to their new owner",
                     len(events) - len(kept))  # fmt: skip
        return kept

    async def on_sequence(self, events: list[Any]) -> list[Any]:
        """A batch of sequencer messages: release what they allow; publish once the state
        they changed is stored (one flush for the batch). Returns the messages left
        unacknowledged, to be read again in offset order (``neardup.kafka.inorder``)."""
        async with self._state_step(events) as mine:
            try:
                return await self._sequence(mine)
            except StateInconsistentError:
                self.changelog.failed = True  # the next start restores the tables
                raise

    async def _sequence(self, events: list[Any]) -> list[Any]:
        emits: list[Emit] = []
        taken: dict[Any, int] = {}  # the next offset to take, after this batch
        ahead: list[Any] = []
        confirmed = False
        for event in events:
            msg = event.message
            order = self._in_order(msg, taken)
            if order is Order.AHEAD:
                ahead.append(event)
            if order is Order.AHEAD or order is Order.AGAIN:
                continue
            if order is Order.TAKE:
                taken[msg.tp] = msg.offset + 1
            items = _unframed(event, wire.decode, "sequencer")
            if items is None:
                continue
            try:
                with event_context(event):
                    try:
                        self.stage.offset = msg.offset
                        self.stage.topic = msg.topic
                        self.stage.arrived = float(msg.timestamp or -math.inf)
                        if not confirmed:
                            self.stage.confirm(self._committed(msg.tp))
                            confirmed = True
                        for decoded in items:
                            emits += self.stage.accept(decoded)
                        emits += self.stage.release(RELEASE_BATCH)
                        while self.stage.busy():
                            if len(emits) > RELEASE_BATCH:
                                if not self.changelog.failed:  # (the flush raises)
                                    self.stage.commit()
                                await self._flush_publish(emits)
                                emits = []
                            emits += self.stage.release(RELEASE_BATCH)
                    finally:
                        # the message's steps, written as one (in its partition's store);
                        # after a failed write nothing more is written
                        if not self.changelog.failed:
                            self.stage.commit()
            except Exception:
                log.exception(
                    "sequencer failed topic=%s partition=%s offset=%s",
                    msg.topic,
                    msg.partition,
                    msg.offset,
                )
                raise
        if emits:
            await self._flush_publish(emits)
        else:
            await self.flush_changelog(wait=False)
        self.seq_next.update(taken)
        return ahead

    def _in_order(self, msg: Any, taken: dict[Any, int]) -> Order:
        """``in_order`` for a sequencer message, ``taken`` the batch's next offsets so
        far. Before the first message since the partition was assigned, the next offset
        is the committed one (where Faust starts reading)."""
        tp = msg.tp
        expected = taken.get(tp, self.seq_next.get(tp))
        if expected is None:
            expected = self._committed(tp)
            if expected is None:  # no commit to check against: taking starts here
                self.seq_start[tp] = msg.offset
                return Order.TAKE
        order = in_order(
            expected, msg.offset, functools.partial(self._passed, tp), self.seq_start.get(tp)
        )
        if order is Order.TAKE:
            self.holes.pop(tp, None)  # the hole, if any, is filled (or held no message)
        elif order is Order.AHEAD:
            self.out_of_order += 1
            if tp not in self.holes:  # a new hole
                log.warning(
                    "partition %s[%d]: the message at offset %d came before the one at %d, "
                    "which was dropped on the way: the messages from %d on are left to be "
                    "read again in order",
                    tp.topic,
                    tp.partition,
                    msg.offset,
                    expected,
                    msg.offset,
                )
                self.holes[tp] = Hole(expected, msg.offset, time.monotonic())
        return order

    def _passed(self, tp: Any, begin: int, end: int) -> bool:
        return faustfix.passed_over(self.app.consumer, tp, begin, end)

    async def _flush_publish(self, emits: list[Emit]) -> None:
        # the state first: a published decision is always one the state remembers
        await self.flush()
        await self.publish(emits)

    async def on_route(self, events: list[Any], table: Any) -> None:
        """Probes, sketches to keep and verifications, against each event's partition of
        ``table``; the answers go to the sequencer."""
        async with self._state_step(events) as mine:
            await self._route(mine, table)

    async def _route(self, events: list[Any], table: Any) -> None:
        kv = TableKV(table, self.changelog)
        replies: list[bytes] = []
        for event in events:
            items = _unframed(event, wire.decode_route, "routing")
            if items is None:
                continue
            try:
                with event_context(event):
                    answers = route_step(self.index, kv, items, self.probe_counts)
            except Exception:
                msg = event.message
                log.exception(
                    "routing failed topic=%s partition=%s offset=%s",
                    msg.topic,
                    msg.partition,
                    msg.offset,
                )
                raise
            replies += map(wire.encode, answers)
        # no wait for the broker: a probe delivered again answers the same and adds nothing
        # twice; but the records go to the producer before the batch's offsets are acked
        await self.flush_changelog(wait=False)
        if replies:
            await self.send(self.sequence, None, wire.frame(replies), None)

    async def publish(self, emits: list[Emit]) -> None:
        """Outputs one message each; internal messages framed, one per partition."""
        topics = {"decisions": self.decisions, "merges": self.merges, "rejects": self.rejects}
        internal: dict[tuple[str, int | None], list[bytes]] = {}
        for emit in emits:
            if emit.topic in topics:
                await self.send(topics[emit.topic], emit.key, emit.value, emit.partition)
            else:
                internal.setdefault((emit.topic, emit.partition), []).append(emit.value)
        for (topic, partition), values in internal.items():
            target = self.probes if topic == "probes" else self.records
            await self.send(target, None, wire.frame(values), partition)
        self.metrics.observe_emits(emits)

    async def send_marks(self) -> None:
        """Tell the sequencer which of this worker's raw partitions are drained, and up to
        which offset: those whose committed offset has reached their end offset."""
        consumer: Any = self.app.consumer
        tps = sorted(tp for tp in consumer.assignment() if tp.topic == self.names.raw)
        if not tps:
            self.metrics.lag = {}  # a partition this worker lost is another's to report
            return
        # before the end offsets are read: the marks vouch for what was forwarded by then
        at = time.time()
        ends = await consumer.highwaters(*tps)
        # Faust's own record of the offsets it committed for the partitions it owns; they
        # are committed only after everything produced before has been flushed.
        committed = {tp: consumer._committed_offset.get(tp) for tp in tps}
        unknown = [tp for tp in tps if committed[tp] is None]
        earliest = await consumer.earliest_offsets(*unknown) if unknown else {}
        marks, lag = drained(
            {tp.partition: ends.get(tp) for tp in tps},
            {tp.partition: committed[tp] for tp in tps},
            {tp.partition: earliest.get(tp) for tp in tps},
        )
        # only the partitions held now: one lost in a rebalance is reported by its new owner
        self.metrics.lag = lag
        # none while paused (``admit``): marks are sequencer messages too, and a steady
        # flow of them behind slow commits could keep the backlog from ever draining
        if marks and not self.paused:
            msg = wire.MarksMsg(self.raw_partitions(), tuple(marks), at)
            await self.send(self.sequence, None, wire.encode(msg), None)

    async def admit(self) -> None:
        """Pause this worker's raw partitions while the sequencer topic holds more than
        ``max_backlog`` messages the sequencer has not committed, and resume them once it
        is down to half (``stage.backlogged``). The analyse agent waits meanwhile, with
        the pages it has fetched already. Only the worker that runs the sequencer knows
        the backlog without asking the group coordinator, so only it pauses: asking from
        a timer went through Faust's consumer thread, where a call that hangs (the
        coordinator moving in a rebalance) holds every fetch back. (Pages pending in the
        sequencer do not count: they may be waiting for the very partitions paused.)"""
        limit = self.settings.max_backlog
        if limit <= 0 or self.app.rebalancing:
            return
        generation = self.app.consumer_generation_id
        consumer: Any = self.app.consumer
        tp = consumer._new_topicpartition(self.names.sequence, 0)
        if tp not in consumer.assignment():
            self.backlog = 0  # not this worker's: no pause (see above)
        else:
            done = consumer._committed_offset.get(tp)
            try:
                end = (await consumer.highwaters(tp)).get(tp) if done is not None else None
            except Exception as exc:  # no answer now: keep the state, look again next tick
                log.debug("sequencer backlog unknown: %r", exc)
                return
            if end is None or done is None or self._moved_since(generation):
                return
            self.backlog = max(0, int(end) - int(done))
        paused = backlogged(self.backlog, self.paused, limit)
        raw = [t for t in consumer.assignment() if t.topic == self.names.raw]
        if paused:
            consumer.pause_partitions(raw)  # again each tick: partitions assigned since
        elif self.paused:
            consumer.resume_partitions(raw)
            await self._read_again(raw, generation)
        if paused != self.paused:
            self.pauses += paused
            log.info(
                "%s reading raw pages: %d messages wait for the sequencer (limit %d)",
                "pausing" if paused else "resuming",
                self.backlog,
                limit,
            )
        self.paused = paused

    async def _read_again(self, tps: list[Any], generation: int) -> None:
        """After a pause: read ``tps`` again from their committed offsets. Faust's fetch
        loop drops the rest of a fetched batch for a partition paused while it hands the
        batch out, and the consumer's position has moved past those records: without a
        seek they would never come (measured: the slow-downstream test stalled). What is
        read twice is answered twice, identically. Not after a rebalance since
        ``generation`` (it reads every partition from its committed offset itself)."""
        consumer: Any = self.app.consumer
        unknown = [tp for tp in tps if consumer._committed_offset.get(tp) is None]
        earliest = await consumer.earliest_offsets(*unknown) if unknown else {}
        if self._moved_since(generation):
            return
        for tp in tps:
            offset = consumer._committed_offset.get(tp)
            if offset is None:
                offset = earliest.get(tp)
            if offset is not None:
                self._seek(tp, int(offset))

    async def unstick(self) -> None:
        """Free a partition whose commits are held back at an offset that no agent holds
        (``faustfix.stuck_partitions``). After ``GAP_CHECK_S``, ask the broker which
        offsets from there hold no message (transaction markers, compacted records) and
        let the commits pass over those (``faustfix.mark_absent``). If the message is
        there, it was dropped on the way (a message Faust skipped around a rebalance,
        never acknowledged, or passed over as read when a batch fetched before a seek
        came after it): read the partition again from it, at once if a later message was
        handled or the sequencer left one (``neardup.kafka.inorder``: however busy the
        topic), else after ``STUCK_S``. What is read twice is answered twice,
        identically (the sequencer takes a copy of a message it took already only
        once)."""
        consumer: Any = self.app.consumer
        if self.app.rebalancing:
            # (not the sequencer's holes: the revoke and the assignment forget those, and
            # its steps may run before the rebalance ends, after the restore)
            self.stuck, self.present, self.reread = {}, {}, {}
            return
        now = time.monotonic()
        seen, self.stuck = self.stuck, {}
        idle = functools.partial(faustfix.topic_idle, self.app)
        asked = False
        left = {tp: hole.left for tp, hole in self.holes.items()}
        stuck = faustfix.stuck_partitions(consumer, idle, left)
        for tp, (offset, why) in stuck.items():
            first = seen.get(tp)
            since = first[1] if first is not None and first[0] == offset else now
            self.stuck[tp] = (offset, since)
            if now - since < GAP_CHECK_S:
                continue
            if self.present.get(tp) != offset:
                if asked:
                    continue  # one question a tick: the marks timer waits for the answer
                asked = True
                if not await self._pass_absent(tp, offset) or not self._still(tp, offset):
                    continue
            if why == faustfix.UNREAD:
                continue  # not dropped: it comes with a fetch
            # a message after it was handled (or left by the sequencer): it was surely
            # dropped (a stream takes a partition's messages in order); read past it:
            # maybe only just sought to
            if why == faustfix.READ and now - since < STUCK_S:
                continue
            last = self.reread.get(tp)
            if last is not None and last[0] == offset and now - last[1] < STUCK_S:
                continue  # read again from there already: give that time
            log.warning(
                "partition %s[%d]: the message at offset %d was dropped before any agent "
                "took it, and holds the commits back: reading the partition again from it",
                tp.topic,
                tp.partition,
                offset,
            )
            self.rereads += 1
            self.reread[tp] = (offset, now)
            self._seek(tp, offset)
        await self._reread_holes(now, asked)

    async def _reread_holes(self, now: float, asked: bool) -> None:
        """A hole of the sequencer's partition open for ``STUCK_S`` that the rule above
        has not read again (``stuck_partitions`` did not name the partition, as when a
        commit is in flight, or named it but the broker gave no answer for ``STUCK_S``)
        is read again from the offset the sequencer waits for. Before, one broker
        question if none was asked this tick: it marks that offset absent if it holds no
        message, and ``in_order`` then takes the message after it. The sequencer holds
        every page after a hole, so closing it must not depend on the commits, or on the
        broker's answers, alone."""
        consumer: Any = self.app.consumer
        for tp, hole in list(self.holes.items()):
            at, since = hole.at, hole.since
            last = self.reread.get(tp)
            seen = self.stuck.get(tp)
            if now - since < STUCK_S or (seen is not None and now - seen[1] < STUCK_S):
                continue  # too soon; or the commits show it: the rule above has its time
            if last is not None and now - last[1] < STUCK_S:
                continue  # read again already: give that time
            if not asked:
                asked = True
                await self._pass_absent(tp, at)
                if (
                    self.app.rebalancing
                    or tp not in consumer.assignment()
                    or self.holes.get(tp) != hole
                ):
                    return  # moved, or filled, while the question was out
            log.warning(
                "partition %s[%d]: the sequencer has waited %.0f s for the message at offset "
                "%d (committed: %s), and it was not read again: reading the partition again "
                "from it",
                tp.topic,
                tp.partition,
                now - since,
                at,
                consumer._committed_offset.get(tp),
            )
            self.rereads += 1
            self.reread[tp] = (at, now)
            self._seek(tp, at)
            return

    def _moved_since(self, generation: int) -> bool:
        """After an ``await``: whether a rebalance began or happened since the group's
        ``generation`` (it seeks every partition to its committed offset itself; a seek
        asked for now would come after that one)."""
        return bool(self.app.rebalancing) or self.app.consumer_generation_id != generation

    def _still(self, tp: Any, offset: int) -> bool:
        """After an ``await`` in ``unstick``: whether ``tp`` is still this worker's and
        held back at ``offset`` (a rebalance may have come in between)."""
        consumer: Any = self.app.consumer
        return (
            not self.app.rebalancing
            and tp in consumer.assignment()
            and consumer._committed_offset.get(tp) == offset
        )

    async def _pass_absent(self, tp: Any, offset: int) -> bool:
        """Ask the broker which offsets of ``tp`` from ``offset`` on hold no message, up
        to the last one acknowledged (or the end). Returns whether ``offset`` holds one
        (False also when the broker did not answer)."""
        consumer: Any = self.app.consumer
        after = [o for o in consumer._acked.get(tp) or () if o > offset]
        if (hole := self.holes.get(tp)) is not None and hole.left >= offset:
            after.append(hole.left)  # it holds a message: the question need not go further
        try:
            end = int(consumer.highwater(tp))
        except Exception:
            return False
        stop = max(after) + 1 if after else end
        if stop <= offset:
            return False
        runs = await self.absent.between(tp.topic, tp.partition, offset, stop)
        if runs is None or tp not in consumer.assignment():
            return False
        for begin, until in runs:
            faustfix.mark_absent(consumer, tp, begin, until)
            self.absent_runs += 1
            log.info(
                "partition %s[%d]: offsets %d to %d hold no message (transaction markers or "
                "compacted records): the commits pass over them",
                tp.topic,
                tp.partition,
                begin,
                until - 1,
            )
        if runs and runs[0][0] == offset:
            return False
        self.present[tp] = offset
        return True

    def _seek(self, tp: Any, offset: int) -> None:
        """Have ``tp`` read again from ``offset``: the fetch loop seeks there before its
        next fetch, once the batch in hand is delivered (``faustfix.request_seek``)."""
        faustfix.request_seek(self.app.consumer, tp, offset)

    def describe(self) -> str:
        """For ``dump``: each assigned partition's offsets as the consumer sees them, the
        streams' queues, and the backpressure and sequencer state."""
        consumer: Any = self.app.consumer
        taken = [(m.tp, m.offset) for m in list(consumer.unacked)]
        now, holes = time.monotonic(), list(self.holes.items())
        lines = [
            f"worker: rebalancing={self.app.rebalancing} flow_active={consumer.flow_active} "
            f"paused={self.paused} backlog={self.backlog} pending={len(self.stage.sequencer)} "
            f"waiting={self.stage.sequencer.waiting():.1f}s "
            f"blocking={sorted(self.stage.sequencer.blocking())} "
            f"next={ {str(tp): o for tp, o in self.seq_next.items()} } "
            f"holes={ {str(tp): (h.at, h.left, round(now - h.since, 1)) for tp, h in holes} }",
            "partitions (committed, committing, read, highwater, acked, taken, paused, active):",
        ]
        committing = getattr(consumer, "_neardup_committing", None) or {}
        for tp in sorted(consumer.assignment()):
            try:
                end = consumer.highwater(tp)
            except Exception:
                end = None
            acked = consumer._acked.get(tp) or []
            held = sorted(o for t, o in taken if t == tp)
            lines.append(
                f"  {tp.topic}[{tp.partition}]: {consumer._committed_offset.get(tp)}, "
                f"{committing.get(tp)}, {consumer._read_offset.get(tp)}, {end}, "
                f"{len(acked)} from {min(acked) if acked else None}, "
                f"{len(held)} from {held[0] if held else None}, "
                f"{tp in consumer._paused_partitions}, {tp in consumer._active_partitions}"
            )
        conductor: Any = self.app.topics
        for topic, channels in sorted(conductor._topic_name_index.items()):
            sizes = [channel.queue.qsize() for channel in list(channels)]
            lines.append(f"  queue {topic}: {sizes}")
        return "\n".join(lines)

    # -- plumbing --------------------------------------------------------------------

    def _committed(self, tp: Any) -> int | None:
        """The offset Faust last committed for ``tp`` in this run (None: none yet)."""
        try:
            consumer: Any = self.app.consumer
            committed = consumer._committed_offset.get(tp)
        except Exception:  # no consumer (agent tests)
            return None
        return None if committed is None else int(committed)

    def raw_partitions(self) -> int:
        try:
            n = self.app.consumer.topic_partitions(self.names.raw)
        except Exception:  # no consumer (agent tests)
            n = None
        return int(n) if n else self.settings.partitions

    async def _send(
        self, topic: Any, key: bytes | None, value: bytes, partition: int | None
    ) -> None:
        await topic.send(key=key, value=value, partition=partition)

    async def _flush(self) -> None:
        await self.flush_changelog(wait=True)

    async def flush_changelog(self, *, wait: bool) -> None:
        if self.app.conf.store.scheme == "rocksdb":
            await self.changelog.flush(wait=wait)

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """Partitions move. Faust restores the tables it assigns next by replaying their
        changelogs onto the local stores, so every record of what was written locally
        must be in the changelog first: a write missing from it would be undone by the
        replay of older records of its key (the sequencer's next sequence number, say,
        while the pages released after it stay in flight: pages then share a number and
        one is lost). The app does not wait for its agents at a revoke
        (``stream_wait_empty`` is off), so this does: the steps under way finish, while
        this worker still has their partitions; no new one starts until the restore is
        done (``_state_step``); then the changelog is flushed, acknowledged, and the
        sequencer's in-memory state, rebuilt from its table later, is dropped."""
        self.ready = False
        self.revoked = True
        await self.gate.close()
        await self.flush_changelog(wait=True)
        self.stage.unload()
        self._forget_sequencer()

    def _forget_sequencer(self) -> None:
        """After a revoke or an assignment: the sequencer reads from the commits next."""
        self.seq_next, self.seq_start, self.holes = {}, {}, {}

    async def _on_assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.revoked = False
        self._forget_sequencer()
        faustfix.set_fetch_size(self.app, RESTORE_FETCH_BYTES)  # the restore comes next

    async def _on_rebalance_complete(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """The restore is done: the state steps may run again, unless this is the end of
        a restore that a newer rebalance overtook (Faust's recovery service says complete
        at the end of a restore whatever came since): partitions revoked since the last
        assignment, or an assignment whose restore has not begun. The gate stays closed
        until that one's restore is done too."""
        if self.revoked or faustfix.restoring_again(self.app):
            log.info("a restore ended behind a newer rebalance: the state steps wait for its")
            return
        faustfix.set_fetch_size(self.app, STREAM_FETCH_BYTES)
        self.stamped_at = -math.inf  # the restored tables are caught up: stamp them
        self.ready = True
        self.gate.open()

    def is_ready(self) -> bool:
        return self.ready and not self.app.rebalancing

    def main(self) -> None:
        """Run Faust's command line (``worker``)."""
        self.app.main()
