"""The worker's HTTP endpoint: three paths, GET and HEAD only."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from neardup.kafka.http import make_app, serve


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


async def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as bytes; the status and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _get(target: bytes, method: bytes = b"GET", headers: bytes = b"") -> bytes:
    return (
        method
        + b" "
        + target
        + b" HTTP/1.1\r\nHost: x\r\n"
        + headers
        + b"Connection: close\r\n\r\n"
    )


def test_binds_the_configured_address_only_and_refuses_odd_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bound to 127.0.0.1 and nothing else; the query string selects nothing; traversal,
    case, doubled slashes, absolute URLs to other paths and other methods get nothing but
    404/405; oversized or malformed requests get 400 without an ERROR in the log; the
    endpoint answers normally afterwards."""

    async def go() -> None:
        runner = await serve("127.0.0.1", 0, lambda: b"neardup_pages_total 3.0\n", lambda: True)
        try:
            (address,) = runner.addresses  # one socket, on the configured host
            assert address[0] == "127.0.0.1"
            port = address[1]
            status, body = await _raw(port, _get(b"/metrics?name[]=x&debug=1"))
            assert (status, body) == (200, b"neardup_pages_total 3.0\n")
            assert await _raw(port, _get(b"/healthz?x=/metrics")) == (200, b"ok\n")
            for target in (
                b"/../metrics",
                b"/healthz/../metrics",
                b"/%2e%2e/%2e%2e/etc/passwd",
                b"/..%2f..%2fetc%2fpasswd",
                b"/metrics%00",
                b"/metrics%2f",
                b"//metrics",
                b"/METRICS",
                b"/static/x",
                b"http://elsewhere.example/debug",
            ):
                assert (await _raw(port, _get(target)))[0] == 404, target
            assert (await _raw(port, _get(b"*", b"OPTIONS")))[0] == 404
            for method in (b"OPTIONS", b"TRACE", b"POST", b"PUT", b"DELETE", b"PATCH"):
                assert (await _raw(port, _get(b"/metrics", method)))[0] == 405, method
            status, body = await _raw(port, _get(b"/healthz", b"HEAD"))
            assert status == 200 and body == b""
            with caplog.at_level(logging.INFO):
                for request in (
                    _get(b"/healthz", headers=b"X-Big: " + b"a" * 100_000 + b"\r\n"),
                    _get(b"/healthz", headers=b"".join(b"X-%d: 1\r\n" % i for i in range(500))),
                    _get(b"/" + b"a" * 100_000),
                    _get(b"/healthz", b"BREW"),
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS to plain HTTP
                ):
                    assert (await _raw(port, request))[0] == 400, request[:40]
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert await _raw(port, _get(b"/healthz")) == (200, b"ok\n")
        finally:
            await runner.cleanup()

    asyncio.run(go())
