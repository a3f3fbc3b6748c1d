"""The partitioned worker's ``/metrics`` and ``/readyz`` (``neardup.kafka.http`` serves
them): what the runtime knows, read when scraped."""

from __future__ import annotations

import statistics

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from neardup.kafka.runtime import Runtime
from neardup.kafka.topology import Topics


class _Collector:
    def __init__(self, rt: Runtime, topics: Topics) -> None:
        self.rt, self.topics = rt, topics

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
        return [tasks, waiting, records, published, commits]


class Endpoint:
    """Metrics and readiness of one partitioned worker."""

    def __init__(self, rt: Runtime, topics: Topics) -> None:
        self.rt = rt
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(rt, topics))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def ready(self) -> bool:
        """Joined the group with every task dealt to this worker open."""
        rt = self.rt
        return bool(rt.consumer.assignment()) and not rt.waiting and bool(rt.tasks)
