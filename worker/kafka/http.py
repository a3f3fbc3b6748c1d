"""The worker's HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``, nothing else.

* ``/healthz`` (liveness): 200 while the event loop answers.
* ``/readyz`` (readiness): 200 once the worker has joined its group and recovered its
  tables, 503 while it rebalances or recovers.
* ``/metrics``: Prometheus text format.

Any other path is 404, any other method 405 (``HEAD`` is answered like ``GET``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def make_app(render_metrics: Callable[[], bytes], is_ready: Callable[[], bool]) -> web.Application:
    """The aiohttp application of the endpoint."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if is_ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=render_metrics(), headers={"Content-Type": CONTENT_TYPE_METRICS})

    routes = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}

    async def dispatch(request: web.Request) -> web.StreamResponse:
        handler = routes.get(request.path)
        if handler is None:
            return web.Response(status=404, text="not found\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="method not allowed\n", headers={"Allow": "GET"})
        return await handler(request)

    app = web.Application()
    # one catch-all route, so that the answers for unknown paths and methods are ours
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


async def serve(
    host: str, port: int, render_metrics: Callable[[], bytes], is_ready: Callable[[], bool]
) -> web.AppRunner:
    """Start the endpoint; returns the runner (``await runner.cleanup()`` stops it)."""
    runner = web.AppRunner(make_app(render_metrics, is_ready), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving /metrics, /healthz and /readyz on %s:%s", host, port)
    return runner
