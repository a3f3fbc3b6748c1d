"""The partitioned worker's ``/metrics`` and ``/readyz`` (``neardup.kafka.http`` serves
them): what the runtime and its tasks know, read when scraped (docs/kafka.md, Health and
metrics, lists them)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

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

G, C = GaugeMetricFamily, CounterMetricFamily
#: Every metric, in the order served: its kind, help and labels.
METRICS: dict[str, tuple[type[GaugeMetricFamily | CounterMetricFamily], str, tuple[str, ...]]] = {
    "neardup_tasks_open": (G, "Tasks this worker runs", ("kind",)),
    "neardup_tasks_waiting": (G, "Tasks dealt to this worker that are not open yet", ()),
    "neardup_records_read": (C, "Records the worker's tasks read (replays counted again)", ()),
    "neardup_published": (C, "Records committed to the output topics by this worker", ("topic",)),
    "neardup_commit_seconds": (
        G,
        "Seconds a task's commit took, over the worker's last commits",
        ("quantile",),
    ),
    "neardup_watermark_held": (G, "Items held behind a watermark", ("kind", "stage")),
    "neardup_watermark_lag_seconds": (
        G,
        "How far a watermark is behind the newest key it holds, in seconds of fetch time "
        "(the largest over the worker's tasks)",
        ("kind", "stage"),
    ),
    "neardup_watermark_wait_seconds": (
        G,
        "Seconds the next item held has waited (the longest over the worker's tasks)",
        ("kind", "stage"),
    ),
    "neardup_decide_pending": (
        G,
        "Pages past their watermark not decided yet: waiting for answers, records or a verdict",
        (),
    ),
    "neardup_store_keys": (G, "Keys in the tasks' stores (RocksDB's estimate)", ("kind",)),
    # from the tasks' tally
    "neardup_stage_records": (C, "Records the worker's tasks read", ("kind",)),
    "neardup_pages_decided": (C, "Pages decided, by decision", ("decision",)),
    "neardup_dead_letters": (
        C,
        "Records sent to the dead-letter topic: rejected pages by reason; records on internal "
        "topics no version reads (unreadable); pages given up because a record for them was "
        "(given_up)",
        ("kind", "reason"),
    ),
    "neardup_retention_expired": (
        C,
        "State deleted under retention_days: buckets, page records",
        ("stage",),
    ),
    "neardup_late_items": (
        C,
        "Items that reached a watermark after a later key had gone on (an upstream source "
        "broke its order): taken at once, outside the order guarantee",
        ("stage",),
    ),
}

Rows = Iterable[tuple[Sequence[str], float]]


class _Collector:
    def __init__(self, rt: Runtime, topics: Topics, tally: Tally | None) -> None:
        self.rt, self.topics, self.tally = rt, topics, tally

    def collect(self) -> list[Metric]:
        rows = self._rows()
        if self.tally is not None:
            rows.update(self._tally(self.tally))
        out: list[Metric] = []
        for name, (kind, doc, labels) in METRICS.items():
            if name in rows:
                family = kind(name, doc, labels=labels)
                for values, n in rows[name]:
                    family.add_metric(list(values), n)
                out.append(family)
        return out

    def _rows(self) -> dict[str, Rows]:
        rt, t = self.rt, self.topics
        kinds = Counter(runner.task.group for runner in rt.tasks.values())
        keys: Counter[str] = Counter()
        for runner in rt.tasks.values():
            if runner.kv is not None:
                keys[runner.task.group] += runner.kv.store.estimated_keys()
        times = sorted(rt.commit_seconds)
        quantiles = []
        if times:
            p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            quantiles = [(["0.5"], statistics.median(times)), (["0.99"], p99)]
        outputs = {t.decisions: "decisions", t.merges: "merges", t.rejects: "rejects"}
        totals: dict[tuple[str, str], list[float]] = {}
        for v in watermarks(rt.tasks):
            w = totals.setdefault((v.kind, v.stage), [0.0, 0.0, 0.0])
            w[0] += v.held
            w[1] = max(w[1], v.lag_s)
            w[2] = max(w[2], v.waiting_s)
        marks = sorted(totals.items())
        return {
            "neardup_tasks_open": [([k], n) for k, n in sorted(kinds.items())],
            "neardup_tasks_waiting": [([], len(rt.waiting))],
            "neardup_records_read": [([], rt.records)],
            "neardup_published": [([k], rt.published.get(o, 0)) for o, k in outputs.items()],
            "neardup_commit_seconds": quantiles,
            "neardup_watermark_held": [(k, n) for k, (n, _, _) in marks],
            "neardup_watermark_lag_seconds": [(k, lag) for k, (_, lag, _) in marks],
            "neardup_watermark_wait_seconds": [(k, wait) for k, (_, _, wait) in marks],
            "neardup_decide_pending": [([], pending_pages(rt.tasks))],
            "neardup_store_keys": [([k], n) for k, n in sorted(keys.items())],
        }

    @staticmethod
    def _tally(tally: Tally) -> dict[str, Rows]:
        stages = tally.stages
        reasons = tally.dead.copy()
        reasons[("part", "given_up")] += stages[("decide", "given_up")]
        return {
            "neardup_stage_records": [([k], n) for k, n in sorted(tally.records.items())],
            "neardup_pages_decided": [([k], stages[("decide", k)]) for k in KINDS],
            "neardup_dead_letters": sorted(reasons.items()),
            "neardup_retention_expired": [
                ([s], stages[(s, "expired")]) for s in ("buckets", "decide")
            ],
            "neardup_late_items": [([s], stages[(s, "late")]) for s in LATE_STAGES],
        }


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
