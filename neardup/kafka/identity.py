"""Whether the local tables belong to the brokers' topics, checked before Faust starts.

A state directory can outlive the topics its tables were restored from: a new broker
(``scripts/kafka-local.sh stop`` deletes the broker's data), the worker's topics deleted
and made again, another NEARDUP_APP_ID. Faust would then find a table that has applied
more of its changelog than the changelog holds, and stop on a ConsistencyError at every
start. The worker instead discards such tables and restores them from the changelogs it
finds, saying so in one line. That is always safe: the changelogs are the state every
worker shares, and the local tables only a copy of them; a discarded table costs a
restore, no page. Asking the operator to delete the directory would leave them a
decision with one right answer, and a worker that does not start until they do.

Two marks tell: the cluster id and app id the tables were built for, in a small JSON
file beside the state (aiokafka's Metadata requests do not carry topic ids, so a topic
made again under its old name is told by its offsets); and each table partition's own
persisted changelog offset (Faust's, ``undo.OFFSET_KEY``), which a changelog that still
holds the table's records ends after. What neither tells: a changelog deleted, made
again and written past the table's offset (by other workers) before this one starts,
on the same cluster; topic ids would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from neardup.kafka.security import aiokafka_kwargs
from neardup.kafka.undo import OFFSET_KEY
from neardup.settings import Settings

log = logging.getLogger("neardup.kafka")

#: Beside the state: the cluster and app id the local tables were built for.
MARKER = "neardup-state.identity.json"

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Brokers:
    """What the brokers say now: their cluster id, and where each changelog partition of
    the local tables ends (a partition absent: its topic does not exist, or is smaller)."""

    cluster_id: str
    ends: dict[TP, int]


def read_marker(state_dir: str) -> dict[str, str]:
    """The marker's fields; empty if there is none or it cannot be read (a state written
    before markers): the offsets still tell."""
    try:
        data = json.loads((Path(state_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def write_marker(state_dir: str, cluster_id: str, app_id: str) -> None:
    path = Path(state_dir) / MARKER
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cluster_id": cluster_id, "app_id": app_id}) + "\n")
    os.replace(tmp, path)


def persisted_offsets(tabledir: str, app_id: str) -> dict[TP, int]:
    """Each local table partition's changelog partition and the offset it has applied
    (read-only: nothing is replayed or written), for those that have one."""
    from rocksdict import AccessType, Options, Rdict

    out: dict[TP, int] = {}
    root = Path(tabledir)
    if not root.is_dir():
        return out
    for path in sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith(".db")):
        table, _, partition = path.name.removesuffix(".db").rpartition("-")
        # no CURRENT: a directory made for a restore that has not begun (freshness)
        if not table or not partition.isdigit() or not (path / "CURRENT").exists():
            continue
        try:
            db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
        except Exception as exc:  # rocksdict raises Exception itself; Faust meets it next
            log.warning("cannot read the changelog offset of %s: %s", path, exc)
            continue
        try:
            raw = db.get(OFFSET_KEY)
        finally:
            db.close()
        if raw is not None:
            out[(f"{app_id}-{table}-changelog", int(partition))] = int(raw)
    return out


async def read_brokers(settings: Settings, tps: list[TP], timeout_s: float = 60.0) -> Brokers:
    """The cluster id, and the end offsets of those of ``tps`` that exist."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
    from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

    kwargs = aiokafka_kwargs(settings)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.brokers, request_timeout_ms=int(timeout_s * 1000), **kwargs
    )
    await admin.start()
    try:
        cluster_id = str((await admin.describe_cluster())["cluster_id"])
        # only topics that exist: a Metadata request naming a missing topic has a broker
        # with auto.create.topics.enable make it, with its default partition count
        existing = set(await admin.list_topics())
        topics = sorted({t for t, _ in tps} & existing)
        described = await admin.describe_topics(topics) if topics else []
    finally:
        await admin.close()
    sizes = {d["topic"]: len(d["partitions"]) for d in described if not d.get("error_code")}
    present = [TopicPartition(t, p) for t, p in tps if p < sizes.get(t, 0)]
    ends: dict[TP, int] = {}
    if present:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.brokers,
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=int(timeout_s * 1000),
            **kwargs,
        )
        await consumer.start()
        try:
            got = await consumer.end_offsets(present)
        finally:
            await consumer.stop()
        ends = {(tp.topic, tp.partition): int(n) for tp, n in got.items()}
    return Brokers(cluster_id, ends)


def stale_reason(
    marker: dict[str, str], brokers: Brokers, app_id: str, persisted: dict[TP, int]
) -> str | None:
    """Why the local tables do not belong to the brokers' topics, or None if they may."""
    old_cluster = marker.get("cluster_id")
    if old_cluster and old_cluster != brokers.cluster_id:
        return f"were built on Kafka cluster {old_cluster}, and the brokers are cluster " + (
            brokers.cluster_id
        )
    old_app = marker.get("app_id")
    if old_app and old_app != app_id:
        return f"were built for NEARDUP_APP_ID={old_app}, and it is now {app_id}"
    for (topic, partition), offset in sorted(persisted.items()):
        end = brokers.ends.get((topic, partition))
        # a topic's end offset never goes back: one the table has applied past is another
        if end is None or offset >= end:
            where = "does not exist" if end is None else f"ends before offset {end}"
            return (
                f"were built from changelog topics that no longer exist (deleted and made "
                f"again?): {topic}[{partition}] {where}, and the local table has applied "
                f"it up to offset {offset}"
            )
    return None


def rebuild_if_stale(settings: Settings, tabledir: str) -> str | None:
    """Discard the local tables under ``tabledir`` if they do not belong to the brokers'
    topics (``stale_reason``), with one warning saying why; then mark the state directory
    with the brokers' cluster id. The reason, or None if the tables are kept. A broker
    that cannot be reached raises aiokafka's error, as ``create_topics`` would have."""
    persisted = persisted_offsets(tabledir, settings.app_id)
    brokers = asyncio.run(read_brokers(settings, sorted(persisted)))
    reason = stale_reason(read_marker(settings.state_dir), brokers, settings.app_id, persisted)
    if reason is not None and os.path.isdir(tabledir):
        log.warning(
            "the local tables in %s %s: discarding them; they are rebuilt from the changelog "
            "topics (NEARDUP_BROKERS=%s)",
            tabledir,
            reason,
            settings.brokers,
        )
        shutil.rmtree(tabledir)
    os.makedirs(settings.state_dir, exist_ok=True)
    write_marker(settings.state_dir, brokers.cluster_id, settings.app_id)
    return reason
