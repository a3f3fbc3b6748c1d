"""The worker: creates its topics, then runs its share of the tasks of
``neardup.kafka.topology`` on the exactly-once runtime (``neardup.kafka.runtime``): one
aiokafka consumer, one transactional producer per task."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
from collections.abc import Callable

from neardup.kafka import runtime
from neardup.kafka.delivery import Config
from neardup.kafka.security import aiokafka_kwargs, check_transactions
from neardup.kafka.tasks import Context
from neardup.kafka.topics import delete_retention, ensure_topics
from neardup.kafka.topology import Topics, layout
from neardup.settings import Settings
from neardup.store import SharedMemory

log = logging.getLogger("neardup.kafka")


def run(settings: Settings, on_stop: Callable[[signal.Signals], None] | None = None) -> int:
    """Run the partitioned worker until SIGTERM or SIGINT (``on_stop`` is called at the
    first one)."""
    from neardup.sandbox import Sandbox

    topics = Topics.of(settings)
    counts = asyncio.run(ensure_topics(settings, topics))
    # a missing transactional ACL said in one line, not a failure of every task forever
    asyncio.run(check_transactions(settings, settings.app_id, topics.order))
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
        raw_skew=settings.raw_skew_ms / 1000,
        sandbox=sandbox,
        counts=counts,
    )
    rcfg = Config(
        bootstrap=settings.brokers,
        app=settings.app_id,
        topics=topics.inputs(),
        state_dir=settings.state_dir,
        session_timeout_ms=settings.session_timeout_ms,
        group_instance_id=settings.group_instance_id,
        client=aiokafka_kwargs(settings),
        delete_retention_ms=asyncio.run(delete_retention(settings, topics)),
        memory=SharedMemory(settings.cache_mb),
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
    from neardup.kafka.taskview import log_tasks

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
    # each task's watermarks in the log: what an operator asks of a stalled partition
    loop.add_signal_handler(signal.SIGUSR1, log_tasks, rt)
    endpoint = Endpoint(rt, topics, ctx.tally)
    web = await serve(settings.http_host, settings.http_port, endpoint.render, endpoint.ready)
    await rt.start()
    try:
        await rt.run()
    finally:
        await rt.close()
        await web.cleanup()
