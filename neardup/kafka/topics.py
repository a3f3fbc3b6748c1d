"""Creating the worker's topics (``neardup.kafka.topology``) that are missing, and
refusing to start on internal topics whose partition counts its state does not fit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from neardup.contract import max_line_bytes
from neardup.kafka.security import aiokafka_kwargs
from neardup.kafka.topology import Topics
from neardup.settings import Settings

log = logging.getLogger(__name__)

#: Room for a record's own fields around the longest raw line.
RAW_RECORD_SLACK = 64 * 1024
#: Internal records carry a page's analysis (fingerprints, and the text of a short page).
INTERNAL_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


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


def _configs(name: str, topics: Topics, settings: Settings) -> dict[str, str]:
    """Topic configs the worker sets on a topic it creates: internal topics take its
    largest records, and the changelogs are compacted; the raw topic takes the longest
    line the worker parses (a 5 MiB body may arrive base64-encoded inside JSON), where
    Kafka's 1 MiB default would refuse ordinary large pages at the producer."""
    if name == topics.raw:
        return {
            "max.message.bytes": str(max_line_bytes(settings.engine.max_bytes) + RAW_RECORD_SLACK)
        }
    if name in (topics.decisions, topics.merges, topics.rejects):
        return {}
    configs = {"max.message.bytes": str(INTERNAL_MAX_MESSAGE_BYTES)}
    if name in (topics.analyse_changelog, topics.part_changelog, topics.order_changelog):
        configs["cleanup.policy"] = "compact"
    return configs


async def ensure_topics(
    settings: Settings, topics: Topics | None = None, timeout_s: float = 60.0
) -> dict[str, int]:
    """Create the missing topics; returns every topic's partition count (an output topic
    made before, by hand or by a broker that creates topics on first use, keeps its own).
    A topic whose partition count the state depends on and that has another count ends
    the worker with a message saying what to do."""
    from aiokafka.admin import NewTopic

    topics = Topics.of(settings) if topics is None else topics
    async with admin_client(settings, timeout_s) as admin:
        existing = set(await admin.list_topics())
        # only if it exists: a broker that creates topics on first use would make it now,
        # with its own partition count
        have = await partition_counts(admin, [topics.raw], 0) if topics.raw in existing else {}
        wanted = topics.partitions(settings.partitions, have.get(topics.raw, settings.partitions))
        missing = [
            NewTopic(name, n, settings.replication, topic_configs=_configs(name, topics, settings))
            for name, n in wanted.items()
            if name not in existing
        ]
        if missing:
            response = await admin.create_topics(missing)
            refuse_refused_topics(response.topic_errors)
            log.info("created topics %s", ", ".join(t.name for t in missing))
        counts = await partition_counts(admin, list(wanted), timeout_s)
    refuse_wrong_counts({t: wanted[t] for t in topics.fixed()}, counts)
    return counts


#: CreateTopics error codes: made by another worker meanwhile (no refusal); not allowed.
_EXISTS, _DENIED = 36, (29, 31)


def refuse_refused_topics(errors: list[tuple[Any, ...]]) -> None:
    """End the worker in one line if the brokers refused to create a topic (CreateTopics
    answers each topic with an error code, raising nothing): without it the worker would
    wait for topics that never come, then blame their partition counts."""
    from aiokafka.errors import for_code  # type: ignore[import-untyped]

    refused, denied = [], False
    for topic, code, *message in errors:
        if code not in (0, _EXISTS):
            denied |= code in _DENIED
            why = (message[0] if message else "") or for_code(code).__name__
            refused.append(f"{topic} ({why})")
    if refused:
        raise SystemExit(
            "neardup worker: the brokers refused to create the topics " + ", ".join(refused)
            + (". Grant the worker's user Create on them (docs/kafka.md, Security), or create "
               "them beforehand" if denied else "")
        )  # fmt: skip


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
    deadline = time.monotonic() + timeout_s
    while True:
        described = await admin.describe_topics(topics)
        ok = [d for d in described if not d.get("error_code") and d.get("partitions")]
        have = {d["topic"]: len(d["partitions"]) for d in ok}
        if all(t in have for t in topics) or time.monotonic() >= deadline:
            return have
        await asyncio.sleep(0.2)


#: Kafka's default ``delete.retention.ms``, which the worker leaves on the changelogs it
#: makes: taken for a changelog the brokers do not describe to the worker.
DEFAULT_DELETE_RETENTION_MS = 86_400_000


async def delete_retention(
    settings: Settings, topics: Topics, timeout_s: float = 60.0
) -> dict[str, int]:
    """Each changelog's ``delete.retention.ms``: how long compaction keeps its tombstones,
    and so how long a task's store may be away before it can miss a deletion
    (``neardup.kafka.taskstate.open_store``). Read with DescribeConfigs; a user without
    that ACL gets Kafka's default, with one line saying so."""
    from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
        ConfigResource,
        ConfigResourceType,
    )
    from aiokafka.errors import KafkaError

    names = [topics.analyse_changelog, topics.part_changelog, topics.order_changelog]
    found: dict[str, int] = {}
    try:
        async with admin_client(settings, timeout_s) as admin:
            wanted = {"delete.retention.ms": None}
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, n, wanted) for n in names]
            )
        for response in responses:
            for code, _, _, name, entries, *_rest in response.resources:
                for key, value, *_ in entries if not code else ():
                    if key == "delete.retention.ms" and value is not None:
                        found[name] = int(value)
    except KafkaError as exc:
        log.info("cannot describe the changelogs' configs: %r", exc)
    if missing := [n for n in names if n not in found]:
        log.warning(
            "delete.retention.ms of %s not described to the worker (it needs DescribeConfigs "
            "on them): taking Kafka's default, %d ms",
            ", ".join(missing),
            DEFAULT_DELETE_RETENTION_MS,
        )
    return {n: found.get(n, DEFAULT_DELETE_RETENTION_MS) for n in names}
