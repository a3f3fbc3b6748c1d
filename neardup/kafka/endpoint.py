"""The partitioned worker's ``/metrics`` and ``/readyz`` (``neardup.kafka.http`` serves
them): what the runtime and its tasks know, read when scraped.

Per kind of task (``analyse``, ``part``, ``order``): records read, dead letters by reason;
per watermark (``stage``: ``hosts``, ``buckets``, ``decide`` in front of a part task's
stages, ``order``): items held, how far it is behind the newest key held, how long the
next item has waited, and the items that came late (after a later key had gone on);
pages decided by kind; state deleted by retention; the keys of the tasks' stores. Counts
are this process's since it started, a replayed step counted again (Prometheus' ``rate``
takes a restart as a reset).
"""

from __future__ import annotations

import statistics

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from neardup.kafka.runtime import Runtime
from neardup.kafka.tasks import Tally
from neardup.kafka.taskview import pending_pages, watermarks
from neardup.kafka.topology import Topics

#: The decisions a page can get (``neardup.decide.Kind``).
KINDS = ("unique", "duplicate", "contained", "contains")
#: The watermarks that count late items: in front of each stage of a part task, and
#: of the order task.
LATE_STAGES = ("hosts", "buckets", "decide", "order")


class _Collector:
    def __init__(self, rt: Runtime, topics: Topics, tally: Tally | None) -> None:
        self.rt, self.topics, self.tally = rt, topics, tally

    def collect(self) -> list[Metric]:
        rt = self.rt
        tasks = GaugeMetricFamily("neardup_tasks_open", "Tasks this worker runs", labels=["kind"])
        kinds: dict[str, int] = {}
        for runner in rt.tasks.values():
            kinds[runner.task.group] = kinds.get(runner.task.group, 0) + 1
        for kind, n in sorted(kinds.items()):
            tasks.add_metric([kind], n)
        waiting = GaugeMetricFamily(
            "neardup_tasks_waiting", "Tasks dealt to this worker that are not open yet"
        )
        waiting.add_metric([], len(rt.waiting))
        records = CounterMetricFamily(
            "neardup_records_read", "Records the worker's tasks read (replays counted again)"
        )
        records.add_metric([], rt.records)
        published = CounterMetricFamily(
            "neardup_published",
            "Records committed to the output topics by this worker",
            labels=["topic"],
        )
        names = {
            self.topics.decisions: "decisions",
            self.topics.merges: "merges",
            self.topics.rejects: "rejects",
        }
        for topic, kind in names.items():
            published.add_metric([kind], rt.published.get(topic, 0))
        commits = GaugeMetricFamily(
            "neardup_commit_seconds",
            "Seconds a task's commit took, over the worker's last commits",
            labels=["quantile"],
        )
        times = sorted(rt.commit_seconds)
        if times:
            commits.add_metric(["0.5"], statistics.median(times))
            commits.add_metric(["0.99"], times[min(len(times) - 1, int(0.99 * len(times)))])
        return [tasks, waiting, records, published, commits, *self._stages()]

    def _stages(self) -> list[Metric]:
        rt = self.rt
        held = GaugeMetricFamily(
            "neardup_watermark_held", "Items held behind a watermark", labels=["kind", "stage"]
        )
        lag = GaugeMetricFamily(
            "neardup_watermark_lag_seconds",
            "How far a watermark is behind the newest key it holds, in seconds of fetch "
            "time (the largest over the worker's tasks)",
            labels=["kind", "stage"],
        )
        wait = GaugeMetricFamily(
            "neardup_watermark_wait_seconds",
            "Seconds the next item held has waited (the longest over the worker's tasks)",
            labels=["kind", "stage"],
        )
        totals: dict[tuple[str, str], list[float]] = {}
        for v in watermarks(rt.tasks):
            t = totals.setdefault((v.kind, v.stage), [0.0, 0.0, 0.0])
            t[0] += v.held
            t[1] = max(t[1], v.lag_s)
            t[2] = max(t[2], v.waiting_s)
        for labels, (n, behind, waited) in sorted(totals.items()):
            held.add_metric(list(labels), n)
            lag.add_metric(list(labels), behind)
            wait.add_metric(list(labels), waited)
        pending = GaugeMetricFamily(
            "neardup_decide_pending",
            "Pages past their watermark not decided yet: waiting for answers, records or a verdict",
        )
        pending.add_metric([], pending_pages(rt.tasks))
        keys = GaugeMetricFamily(
            "neardup_store_keys", "Keys in the tasks' stores (RocksDB's estimate)", labels=["kind"]
        )
        by_kind: dict[str, int] = {}
        for runner in rt.tasks.values():
            if runner.kv is not None:
                n = runner.kv.store.estimated_keys()
                by_kind[runner.task.group] = by_kind.get(runner.task.group, 0) + n
        for kind, n in sorted(by_kind.items()):
            keys.add_metric([kind], n)
        out: list[Metric] = [held, lag, wait, pending, keys]
        if self.tally is not None:
            out += self._tally(self.tally)
        return out

    @staticmethod
    def _tally(tally: Tally) -> list[Metric]:
        records = CounterMetricFamily(
            "neardup_stage_records", "Records the worker's tasks read", labels=["kind"]
        )
        for kind, n in sorted(tally.records.items()):
            records.add_metric([kind], n)
        decided = CounterMetricFamily(
            "neardup_pages_decided", "Pages decided, by decision", labels=["decision"]
        )
        for kind in KINDS:
            decided.add_metric([kind], tally.stages[("decide", kind)])
        dead = CounterMetricFamily(
            "neardup_dead_letters",
            "Records sent to the dead-letter topic: rejected pages by reason; records on "
            "internal topics no version reads (unreadable); pages given up because a "
            "record for them was (given_up)",
            labels=["kind", "reason"],
        )
        reasons = tally.dead.copy()
        reasons[("part", "given_up")] += tally.stages[("decide", "given_up")]
        for (kind, reason), n in sorted(reasons.items()):
            dead.add_metric([kind, reason], n)
        expired = CounterMetricFamily(
            "neardup_retention_expired",
            "State deleted under retention_days: buckets, page records",
            labels=["stage"],
        )
        for stage in ("buckets", "decide"):
            expired.add_metric([stage], tally.stages[(stage, "expired")])
        late = CounterMetricFamily(
            "neardup_late_items",
            "Items that reached a watermark after a later key had gone on (an upstream "
            "source broke its order): taken at once, outside the order guarantee",
            labels=["stage"],
        )
        for stage in LATE_STAGES:
            late.add_metric([stage], tally.stages[(stage, "late")])
        return [records, decided, dead, expired, late]


class Endpoint:
    """Metrics and readiness of one partitioned worker (``tally``: what its tasks counted,
    ``neardup.kafka.tasks.Context.tally``)."""

    def __init__(self, rt: Runtime, topics: Topics, tally: Tally | None = None) -> None:
        self.rt = rt
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(rt, topics, tally))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def ready(self) -> bool:
        """Joined the group with every task dealt to this worker open."""
        rt = self.rt
        return bool(rt.consumer.assignment()) and not rt.waiting and bool(rt.tasks)
