"""The exactly-once task runtime (``neardup.kafka.delivery``, ``runtime``, ``taskstate``)
against a real broker, with the toy word-counting step of ``delivery_world``: workers run
in child processes, killed, stalled and restarted; the outputs read with read_committed
must hold exactly one record per input, with the count a sequential run gives.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from neardup.flow import storeformat
from neardup.kafka.taskstate import (
    FORMAT_KEY,
    OFFSET_KEY,
    SOURCE_KEY,
    items,
    open_store,
    stored_offset,
)
from neardup.store import RocksKV
from tests.integration.delivery_world import (
    WORDS,
    Setup,
    Tail,
    Topics,
    assert_exactly_once,
    changelog_state,
    make_inputs,
    parse,
    produce,
    sequential,
    store_items,
    wait_outputs,
)
from tests.integration.helpers import Names, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    s = Setup(kafka_bootstrap, tmp_path)
    yield s
    for w in s.workers:
        if w.proc.is_alive():
            w.kill()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(s.logs())


def until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` closely for up to ``timeout`` seconds; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_exactly_once_across_sigkill(setup: Setup) -> None:
    t, bootstrap = setup.topics, setup.bootstrap
    inputs = make_inputs(t, 6000, seed=1)
    committed = Tail(bootstrap, t.out, "read_committed")
    uncommitted = Tail(bootstrap, t.out, "read_uncommitted")
    try:
        # fed a chunk at a time, at most 300 records ahead of the worker; each time it has
        # sent 600 more outputs, killed while outputs are seen that read_committed does
        # not see yet (a transaction open), and started again
        a = setup.worker("a")
        kills, mark = 0, 0
        for at in range(0, len(inputs), 200):
            produce(bootstrap, inputs[at : at + 200])
            if len(uncommitted.values) > mark + 600 and kills < 5:
                open_txn = lambda: len(uncommitted.values) > len(committed.values) + 20  # noqa: E731
                until(open_txn, 5)
                a.kill()
                kills, mark = kills + 1, len(uncommitted.values)
                a = setup.worker("a")
            wait_for(lambda n=at: len(uncommitted.values) >= n - 300, 60, "the worker")
        assert kills >= 3, f"{kills} kills"
        want, stores = sequential(inputs)
        wait_outputs(committed, len(want), setup)
        setup.workers[-1].stop()
        assert_exactly_once(committed.values, want)
        # read_uncommitted may hold aborted outputs as well: all it must hold is these
        assert set(uncommitted.values) >= set(committed.values)
    finally:
        committed.close()
        uncommitted.close()
    state = Path(setup.config("a").state_dir)
    for name, tp, log in [
        ("task-0", (t.inp, 0), 0),
        ("task-1", (t.inp, 1), 1),
        ("order", (t.solo, 0), 2),
    ]:
        assert store_items(state, name) == stores[tp], name
        assert changelog_state(bootstrap, TopicPartition(t.changelog, log)) == stores[tp], name


TASKS = ["task-0", "task-1", "order"]


def task_of(topics: Topics, topic: str, partition: int) -> str:
    return "order" if topic == topics.solo else f"task-{partition}"


def test_a_zombie_is_fenced_and_its_late_commit_dropped(setup: Setup) -> None:
    """Worker a stalls inside a step (its loop blocked, no heartbeats); b takes its tasks,
    and starting their producers fences a's. Released, a finishes the step and tries to
    commit: fenced, dropped, nothing written twice."""
    t, bootstrap = setup.topics, setup.bootstrap
    stall = [(t.inp, 0, WORDS[0], b"stall")]
    first, more, last = (make_inputs(t, n, seed=s) for n, s in ((800, 5), (500, 6), (300, 7)))
    committed = Tail(bootstrap, t.out, "read_committed")
    try:
        produce(bootstrap, first + stall + more)
        a = setup.worker("a", stall=True)
        wait_for(setup.signal("stalled-a").exists, 60, "worker a to stall")
        b = setup.worker("b")
        wait_outputs(committed, len(first + stall + more), setup)
        setup.signal("release").touch()
        wait_for(lambda: "fenced" in a.text(), 60, "worker a's late commit to be fenced")
        produce(bootstrap, last)
        want, _ = sequential(first + stall + more + last)
        wait_outputs(committed, len(want), setup)
        a.stop()
        b.stop()
        assert_exactly_once(committed.values, want)
    finally:
        committed.close()


def test_restore_rebuilds_a_deleted_store(setup: Setup) -> None:
    t, bootstrap = setup.topics, setup.bootstrap
    first, second = make_inputs(t, 1500, seed=3), make_inputs(t, 600, seed=4)
    where = {"task-0": (t.inp, 0), "task-1": (t.inp, 1), "order": (t.solo, 0)}
    state = Path(setup.config("a").state_dir)
    committed = Tail(bootstrap, t.out, "read_committed")
    try:
        produce(bootstrap, first)
        a = setup.worker("a")
        wait_outputs(committed, len(first), setup)
        a.stop()
        before = {name: store_items(state, name) for name in TASKS}
        _, stores = sequential(first)
        assert before == {name: stores[tp] for name, tp in where.items()}
        assert all(before.values()), "a task with no state proves nothing"
        shutil.rmtree(state)
        for ready in setup.signal("").glob("ready-*"):
            ready.unlink()
        a = setup.worker("a")
        for name in TASKS:
            wait_for(setup.signal(f"ready-a-{name}").exists, 60, f"task {name} to restore")
        a.stop()
        assert {name: store_items(state, name) for name in TASKS} == before
        # the rebuilt counts go on where they were
        produce(bootstrap, second)
        setup.worker("a")
        want, stores = sequential(first + second)
        wait_outputs(committed, len(want), setup)
        setup.workers[-1].stop()
        assert_exactly_once(committed.values, want)
        assert {name: store_items(state, name) for name in TASKS} == {
            name: stores[tp] for name, tp in where.items()
        }
    finally:
        committed.close()


def test_a_second_worker_joins_mid_stream(setup: Setup) -> None:
    t, bootstrap = setup.topics, setup.bootstrap
    first, second, third = (make_inputs(t, n, seed=s) for n, s in ((3000, 8), (1500, 9), (900, 10)))
    committed = Tail(bootstrap, t.out, "read_committed")
    try:
        produce(bootstrap, first)
        a = setup.worker("a")
        wait_outputs(committed, 500, setup)
        b = setup.worker("b")
        produce(bootstrap, second)
        wait_for(lambda: any(setup.signal(f"ready-b-{n}").exists() for n in TASKS), 60, "b's tasks")
        wait_outputs(committed, len(first + second), setup)
        produce(bootstrap, third)
        want, _ = sequential(first + second + third)
        wait_outputs(committed, len(want), setup)
        a.stop()
        b.stop()
        assert_exactly_once(committed.values, want)
    finally:
        committed.close()
    # the third part was read by both workers, each task by one
    late = len(first + second)
    offsets = sequential(first + second)[0].keys()
    owners: dict[str, set[str]] = {}
    for where, _, worker in parse(committed.values):
        if where not in offsets:
            owners.setdefault(task_of(t, where[0], where[1]), set()).add(worker)
    assert late and all(len(w) == 1 for w in owners.values()), owners
    assert set().union(*owners.values()) == {"a", "b"}, owners


def _changelog_with(bootstrap: str, records: list[tuple[bytes, bytes | None]]) -> TopicPartition:
    """A new 1-partition changelog topic holding the state's format at offset 0, then
    ``records`` at offsets 1, 2, ..."""
    records = [(FORMAT_KEY, storeformat.marker()), *records]
    topic = f"{Names().prefix}-changelog"

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic, value=value, key=key, partition=0)
        finally:
            await producer.stop()

    asyncio.run(run())
    return TopicPartition(topic, 0)


def _open(bootstrap: str, path: Path, tp: TopicPartition) -> dict[bytes, bytes]:
    async def run() -> dict[bytes, bytes]:
        reader = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
        )
        await reader.start()
        try:
            store = await open_store(str(path), tp, reader)
        finally:
            await reader.stop()
        try:
            assert stored_offset(store) == (f"{tp.topic}:0", 4)
            return dict(items(store))
        finally:
            store.close()

    return asyncio.run(run())


def _store(path: Path, records: list[tuple[bytes, bytes | None]]) -> None:
    kv = RocksKV(str(path))
    kv.write(records)
    kv.close()


def test_a_store_behind_catches_up_and_one_past_the_changelog_is_rebuilt(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tp = _changelog_with(kafka_bootstrap, [(b"a", b"1"), (b"b", b"2"), (b"a", None)])
    source = f"{tp.topic}:0".encode()
    want = {b"b": b"2"}
    caplog.set_level(logging.INFO, logger="neardup.kafka")
    # new, and behind (it holds offsets 0 and 1 only): caught up, nothing discarded
    assert _open(kafka_bootstrap, tmp_path / "new", tp) == want
    behind = [(FORMAT_KEY, storeformat.marker()), (b"a", b"1"), (SOURCE_KEY, source)]
    behind.append((OFFSET_KEY, b"2"))
    _store(tmp_path / "behind", behind)
    assert _open(kafka_bootstrap, tmp_path / "behind", tp) == want
    assert "rebuilding" not in caplog.text
    # past the changelog's end (the topics were made again), or of another changelog
    for name, stale in [
        ("ahead", [(b"x", b"9"), (SOURCE_KEY, source), (OFFSET_KEY, b"99")]),
        ("other", [(b"x", b"9"), (SOURCE_KEY, b"elsewhere:0"), (OFFSET_KEY, b"1")]),
    ]:
        caplog.clear()
        _store(tmp_path / name, stale)
        assert _open(kafka_bootstrap, tmp_path / name, tp) == want, name
        assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
        assert "rebuilding it from the changelog" in caplog.text, name


def test_a_fenced_commit_leaves_no_error_unretrieved(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit of a fenced producer raises ``FencedError``, and aiokafka's own futures
    that hold the same error (its queued batches') are not logged as never retrieved."""
    import gc

    from neardup.kafka.assignor import Task
    from neardup.kafka.delivery import Config, FencedError, TaskRunner, quiet_fenced
    from neardup.kafka.taskstate import Overlay

    prefix = Names().prefix
    out, cl, txn = f"{prefix}-out", f"{prefix}-changelog", f"{prefix}-txn"

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(out, 4, 1), NewTopic(cl, 1, 1)])
        finally:
            await admin.close()
        zombie, owner = (
            AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=txn)
            for _ in range(2)
        )
        await zombie.start()
        await zombie.begin_transaction()  # its producer id and the topics known, so the
        for topic in (out, cl):  # commit below sends every batch before the fence is seen
            await zombie.send_and_wait(topic, b"warm", partition=0)
        await zombie.commit_transaction()
        cfg = Config(kafka_bootstrap, prefix, (out,), str(tmp_path))
        task = Task("t-0", (), TopicPartition(cl, 0))
        runner = TaskRunner(task, lambda t: None, cfg, zombie)
        runner.kv = Overlay(RocksKV(str(tmp_path / "store")))
        asyncio.get_running_loop().set_exception_handler(quiet_fenced)  # as the runtime does
        await owner.start()  # fences the zombie
        for partition in range(4):
            runner.out.send(out, partition, b"k", b"v")
        runner.kv.put_many([(b"x", b"y")])
        try:
            with pytest.raises(FencedError):
                await runner.commit(prefix)
        finally:
            await runner.close()
            await owner.stop()
        del runner, zombie
        gc.collect()

    caplog.set_level(logging.ERROR, logger="asyncio")
    asyncio.run(run())
    gc.collect()
    assert "never retrieved" not in caplog.text
