"""A worker whose state directory outlived its topics: the topics deleted and made again,
or a new broker (``scripts/kafka-local.sh stop`` deletes the broker's data). It rebuilds
each task's store from the new changelogs by itself (``neardup.kafka.taskstate.open_store``:
a store past its changelog's end) and decides the new stream as a fresh worker would.

Also a state directory away longer than its changelogs keep tombstones (rebuilt from the
changelogs, then deciding on as ``neardup dedup`` does), and state of another format
(the worker stops in one line)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neardup.flow import storeformat
from neardup.kafka.taskstate import FORMAT_KEY, SYNCED_KEY
from neardup.kafka.topics import INTERNAL_MAX_MESSAGE_BYTES
from neardup.store import RocksKV
from tests.integration.conftest import _no_broker
from tests.integration.helpers import (
    Collector,
    LocalBroker,
    _sort_key,
    all_out,
    check_against,
    create_topics,
    delete_topics,
    list_topics,
    reference,
    stores_match_changelogs,
    stream,
    task_stores,
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


# -- a store away too long, and state of another format --------------------------------------

HOUR_MS = 3_600_000


def _later(values: list[bytes], days: int) -> list[bytes]:
    """``values`` (JSON) fetched ``days`` later, under other URLs: pages after every
    earlier one."""
    out = []
    for v in values:
        msg = json.loads(v)
        msg["url"] += f"&later={days}"
        day = int(msg["fetched_at"][8:10]) + days
        msg["fetched_at"] = f"{msg['fetched_at'][:8]}{day:02d}{msg['fetched_at'][10:]}"
        out.append(json.dumps(msg).encode())
    return out


def _set_delete_retention(bootstrap: str, topics: list[str], ms: int) -> None:
    """Give the changelogs another ``delete.retention.ms`` (AlterConfigs sets a topic's
    whole config: the worker's own are given again)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    configs = {
        "cleanup.policy": "compact",
        "max.message.bytes": str(INTERNAL_MAX_MESSAGE_BYTES),
        "delete.retention.ms": str(ms),
    }

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            res = [ConfigResource(ConfigResourceType.TOPIC, t, configs) for t in topics]
            for response in await admin.alter_configs(res):
                assert all(code == 0 for code, *_ in response.resources), response.resources
        finally:
            await admin.close()

    asyncio.run(run())


def test_a_store_away_longer_than_its_changelog_keeps_tombstones_is_rebuilt(
    deploy: Any, tmp_path: Path
) -> None:
    """The changelogs keep tombstones for an hour (read from the brokers); the stores were
    last in step two hours ago: each is rebuilt from its changelog, once, and the worker
    decides on as ``neardup dedup`` over both streams."""
    (tmp_path / "first").mkdir()
    (tmp_path / "both").mkdir()
    d = deploy(2)
    first = _first_run(d, tmp_path)
    app = d.names.app_id
    changelogs = [f"{app}-{k}-changelog" for k in ("analyse", "part", "order")]
    _set_delete_retention(d.bootstrap, changelogs, HOUR_MS)
    stores = task_stores(Path(first.env["NEARDUP_STATE_DIR"]))
    assert set(stores) == {"analyse-0", "analyse-1", "part-0", "part-1", "order"}
    for path in stores.values():
        kv = RocksKV(str(path))
        kv.write([(SYNCED_KEY, f"{time.time() - 2 * HOUR_MS / 1000:.3f}".encode())])
        kv.close()
    first_values = set(stream((3,)))
    second = _later([v for v in stream((5,)) if v not in first_values], days=3)
    values = sorted(stream((3,)) + second, key=_sort_key)
    assert values[-len(second) :] == sorted(second, key=_sort_key)  # all after the first
    ref = reference(values, tmp_path / "both")
    size = first.log.stat().st_size
    again = d.worker(0).start()
    d.wait(lambda: again.get("/readyz") == 200, DEADLINE, "the worker ready again")
    d.produce(second)
    d.wait(lambda: all_out(ref, d), DEADLINE, "the second stream decided")
    check_against(ref, d)
    again.stop()
    said = again.log.read_bytes()[size:].decode(errors="replace")
    rebuilt = re.findall(
        r"^.*WARNING.*state at \S+/([\w-]+) .* longer than the changelog's "
        r"delete\.retention\.ms \(3600 s\).* rebuilding it from the changelog",
        said,
        re.M,
    )
    assert sorted(rebuilt) == sorted(stores), said[-3000:]
    stores_match_changelogs(d.bootstrap, [again])


def test_a_changelog_of_another_format_stops_the_worker_in_one_line(
    deploy: Any, tmp_path: Path
) -> None:
    """A changelog written by a version of another state format, and a state directory
    lost: the worker restores the store, finds the format and stops with status 1 and one
    line naming both formats and what to do; it neither replays nor decides."""
    from aiokafka import AIOKafkaProducer

    d = deploy(2)
    w = d.worker(0).start()
    d.wait(lambda: w.get("/readyz") == 200, DEADLINE, "the worker ready")
    w.stop()
    assert w.proc is not None and w.proc.returncode == 0, w.tail()
    other = {"state": storeformat.STATE_FORMAT + 1, "messages": 1, "written_by": "9.9"}

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=d.bootstrap, acks="all")
        await producer.start()
        try:
            topic = f"{d.names.app_id}-part-changelog"
            await producer.send_and_wait(topic, json.dumps(other).encode(), FORMAT_KEY, 0)
        finally:
            await producer.stop()

    asyncio.run(write())
    shutil.rmtree(w.env["NEARDUP_STATE_DIR"])
    size = w.log.stat().st_size
    again = d.worker(0)
    again.ended = True  # it is meant to stop
    again.start()
    assert again.proc is not None
    again.proc.wait(timeout=DEADLINE)
    said = again.log.read_bytes()[size:].decode(errors="replace")
    assert again.proc.returncode == 1, said[-3000:]
    fatal = [line for line in said.splitlines() if "CRITICAL" in line]
    assert len(fatal) == 1, said[-3000:]
    assert f"format {storeformat.STATE_FORMAT + 1} (messages 1), written by neardup 9.9" in fatal[0]
    assert f"keeps {storeformat.describe(storeformat.current())}" in fatal[0]
    assert "part-0" in fatal[0] and "NEARDUP_APP_ID" in fatal[0]
    assert "Traceback" not in said and "replaying" not in said, said[-3000:]
