"""The worker's HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz`` (docs/kafka.md,
Health and metrics), nothing else: any other path is 404, any other method 405. Paths are
compared exactly, after percent-decoding (``/metrics/`` and ``/healthz/../metrics`` are
404); there are no files to serve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class _QuietBadRequests(logging.Filter):
    """aiohttp logs most malformed requests as an ERROR with a traceback; anyone who can reach
    the port could fill the log with them. They are refused (400) all the same: keep one
    DEBUG line each, or nothing when DEBUG is off."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        if not log.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "refused a malformed request: %d %.200s", (exc.code, exc.message)
        record.exc_info, record.exc_text = None, None
        return True


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
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietBadRequests) for f in server_log.filters):
        server_log.addFilter(_QuietBadRequests())
    runner = web.AppRunner(make_app(render_metrics, is_ready), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving /metrics, /healthz and /readyz on %s:%s", host, port)
    return runner
