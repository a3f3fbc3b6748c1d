"""A real Kafka broker for the integration tests, chosen in this order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` if it is set (``scripts/test.sh`` sets it);
2. testcontainers' Kafka module, if a Docker engine answers (probed with a short timeout);
3. ``scripts/kafka-local.sh`` on free loopback ports in a run directory of its own,
   started for the session and stopped at its end.

Under ``CI=true`` an integration test never skips for want of a broker: it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, free_port

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _no_broker(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"no Kafka broker for the integration tests (CI=true): {reason}")
    pytest.skip(f"no Kafka broker: {reason}")


def _docker_answers() -> bool:
    """A quick yes/no: is there a Docker engine to run testcontainers on?"""
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no engine, no permission, no client library: no Docker
        return False
    return True


def _free_port_pair() -> int:
    """A loopback port whose successor is free too (the script's controller port)."""
    for _ in range(50):
        port = free_port()
        if port < 65535:
            try:
                import socket

                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no pair of free loopback ports")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    if not (shutil.which("java") and shutil.which("mvn")):
        _no_broker("KAFKA_BOOTSTRAP_SERVERS is unset, no Docker engine, and no java/mvn")
    run_dir = tempfile.mkdtemp(prefix="neardup-kafka-pytest-")
    port = _free_port_pair()
    script = ROOT / "scripts" / "kafka-local.sh"
    script_env = {**os.environ, "NEARDUP_KAFKA_DIR": run_dir, "NEARDUP_KAFKA_PORT": str(port)}
    started = subprocess.run(
        ["bash", str(script), "start"],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if started.returncode != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        _no_broker(f"scripts/kafka-local.sh start failed:\n{started.stderr[-2000:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(script), "stop"], env=script_env, timeout=120, check=False)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, so fixtures can see a failure (and print
    the workers' logs)."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)
