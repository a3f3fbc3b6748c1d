"""Prometheus metrics of one worker, in a registry of its own (no process-wide state).

Counters are read from the stages' own counts (``Stats``, ``DecideCounts``) when scraped,
so nothing is counted twice; latencies are histograms observed by the agents.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from neardup.kafka import rocksmem

if TYPE_CHECKING:
    from neardup.kafka.app import Worker
    from neardup.kafka.stage import Emit

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _StageCollector:
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def _bounds(self) -> Iterator[Metric]:
        """What the state's bounds dropped: index entries and template hosts."""
        engine = self.m.worker.stage.engine
        capped = GaugeMetricFamily(
            "neardup_index_capped", "Index entries not written: bucket full", labels=["part"]
        )
        for part, n in engine.index.capped.items():
            capped.add_metric([part], n)
        yield capped
        dropped = CounterMetricFamily(
            "neardup_template_hosts_dropped",
            "Hosts whose template counts were dropped after template_idle_days without a page",
        )
        dropped.add_metric([], engine.templates.hosts_evicted)
        yield dropped

    def collect(self) -> Iterator[Metric]:
        w = self.m.worker
        a, e, c = w.analyse_stats, w.stage.engine.stats, w.stage.counts
        seq = w.stage.sequencer

        pages = CounterMetricFamily("neardup_pages", "Raw messages consumed by this worker")
        pages.add_metric([], a.pages)
        yield pages

        decisions = CounterMetricFamily(
            "neardup_decisions", "Pages decided by this worker, by decision", labels=["kind"]
        )
        for kind, n in sorted(c.decisions.items()):
            decisions.add_metric([kind], n)
        yield decisions

        rejects = CounterMetricFamily(
            "neardup_rejects", "Pages dead-lettered by this worker, by reason", labels=["reason"]
        )
        reasons = dict(a.rejects)
        if c.internal:
            reasons["internal"] = reasons.get("internal", 0) + c.internal
        for reason, n in sorted(reasons.items()):
            rejects.add_metric([reason], n)
        yield rejects

        seconds = CounterMetricFamily(
            "neardup_stage_seconds", "Time spent in each stage", labels=["stage"]
        )
        for stage, s in a.seconds.items():
            if stage in ("decode", "extract", "normalise", "fingerprint"):
                seconds.add_metric([stage], s)
        for stage, s in e.seconds.items():
            if stage in ("template", "index", "cluster"):
                seconds.add_metric([stage], s)
        yield seconds

        for name, doc, value in (
            ("neardup_repeated", "Pages answered with a stored decision", c.repeated),
            ("neardup_merges", "Cluster merges published", c.merges),
            ("neardup_redone", "Pages whose writes were completed from the journal", c.redone),
            ("neardup_late_pages", "Pages released out of order (late)", seq.late),
            (
                "neardup_partition_rereads",
                "Partitions read again from a message no agent took",
                w.rereads,
            ),
            (
                "neardup_absent_offset_runs",
                "Runs of offsets the broker said hold no message, committed past",
                w.absent_runs,
            ),
            (
                "neardup_sequencer_out_of_order",
                "Sequencer messages past a dropped one, left to be read again in order",
                w.out_of_order,
            ),
            ("neardup_raw_pauses", "Times this worker paused reading raw pages", w.pauses),
            (
                "neardup_standby_records",
                "Changelog records written to this worker's standby replicas in bulk",
                getattr(w.app, "neardup_standby_records", 0),
            ),
            (
                "neardup_restored_records",
                "Changelog records written in bulk while restoring this worker's tables",
                getattr(w.app, "neardup_restored_records", 0),
            ),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], value)
            yield counter

        for name, doc, value in (
            ("neardup_pending_pages", "Pages waiting in the sequencer", len(seq)),
            (
                "neardup_held_pages",
                "Pages received after a raw message their sender had not handled",
                sum(len(p.held) for p in seq.progress.values()),
            ),
            ("neardup_raw_paused", "1 while this worker holds raw pages back", int(w.paused)),
            ("neardup_sequencer_backlog", "Messages the sequencer has not committed", w.backlog),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
        flights = getattr(w.stage, "flights", None)
        if flights is not None:
            g = GaugeMetricFamily("neardup_pages_in_flight", "Pages released, not yet decided")
            g.add_metric([], len(flights))
            yield g
            probes = CounterMetricFamily("neardup_probes", "Probes answered by this worker")
            probes.add_metric([], w.probe_counts.probes)
            yield probes

        yield from self._bounds()

        keys, size = state_size(self.m.worker)
        if keys is not None:
            g = GaugeMetricFamily(
                "neardup_state_keys", "Keys in the local state and index tables (estimate)"
            )
            g.add_metric([], keys)
            yield g
        g = GaugeMetricFamily("neardup_state_bytes", "Bytes of local table state on disk")
        g.add_metric([], size)
        yield g
        yield from _rocksdb()

        lag = GaugeMetricFamily(
            "neardup_consumer_lag", "Raw messages not yet committed", labels=["partition"]
        )
        for partition, n in sorted(self.m.lag.items()):
            lag.add_metric([str(partition)], n)
        yield lag


def _rocksdb() -> Iterator[Metric]:
    """The tables' shared RocksDB memory (``neardup.kafka.rocksmem``), where it is bounded."""
    if (rocks := rocksmem.usage()) is None:
        return
    g = GaugeMetricFamily(
        "neardup_rocksdb_memory_bytes",
        "Bytes held by the tables' shared RocksDB block cache, memtables included",
    )
    g.add_metric([], rocks[0])
    yield g
    g = GaugeMetricFamily(
        "neardup_rocksdb_memory_limit_bytes", "Capacity of that cache (NEARDUP_ROCKSDB_MEMORY_MB)"
    )
    g.add_metric([], rocks[1])
    yield g


#: The worker's tables (attributes of ``Worker``; the routed ones only in that topology).
_TABLES = ("state_table", "buckets_table", "sketches_table")


def state_size(worker: Worker) -> tuple[int | None, int]:
    """Estimated keys of the local RocksDB databases of every table (None if one of
    them cannot say: a part of the count would pass for all of it), and their bytes."""
    tables = [getattr(worker, name, None) for name in _TABLES]
    dbs = [db for t in tables if t is not None for db in getattr(t.data, "_dbs", {}).values()]
    keys: int | None = 0
    try:
        keys = sum(int(db.property_int_value("rocksdb.estimate-num-keys") or 0) for db in dbs)
    except Exception:  # an older rocksdict, or a closed database
        keys = None
    size = 0
    tabledir = str(worker.app.conf.tabledir)
    for root, _, files in os.walk(tabledir):
        for f in files:
            # RocksDB may remove a file while we walk
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(root, f))
    return keys, size


class Metrics:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "neardup_stage_latency_seconds",
            "Per-page latency of the worker's stages",
            labelnames=["stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.end_to_end = Histogram(
            "neardup_end_to_end_seconds",
            "From the raw message's timestamp to its decision being published",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        #: Raw partition -> messages not yet committed (updated with the marks).
        self.lag: dict[int, int] = {}
        self.registry.register(_StageCollector(self))

    def observe_analyse(self, seconds: float) -> None:
        self.latency.labels("analyse").observe(seconds)

    def observe_decide(self, seconds: float) -> None:
        self.latency.labels("decide").observe(seconds)

    def observe_emits(self, emits: list[Emit]) -> None:
        """End-to-end latency of the decisions just published (the counts come from the
        stages)."""
        now = time.time()
        for emit in emits:
            if emit.topic == "decisions" and emit.since > 0:
                self.end_to_end.observe(max(0.0, now - emit.since))

    def render(self) -> bytes:
        return generate_latest(self.registry)
