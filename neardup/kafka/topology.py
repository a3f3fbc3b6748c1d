"""The partitioned topology in one place: every topic, its key and partition count, which
task reads it and which writes it.

```
raw (R, any key) --analyse-j--> <app>-hosts (N, by host)
<app>-hosts  --part-i: hosts-->   <app>-probes (N, by bucket), <app>-pages (N, by page)
<app>-probes --part-i: buckets--> <app>-pages (answers)
<app>-pages  --part-i: decide-->  decisions, cluster-merges (by page id / cluster id),
                                  <app>-order (1: edges and marks)
<app>-order  --order-->           <app>-pages (verdicts)
```

One ``analyse-j`` task per raw partition, one ``part-i`` per internal partition (its
hosts, buckets and decide stages over one store), one ``order`` task: docs/kafka.md,
Topology, says what each holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition  # type: ignore[import-untyped]

from neardup.flow.messages import HOSTS, ORDER, PAGES, PROBES
from neardup.kafka.assignor import Layout, Task
from neardup.settings import Settings

#: Task groups: the assignor balances each group on its own.
ANALYSE, PART, ORDER_TASK = "analyse", "part", "order"


@dataclass(frozen=True, slots=True)
class Topics:
    raw: str
    decisions: str
    merges: str
    rejects: str
    hosts: str
    probes: str
    pages: str
    order: str
    analyse_changelog: str
    part_changelog: str
    order_changelog: str

    @classmethod
    def of(cls, settings: Settings) -> Topics:
        app = settings.app_id
        return cls(
            raw=settings.topic_raw,
            decisions=settings.topic_decisions,
            merges=settings.topic_merges,
            rejects=settings.topic_rejects,
            hosts=f"{app}-hosts",
            probes=f"{app}-probes",
            pages=f"{app}-pages",
            order=f"{app}-order",
            analyse_changelog=f"{app}-analyse-changelog",
            part_changelog=f"{app}-part-changelog",
            order_changelog=f"{app}-order-changelog",
        )

    def by_role(self) -> dict[str, str]:
        """The real topic of each logical topic the stages write (``neardup.flow``)."""
        return {
            HOSTS: self.hosts,
            PROBES: self.probes,
            PAGES: self.pages,
            ORDER: self.order,
            "decisions": self.decisions,
            "merges": self.merges,
            "rejects": self.rejects,
        }

    def inputs(self) -> tuple[str, ...]:
        """The topics the worker's consumer subscribes to."""
        return (self.raw, self.hosts, self.probes, self.pages, self.order)

    def partitions(self, n: int, raw: int) -> dict[str, int]:
        """Partitions of each topic: ``n`` for the internal ones, ``raw`` for the raw topic's
        analyse changelog, one for the order step's."""
        return {
            self.raw: raw,
            self.decisions: n,
            self.merges: n,
            self.rejects: n,
            self.hosts: n,
            self.probes: n,
            self.pages: n,
            self.order: 1,
            self.analyse_changelog: raw,
            self.part_changelog: n,
            self.order_changelog: 1,
        }

    def fixed(self) -> tuple[str, ...]:
        """Topics whose partition count the state depends on (a host, a bucket, a page
        lives in the partition its key hashes to; the order step has one)."""
        return (self.hosts, self.probes, self.pages, self.order, self.part_changelog)


def layout(topics: Topics) -> Layout:
    """The tasks, given the partition counts of the subscribed topics."""

    def tasks(counts: Mapping[str, int]) -> Sequence[Task]:
        out: list[Task] = []
        for j in range(counts.get(topics.raw, 0)):
            out.append(
                Task(
                    f"analyse-{j}",
                    (TopicPartition(topics.raw, j),),
                    TopicPartition(topics.analyse_changelog, j),
                    ANALYSE,
                )
            )
        n = counts.get(topics.pages, 0)
        for i in range(n):
            inputs = (
                TopicPartition(topics.hosts, i),
                TopicPartition(topics.probes, i),
                TopicPartition(topics.pages, i),
            )
            out.append(Task(f"part-{i}", inputs, TopicPartition(topics.part_changelog, i), PART))
        if counts.get(topics.order):
            order_in = (TopicPartition(topics.order, 0),)
            changelog = TopicPartition(topics.order_changelog, 0)
            out.append(Task(ORDER_TASK, order_in, changelog, ORDER_TASK))
        return out

    return tasks
