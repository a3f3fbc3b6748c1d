"""Names of the worker's topics, and creating the ones that are missing before Faust starts.

Faust creates its internal topics (table changelogs) itself, but subscribes to the raw
topic as it finds it: created later, with the broker's default partition count, it would
not be consumed until the next rebalance. So the worker creates its topics first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from neardup.contract import max_line_bytes
from neardup.kafka.freshness import TOMBSTONE_RETENTION_MS
from neardup.kafka.security import aiokafka_kwargs
from neardup.settings import Settings

log = logging.getLogger(__name__)

#: The Faust table of the sequencer and the engine: pending pages, partition progress,
#: template counts, clusters (and, unless routed, the index).
STATE_TABLE = "state"
#: The routed topology's tables: index buckets by bucket key, sketches by page.
BUCKETS_TABLE = "buckets"
SKETCHES_TABLE = "sketches"
#: A page's journalled writes are one changelog message: allow large ones.
STATE_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Kafka's error code for a topic that does not exist.
UNKNOWN_TOPIC = 3
#: Room for a record's own fields around the longest raw line.
RAW_RECORD_SLACK = 64 * 1024


@dataclass(frozen=True, slots=True)
class TopicNames:
    raw: str
    decisions: str
    merges: str
    rejects: str
    #: The sequencer's input: one partition, so that it sees one stream.
    sequence: str
    #: The routed topology's probes (by bucket key) and records (by page) partitions.
    probes: str
    records: str

    @classmethod
    def of(cls, settings: Settings) -> TopicNames:
        return cls(
            raw=settings.topic_raw,
            decisions=settings.topic_decisions,
            merges=settings.topic_merges,
            rejects=settings.topic_rejects,
            sequence=f"{settings.app_id}-sequencer",
            probes=f"{settings.app_id}-probes",
            records=f"{settings.app_id}-records",
        )

    def partitions(self, settings: Settings) -> dict[str, int]:
        """Partitions of each topic the worker creates when it is missing."""
        n = settings.partitions
        out = {
            self.raw: n,
            self.decisions: n,
            self.merges: n,
            self.rejects: n,
            self.sequence: 1,
        }
        if settings.topology == "routed":
            out.update({self.probes: n, self.records: n})
        return out

    def changelogs(self, settings: Settings) -> list[str]:
        """The changelog topics of the worker's tables (Faust names them so)."""
        tables = [STATE_TABLE]
        if settings.topology == "routed":
            tables += [BUCKETS_TABLE, SKETCHES_TABLE]
        return [f"{settings.app_id}-{table}-changelog" for table in tables]

    def fixed(self, settings: Settings) -> dict[str, int]:
        """Topics whose partition count the worker's state depends on: the sequencer has
        one, and a bucket or a sketch lives in the partition its key hashes to."""
        parts = self.partitions(settings)
        return {t: parts[t] for t in (self.sequence, self.probes, self.records) if t in parts}


def _configs(
    name: str, names: TopicNames, fixed: dict[str, int], settings: Settings
) -> dict[str, str]:
    """Topic configs the worker sets on a topic it creates: internal topics take its
    largest messages; the raw topic takes the longest line the worker parses (a 5 MiB body
    may arrive base64-encoded inside JSON), where Kafka's 1 MiB default would refuse
    ordinary large pages at the producer."""
    if name in fixed:
        return {"max.message.bytes": str(STATE_MAX_MESSAGE_BYTES)}
    if name == names.raw:
        limit = max_line_bytes(settings.engine.max_bytes) + RAW_RECORD_SLACK
        return {"max.message.bytes": str(limit)}
    return {}


@contextlib.asynccontextmanager
async def admin_client(settings: Settings, timeout_s: float) -> AsyncIterator[Any]:
    """An aiokafka admin client on the worker's brokers, with its security settings."""
    from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.brokers,
        request_timeout_ms=int(timeout_s * 1000),
        **aiokafka_kwargs(settings),
    )
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def ensure_topics(settings: Settings, timeout_s: float = 60.0) -> list[str]:
    """Create the worker's topics that do not exist yet; returns the ones created."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped]

    names = TopicNames.of(settings)
    wanted = names.partitions(settings)
    fixed = names.fixed(settings)
    async with admin_client(settings, timeout_s) as admin:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(
                name,
                n,
                settings.replication,
                topic_configs=_configs(name, names, fixed, settings),
            )
            for name, n in wanted.items()
            if name not in existing
        ]
        if missing:
            # another worker may have created them in the meantime
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
            log.info("created topics %s", ", ".join(t.name for t in missing))
        refuse_wrong_counts(fixed, await partition_counts(admin, list(fixed), timeout_s))
        return [t.name for t in missing]


def refuse_wrong_counts(fixed: dict[str, int], have: dict[str, int]) -> None:
    """End the worker, saying what to do, if a topic whose partition count the state
    depends on has another count."""
    wrong = {t: (have.get(t), n) for t, n in fixed.items() if have.get(t) != n}
    if wrong:
        raise SystemExit(
            "neardup worker: these topics have the wrong number of partitions "
            + ", ".join(f"{t} ({got}, not {want})" for t, (got, want) in wrong.items())
            + ". The state depends on it: use the NEARDUP_PARTITIONS the state was built "
            "with, or a new NEARDUP_APP_ID (and a new state)."
        )


async def partition_counts(admin: Any, topics: list[str], timeout_s: float) -> dict[str, int]:
    """The partition count of each of ``topics``. A topic created a moment ago may not be
    described yet (an error code, no partitions): it is waited for, up to ``timeout_s``,
    rather than taken for the wrong size."""
    have = await _partition_counts(admin, topics)
    deadline = time.monotonic() + timeout_s
    while any(t not in have for t in topics) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        have = await _partition_counts(admin, topics)
    return have


async def tombstone_retention_ms(settings: Settings, timeout_s: float = 60.0) -> int:
    """How long the changelog topics keep deletions: the shortest ``delete.retention.ms``
    among them, the broker's default where a topic sets none, and the worker's own
    (``neardup.kafka.app.CHANGELOG_CONFIGS``) for those Faust has not created yet."""
    from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
        ConfigResource,
        ConfigResourceType,
    )

    names = TopicNames.of(settings).changelogs(settings)
    wanted = {"delete.retention.ms": None}
    async with admin_client(settings, timeout_s) as admin:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, wanted) for name in names]
        )
    return retention_of([resource for response in responses for resource in response.resources])


def retention_of(resources: list[tuple[Any, ...]]) -> int:
    """The shortest ``delete.retention.ms`` in DescribeConfigs resources (error code,
    message, type, name, entries of name, value, ...); a topic that does not exist yet
    counts as the worker will create it, and one that cannot be described (no
    DescribeConfigs permission) as created so, with a warning."""
    values = []
    for error_code, message, _, name, entries in resources:
        if error_code:
            if error_code != UNKNOWN_TOPIC:
                log.warning(
                    "cannot read delete.retention.ms of %s (error %s %s): taking it as %d ms",
                    name,
                    error_code,
                    message or "",
                    TOMBSTONE_RETENTION_MS,
                )
            values.append(TOMBSTONE_RETENTION_MS)
        values += [int(e[1]) for e in entries if e[0] == "delete.retention.ms" and e[1]]
    return min(values, default=TOMBSTONE_RETENTION_MS)


async def _partition_counts(admin: Any, topics: list[str]) -> dict[str, int]:
    described = await admin.describe_topics(topics)
    return {
        d["topic"]: len(d["partitions"])
        for d in described
        if not d.get("error_code") and d.get("partitions")
    }


def ensure_topics_sync(settings: Settings) -> list[str]:
    return asyncio.run(ensure_topics(settings))
