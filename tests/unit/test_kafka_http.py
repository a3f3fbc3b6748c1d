"""The worker's HTTP endpoint: three paths, GET and HEAD only."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from worker.kafka.http import make_app


def test_health_readiness_metrics_and_nothing_else() -> None:
    ready = {"now": False}

    async def go() -> None:
        app = make_app(lambda: b"neardup_pages_total 3.0\n", lambda: ready["now"])
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/healthz")).status == 200
            assert (await client.get("/readyz")).status == 503
            ready["now"] = True
            assert (await client.get("/readyz")).status == 200
            metrics = await client.get("/metrics")
            assert metrics.status == 200
            assert metrics.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "neardup_pages_total 3.0" in await metrics.text()
            assert (await client.head("/healthz")).status == 200
            for path in ("/", "/metrics/", "/debug", "/healthz/x"):
                assert (await client.get(path)).status == 404, path
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                resp = await client.request(method, "/healthz")
                assert resp.status == 405 and resp.headers["Allow"] == "GET"

    asyncio.run(go())
