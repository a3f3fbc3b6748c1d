"""A real Kafka broker for the integration tests, chosen in this order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` if it is set (``scripts/test.sh`` sets it);
2. testcontainers' Kafka module, if a Docker engine answers (probed with a short timeout);
3. ``scripts/kafka-local.sh`` on free loopback ports in a run directory of its own,
   started for the session and stopped at its end.

On a broker of the first kind, which outlives the session, the topics the session made
are deleted at its end.

Under ``CI=true`` an integration test never skips for want of a broker: it fails.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import USED_PREFIXES, Deployment, LocalBroker, delete_topics

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


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        try:
            delete_topics(env, USED_PREFIXES)
        except Exception as exc:  # the broker gone: nothing to keep from filling
            # (pytest's capture swallows a print in a session fixture's teardown)
            if sys.__stderr__ is not None:
                sys.__stderr__.write(f"the session's topics were not deleted from {env}: {exc!r}\n")
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    if not (shutil.which("java") and shutil.which("mvn")):
        _no_broker("KAFKA_BOOTSTRAP_SERVERS is unset, no Docker engine, and no java/mvn")
    run_dir = Path(tempfile.mkdtemp(prefix="neardup-kafka-pytest-"))
    broker = LocalBroker(run_dir)
    started = broker.run("start", check=False)
    if started.returncode != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        _no_broker(f"scripts/kafka-local.sh start failed:\n{started.stderr[-2000:]}")
    try:
        yield broker.bootstrap
    finally:
        broker.run("stop", check=False)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, so fixtures can see a failure (and print
    the workers' logs)."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def deploy(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``deploy(partitions, bootstrap=...)``: a Deployment (topics and workers of its own)
    closed at the end, its workers' logs printed if the test failed."""
    made: list[Deployment] = []

    def make(partitions: int, *, bootstrap: str | None = None) -> Deployment:
        d = Deployment(bootstrap or kafka_bootstrap, tmp_path / f"d{len(made)}", partitions)
        made.append(d)
        return d

    yield make
    failed = getattr(request.node, "rep_call", None)
    for d in made:
        if failed is not None and failed.failed:
            print(d.logs())
        d.close()
