"""The partitioned worker (``NEARDUP_TOPOLOGY=partitioned``): creates its topics, then runs
its share of the tasks of ``neardup.kafka.topology`` on the exactly-once runtime
(``neardup.kafka.runtime``). No Faust: one aiokafka consumer, one transactional producer
per task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Callable

from neardup.contract import max_line_bytes
from neardup.kafka import runtime
from neardup.kafka.delivery import Config
from neardup.kafka.security import aiokafka_kwargs
from neardup.kafka.tasks import Context
from neardup.kafka.topics import (
    RAW_RECORD_SLACK,
    admin_client,
    partition_counts,
    refuse_wrong_counts,
)
from neardup.kafka.topology import Topics, layout
from neardup.settings import Settings

log = logging.getLogger("neardup.kafka")

#: Internal records carry a page's analysis (fingerprints, and the text of a short page).
INTERNAL_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


async def ensure_topics(
    settings: Settings, topics: Topics, timeout_s: float = 60.0
) -> dict[str, int]:
    """Create the missing topics; returns every topic's partition count (an output topic
    made before, by hand or by a broker that creates topics on first use, keeps its own).
    A topic whose partition count the state depends on and that has another count ends
    the worker with a message saying what to do."""
    from aiokafka.admin import NewTopic  # type: ignore[import-untyped]
    from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped]

    async with admin_client(settings, timeout_s) as admin:
        have = await partition_counts(admin, [topics.raw], 0)
        raw = have.get(topics.raw, settings.partitions)
        wanted = topics.partitions(settings.partitions, raw)
        existing = set(await admin.list_topics())
        compacted = {topics.analyse_changelog, topics.part_changelog, topics.order_changelog}
        missing = []
        for name, n in wanted.items():
            if name in existing:
                continue
            configs = {"max.message.bytes": str(INTERNAL_MAX_MESSAGE_BYTES)}
            if name in compacted:
                configs["cleanup.policy"] = "compact"
            elif name == topics.raw:
                limit = max_line_bytes(settings.engine.max_bytes) + RAW_RECORD_SLACK
                configs = {"max.message.bytes": str(limit)}
            elif name in (topics.decisions, topics.merges, topics.rejects):
                configs = {}
            missing.append(NewTopic(name, n, settings.replication, topic_configs=configs))
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
            log.info("created topics %s", ", ".join(t.name for t in missing))
        counts = await partition_counts(admin, list(wanted), timeout_s)
    refuse_wrong_counts({t: wanted[t] for t in topics.fixed()}, counts)
    return counts


def run(settings: Settings, on_stop: Callable[[signal.Signals], None] | None = None) -> int:
    """Run the partitioned worker until SIGTERM or SIGINT (``on_stop`` is called at the
    first one)."""
    from neardup.sandbox import Sandbox

    topics = Topics.of(settings)
    counts = asyncio.run(ensure_topics(settings, topics))
    raw = counts[topics.raw]
    cfg = settings.engine_config()
    sandbox = Sandbox(cfg) if cfg.extract_timeout_s > 0 else None
    wait = settings.order_wait_ms / 1000 or math.inf
    ctx = Context(
        cfg,
        topics,
        settings.partitions,
        raw,
        order_wait=wait,
        mark_interval=settings.mark_interval_ms / 1000,
        sandbox=sandbox,
        counts=counts,
    )
    rcfg = Config(
        bootstrap=settings.brokers,
        app=settings.app_id,
        topics=topics.inputs(),
        state_dir=settings.state_dir,
        session_timeout_ms=settings.session_timeout_ms,
        client=aiokafka_kwargs(settings),
    )
    log.info(
        "partitioned worker: %d raw partitions, %d internal partitions, app %s",
        raw,
        settings.partitions,
        settings.app_id,
    )
    try:
        asyncio.run(_serve_and_run(settings, topics, rcfg, ctx, on_stop))
    finally:
        if sandbox is not None:
            sandbox.close()
    return 0


async def _serve_and_run(
    settings: Settings,
    topics: Topics,
    rcfg: Config,
    ctx: Context,
    on_stop: Callable[[signal.Signals], None] | None,
) -> None:
    """The runtime until SIGTERM or SIGINT, with the HTTP endpoint beside it."""
    from neardup.kafka.endpoint import Endpoint
    from neardup.kafka.http import serve

    rt = runtime.Runtime(rcfg, layout(topics), ctx.step)
    loop = asyncio.get_running_loop()
    stopping: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        if not stopping and on_stop is not None:
            on_stop(sig)
        stopping.append(sig)
        rt.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    endpoint = Endpoint(rt, topics)
    web = await serve(settings.http_host, settings.http_port, endpoint.render, endpoint.ready)
    await rt.start()
    try:
        await rt.run()
    finally:
        await rt.close()
        await web.cleanup()
