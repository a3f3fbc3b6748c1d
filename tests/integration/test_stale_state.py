"""A worker whose state directory outlived its topics: the topics deleted and made again,
or a new broker (``scripts/kafka-local.sh stop`` deletes the broker's data). It rebuilds
each task's store from the new changelogs by itself (``neardup.kafka.taskstate.open_store``:
a store past its changelog's end) and decides the new stream as a fresh worker would."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import _no_broker
from tests.integration.helpers import (
    Collector,
    LocalBroker,
    all_out,
    check_against,
    create_topics,
    delete_topics,
    list_topics,
    reference,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration

DEADLINE = 240.0


def _first_run(d: Any, tmp_path: Path) -> Any:
    """A worker decides a stream and stops cleanly: its state directory holds stores."""
    values = stream((3,))
    ref = reference(values, tmp_path / "first")
    d.produce(values)
    w = d.worker(0).start()
    d.wait(lambda: all_out(ref, d), DEADLINE, "the first stream decided")
    w.stop()
    assert w.proc is not None and w.proc.returncode == 0, w.tail()
    return w


def _second_run(d: Any, tmp_path: Path) -> Any:
    """The same worker (same state directory) on topics that are new: it becomes ready,
    and decides a stream exactly as ``neardup dedup`` does from nothing (a new collector:
    the first one's topics are gone)."""
    d.collector = Collector(d.bootstrap, [d.names.decisions, d.names.merges, d.names.rejects])
    values = stream((5,))
    ref = reference(values, tmp_path / "second")
    w = d.worker(0).start()
    d.wait(lambda: w.get("/readyz") == 200, DEADLINE, "the worker ready on the new topics")
    d.produce(values)
    d.wait(lambda: all_out(ref, d), DEADLINE, "the second stream decided")
    check_against(ref, d)
    return w


def test_topics_deleted_and_made_again_the_worker_rebuilds_its_state(
    deploy: Any, tmp_path: Path
) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    d = deploy(2)
    _first_run(d, tmp_path)
    d.collector.close()  # its topics go
    gone = delete_topics(d.bootstrap, d.names.prefix)
    assert any(t.endswith("-changelog") for t in gone), gone
    wait_for(lambda: not set(gone) & list_topics(d.bootstrap), 60, "the topics deleted")
    create_topics(d.bootstrap, {d.names.raw: 2})
    again = _second_run(d, tmp_path)
    _rebuilt_once(again.log.read_text(errors="replace"))


def _rebuilt_once(said: str) -> None:
    """The second run said once per task store that it rebuilt the old one."""
    rebuilt = re.findall(
        r"^.*state at \S+/([\w-]+) .* rebuilding it from the changelog", said, re.M
    )
    stores = {"analyse-0", "analyse-1", "part-0", "part-1", "order"}
    assert sorted(rebuilt) == sorted(stores), said[-3000:]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker of the test's own, stopped after the deployment that uses it (a test asks
    for it before ``deploy``, which is then torn down first)."""
    if not (shutil.which("java") and shutil.which("mvn")):
        _no_broker("no java/mvn for a broker of the test's own")  # under CI=true: a failure
    broker = LocalBroker(tmp_path / "kafka")
    broker.run("start")
    yield broker
    broker.run("stop", check=False)


def test_a_new_broker_the_worker_rebuilds_its_state(
    own_broker: LocalBroker, deploy: Any, tmp_path: Path
) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    broker = own_broker
    d = deploy(2, bootstrap=broker.bootstrap)
    _first_run(d, tmp_path)
    d.collector.close()  # its broker goes
    old = broker.cluster_id()
    broker.run("stop")  # deletes the broker's data, as the README's recipe does
    broker.run("start")
    assert broker.cluster_id() != old
    create_topics(d.bootstrap, {d.names.raw: 2})
    again = _second_run(d, tmp_path)
    _rebuilt_once(again.log.read_text(errors="replace"))
