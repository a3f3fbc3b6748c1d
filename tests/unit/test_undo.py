"""``neardup.kafka.undo``: after a crash at any point, undoing what the changelog may lack
and replaying the changelog from the floor leaves a table partition exactly as the
changelog has it (what a full restore gives)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict, WriteBatch

from neardup.kafka import rocksmem, tablekv, undo
from neardup.kafka.tablekv import Changelog

Record = tuple[bytes, bytes | None]

keys = st.sampled_from([b"a", b"b", b"c", b"d", b"\x00journal", b"T\x01"])
#: a value to write: none (a delete), new bytes, or APPEND: the key's value plus a byte
#: (what a bucket gaining an entry looks like, undone by its length only)
APPEND = b"<append>"
values = st.one_of(st.none(), st.binary(min_size=0, max_size=6), st.just(APPEND))
writes = st.lists(st.tuples(keys, values), min_size=1, max_size=4)
#: flushes, each of the local writes made before it
flushes = st.lists(st.lists(writes, min_size=1, max_size=3), max_size=7)


def _open(path: Path) -> Rdict:
    return Rdict(str(path), Options(raw_mode=True))


def _table(db: Rdict) -> dict[bytes, bytes]:
    return {
        k: v for k, v in db.items() if k != undo.OFFSET_KEY and not k.startswith(undo.UNDO_PREFIX)
    }


def _write(
    db: Rdict, records: list[Record], persisted: int | None, covered: set[bytes]
) -> list[bytes]:
    """What ``TableKV._write`` does: the records and, in the same batch, an undo record of
    the keys no earlier write of the same flush covers whole. The undo keys written."""
    batch = WriteBatch(raw_mode=True)
    ks = [k for k in dict.fromkeys(k for k, _ in records) if k not in covered]
    written = []
    if ks:
        key = undo.next_key()
        after = dict(records)  # each key's last value in the write
        record, whole = undo.encode(persisted, ks, db.get(ks), [after[k] for k in ks])
        batch.put(key, record)
        written.append(key)
        covered.update(whole)
    for k, v in records:
        if v is None:
            batch.delete(k)
        else:
            batch.put(k, v)
    db.write(batch)
    return written


def _appended(db: Rdict, planned: list[Record]) -> list[Record]:
    """``planned`` with each APPEND made the key's value then plus one byte."""
    now: dict[bytes, bytes | None] = {}
    out: list[Record] = []
    for k, planned_value in planned:
        value = planned_value
        if value == APPEND:
            old = now[k] if k in now else db.get(k)
            value = (old or b"") + bytes([len(out) % 256])
        now[k] = value
        out.append((k, value))
    return out


@settings(max_examples=300, deadline=None)
@given(flushes, st.data())
def test_undo_then_replay_is_the_changelogs_state(
    tmp_path_factory: object, flushed: list[list[list[Record]]], data: st.DataObject
) -> None:
    path = Path(tmp_path_factory.mktemp("db"))  # type: ignore[attr-defined]
    # which flushes the broker has when the worker dies: the first ones, or any of them
    # (a flush whose send failed or was cancelled, and later ones that got through), and
    # how many of those, in order, the worker had seen acknowledged; of the others, some
    # writes' records may have reached it all the same
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(flushed)))
        received = [i < cut for i in range(len(flushed))]
    else:
        received = [data.draw(st.booleans()) for _ in flushed]
    got_there = [i for i, r in enumerate(received) if r]
    acked = data.draw(st.integers(0, len(got_there)))
    changelog: list[Record] = []
    db = _open(path)
    persisted: int | None = None
    undo_keys: list[list[bytes]] = []
    ends: dict[int, int] = {}  # each received flush's last changelog offset

    def ack(j: int) -> None:  # Changelog._send's callback, then _forget
        nonlocal persisted
        persisted = ends[j]
        db[undo.OFFSET_KEY] = str(persisted).encode()
        # _forget may not delete the undo records (the partition revoked meanwhile)
        if data.draw(st.booleans()):
            for key in undo_keys[j]:
                del db[key]

    done = 0  # acknowledgements seen, of the flushes in got_there
    for i, flush in enumerate(flushed):
        covered: set[bytes] = set()
        undo_keys.append([])
        for planned in flush:
            records = _appended(db, planned)
            # acknowledgements come later than the writes, in order, any number at a time
            ready = sum(1 for j in got_there[:acked] if j < i)
            if done < ready:
                for _ in range(data.draw(st.integers(0, ready - done))):
                    ack(got_there[done])
                    done += 1
            undo_keys[i] += _write(db, records, persisted, covered)
            # a flush that failed may have got some of its batches through
            if received[i] or data.draw(st.booleans()):
                changelog.extend(records)
        if received[i]:
            ends[i] = len(changelog) - 1
    while done < acked:
        ack(got_there[done])
        done += 1
    db.close()  # killed: what RocksDB has written stays

    db = _open(path)
    undo.revert_db(db)
    floor = db.get(undo.OFFSET_KEY)
    _replay(db, changelog[0 if floor is None else int(floor) + 1 :])
    got = _table(db)
    assert not [k for k, _ in db.items(from_key=undo.UNDO_PREFIX)]
    db.close()

    want: dict[bytes, bytes] = {}
    _replay(want, changelog)
    assert got == want


def _replay(db: Rdict | dict[bytes, bytes], records: list[Record]) -> None:
    """Faust's recovery: the changelog's records applied in order."""
    for k, v in records:
        if v is None:
            if k in db:
                del db[k]
        else:
            db[k] = v


def test_a_clean_database_is_left_alone(tmp_path: Path) -> None:
    db = _open(tmp_path / "db")
    db[b"a"] = b"1"
    db[undo.OFFSET_KEY] = b"7"
    assert undo.revert_db(db) == 0
    assert db[b"a"] == b"1" and db[undo.OFFSET_KEY] == b"7"
    db.close()


def test_revert_goes_over_every_partition_database(tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    for name in ("state-0.db", "buckets-1.db"):
        db = _open(tables / name)
        db[b"k"] = b"old"
        db[undo.OFFSET_KEY] = b"3"
        _write(db, [(b"k", b"new")], 3, set())
        db.close()
    (tables / "not-a-table").mkdir()
    assert undo.revert(str(tables)) == (2, 2)
    for name in ("state-0.db", "buckets-1.db"):
        db = _open(tables / name)
        assert db[b"k"] == b"old" and db[undo.OFFSET_KEY] == b"3"
        db.close()
    assert undo.revert(str(tables)) == (0, 0)


def test_an_append_is_undone_by_its_length(tmp_path: Path) -> None:
    db = _open(tmp_path / "db")
    db[b"bucket"] = b"entry1"
    db[undo.OFFSET_KEY] = b"9"
    # two flushes, neither acknowledged: each appends an entry to the bucket
    first = _write(db, [(b"bucket", b"entry1entry2")], 9, set())
    second = _write(db, [(b"bucket", b"entry1entry2entry3"), (b"other", b"x")], 9, set())
    (raw,) = db.get(first)
    _, items = undo.decode(raw)
    assert items == [(b"bucket", 6)]  # the length before, not the bytes
    assert len(first) == len(second) == 1
    assert undo.revert_db(db) == 2
    assert db[b"bucket"] == b"entry1" and db.get(b"other") is None
    assert db[undo.OFFSET_KEY] == b"9"
    db.close()


def test_an_append_then_a_rewrite_are_undone_in_turn(tmp_path: Path) -> None:
    db = _open(tmp_path / "db")
    db[b"bucket"] = b"entry1"
    _write(db, [(b"bucket", b"entry1entry2")], None, set())  # an append: its length
    _write(db, [(b"bucket", b"capped")], None, set())  # a rewrite: the value before
    assert undo.revert_db(db) == 2
    assert db[b"bucket"] == b"entry1"
    assert db.get(undo.OFFSET_KEY) is None  # nothing known persisted: replay it all
    db.close()


def test_an_append_then_a_change_in_one_flush_are_both_undone(tmp_path: Path) -> None:
    # found by the property test in CI: an append is recorded by its length, so a later
    # write of the same flush must record the value it changes, or undo cuts the wrong one
    for last in (None, b"YZ", b"entry1"):
        db = _open(tmp_path / f"db-{last!r}")
        db[b"bucket"] = b"entry1"
        covered: set[bytes] = set()
        _write(db, [(b"bucket", b"entry1entry2")], None, covered)
        _write(db, [(b"bucket", last)], None, covered)
        assert undo.revert_db(db) == 2
        assert db[b"bucket"] == b"entry1"
        db.close()


class _Offsets:
    """A table's store, as ``Changelog`` sees it: the persisted offsets and the
    partition databases."""

    def __init__(self, db: Rdict) -> None:
        self._dbs = {0: db}
        self.offsets: dict[Any, int] = {}

    def persisted_offset(self, tp: Any) -> int | None:
        return self.offsets.get(tp)

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.offsets[tp] = offset


class _Table:
    """A Faust table, as ``Changelog`` sees it (a dict key, as Faust's tables are)."""

    name = "t"
    changelog_topic = SimpleNamespace(get_topic_name=lambda: "t-changelog")

    def __init__(self, db: Rdict) -> None:
        self.data = _Offsets(db)


class _Producer:
    """aiokafka's ``send_batch``: each batch's delivery future, for the test to settle."""

    def __init__(self, fail_handing_over: BaseException | None = None) -> None:
        self.futures: list[asyncio.Future[Any]] = []
        self.fail_handing_over = fail_handing_over

    async def send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        if self.fail_handing_over is not None:
            raise self.fail_handing_over
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]


BIG = b"v" * (700 << 10)  # two such records do not fit one changelog batch (1 MiB)


def _changelog(
    db: Rdict, producer: _Producer, value: bytes = b"new"
) -> tuple[Changelog, _Table, list[bytes]]:
    """A Changelog over one table partition, with two local writes (and their undo
    records) waiting for the next flush."""
    app = SimpleNamespace(producer=SimpleNamespace(_producer=producer))
    table = _Table(db)
    changelog = Changelog(app)
    undo_keys = []
    for key in (b"k", b"j"):
        covered: set[bytes] = set()
        undo_keys += _write(db, [(key, value)], None, covered)
        changelog.add(table, 0, [(key, value)], undo_keys[-1], covered)
    return changelog, table, undo_keys


async def _until_sent(producer: _Producer, task: asyncio.Future[Any], n: int = 1) -> None:
    while len(producer.futures) < n and not task.done():
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    "how",
    [
        "acknowledged",
        "failed",
        "second of two acknowledged",
        "not handed over",
        "a stop while handing over",
    ],
)
def test_a_flush_that_does_not_reach_the_broker_leaves_its_writes_to_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A batch that fails, or records not handed over (the producer gone, a stop in the
    middle of a flush), leave the flush's undo records and a stop that is not clean, so
    the next start undoes those writes; they do not put the tables in doubt, which would
    discard them whole, and nothing is sent after them. After a failed batch no offset
    may be committed either (``settled``), and the worker is to exit (``on_fatal``):
    steps acknowledged after flushes that do not wait may have records in it. Records
    not handed over are of steps not acknowledged yet, and a stop is only a stop."""
    doubted: list[bool] = []
    fatal: list[BaseException] = []
    monkeypatch.setattr(tablekv, "on_doubt", lambda: doubted.append(True))
    monkeypatch.setattr(tablekv, "on_fatal", fatal.append)
    db = _open(tmp_path / "db")
    db[b"k"], db[b"j"] = b"old", b"old"
    producer = _Producer(
        RuntimeError("KafkaConnectionError")
        if how == "not handed over"
        else asyncio.CancelledError()
        if how == "a stop while handing over"
        else None
    )
    two = how == "second of two acknowledged"
    changelog, table, undo_keys = _changelog(db, producer, BIG if two else b"new")

    async def flush() -> tuple[BaseException | None, bool, BaseException | None]:
        """What the flush raised, whether the changelog then says offsets may be
        committed, and what a flush of a record written after raised."""
        task = asyncio.ensure_future(changelog.flush())
        await _until_sent(producer, task, 2 if two else 1)
        if how == "acknowledged":
            producer.futures[0].set_result(SimpleNamespace(offset=41))
        elif how == "failed":
            producer.futures[0].set_exception(RuntimeError("KafkaTimeoutError"))
        elif two:
            assert len(producer.futures) == 2  # one batch each
            producer.futures[0].set_exception(RuntimeError("MessageSizeTooLarge"))
            producer.futures[1].set_result(SimpleNamespace(offset=41))
        raised = (await asyncio.gather(task, return_exceptions=True))[0]
        settled = await changelog.settled()
        changelog.add(table, 0, [(b"k", b"newer")])
        later = (await asyncio.gather(changelog.flush(wait=False), return_exceptions=True))[0]
        return raised, settled, later

    if how == "acknowledged":
        producer.fail_handing_over = None
        raised, settled, _ = asyncio.run(flush())
        assert raised is None and settled
        assert not changelog.unsent and not fatal
        assert [db.get(k) for k in undo_keys] == [None, None]  # nothing left to undo
        assert table.data.offsets == {TP("t-changelog", 0): 42}  # base 41, two records
    else:
        sent_before = len(producer.futures)
        raised, settled, later = asyncio.run(flush())
        assert isinstance(raised, (RuntimeError, asyncio.CancelledError))
        handed_over = how in ("failed", "second of two acknowledged")
        assert settled is not handed_over  # no offset is committed after a failed batch
        assert changelog.unsent and not changelog.clean
        assert len(fatal) == (0 if how == "a stop while handing over" else 1)
        assert None not in [db.get(k) for k in undo_keys]
        # and nothing more goes out, even records written since
        assert isinstance(later, RuntimeError)
        assert len(producer.futures) == (2 if two else 1 if how == "failed" else sent_before)
        assert sent_before == 0 or handed_over
        assert undo.revert_db(db) == 2 and db[b"k"] == db[b"j"] == b"old"
    assert not changelog.failed and not doubted
    db.close()


def test_a_flush_cancelled_while_it_waits_is_not_a_clean_stop_until_the_broker_answers(
    tmp_path: Path,
) -> None:
    """A shutdown cancels an agent that waits for the broker's answer: the records are
    handed over, and the stop is clean only if they arrive."""
    db = _open(tmp_path / "db")
    producer = _Producer()
    changelog, _, undo_keys = _changelog(db, producer)

    async def cancelled() -> None:
        task = asyncio.ensure_future(changelog.flush())
        await _until_sent(producer, task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not changelog.clean and not changelog.unsent  # on its way
        # a commit that waits for it, cancelled (a shutdown) does not cancel it either
        commit = asyncio.ensure_future(changelog.settled())
        await asyncio.sleep(0)
        commit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await commit
        assert not producer.futures[0].done() and not changelog.unsent
        producer.futures[0].set_result(SimpleNamespace(offset=7))
        assert await changelog.settled()

    asyncio.run(cancelled())
    assert changelog.clean and [db.get(k) for k in undo_keys] == [None, None]
    db.close()


def test_no_offset_is_committed_while_changelog_records_may_be_lost() -> None:
    """``faustfix.guard_commits``: the consumer's commit waits for the changelog records
    handed over before it, and refuses if some did not reach the broker."""
    from faust.transport.consumer import ThreadDelegateConsumer
    from faust.transport.drivers.aiokafka import Consumer

    from neardup.kafka import faustfix

    faustfix.guard_commits()
    assert getattr(Consumer._commit, "neardup_fix", False)  # what the worker's consumer runs
    committed: list[dict[str, int]] = []

    async def commit(offsets: dict[str, int]) -> bool:
        committed.append(dict(offsets))
        return True

    changelog = Changelog(SimpleNamespace())
    consumer = SimpleNamespace(
        app=SimpleNamespace(neardup_changelog=changelog), _thread=SimpleNamespace(commit=commit)
    )

    async def run() -> list[bool | str]:
        out = [await ThreadDelegateConsumer._commit(consumer, {"raw-0": 5})]  # type: ignore[arg-type]
        pending: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        changelog._sent.append(pending)
        later = asyncio.ensure_future(ThreadDelegateConsumer._commit(consumer, {"raw-0": 6}))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert not later.done() and len(committed) == 1  # waits for the records on their way
        pending.set_result(None)
        out.append(await later)
        changelog.unsent = True  # records not handed over: of steps not acknowledged
        out.append(await ThreadDelegateConsumer._commit(consumer, {"raw-0": 7}))  # type: ignore[arg-type]
        changelog.undelivered = True  # a batch failed
        try:
            await ThreadDelegateConsumer._commit(consumer, {"raw-0": 8})  # type: ignore[arg-type]
        except RuntimeError as exc:
            out.append(str(exc).split(":")[0])
        return out

    assert asyncio.run(run()) == [True, True, True, "not committing offsets {'raw-0'"]
    assert committed == [{"raw-0": 5}, {"raw-0": 6}, {"raw-0": 7}]


def _entries_filtered(db: Rdict) -> tuple[int, int]:
    """(entries in the database's table files, entries their bloom filters hold)."""
    props = dict(
        item.strip().split("=", 1)
        for item in db.property_value("rocksdb.aggregated-table-properties").split(";")
        if "=" in item
    )
    return int(props["# entries"]), int(props["# entries for filter"])


def test_the_log_replayed_by_the_undo_pass_is_flushed_with_a_bloom_filter(
    tmp_path: Path,
) -> None:
    # a worker killed (or stopped: Faust never closes its databases) leaves its last
    # writes in the database's log; the undo pass at start replays it into a table file
    tables = tmp_path / "tables"
    (tables / "state-0.db").mkdir(parents=True)
    script = (
        "import os, sys\n"
        "from neardup.kafka import rocksmem\n"
        "db = rocksmem.open_outside(sys.argv[1])\n"
        "for i in range(2000):\n"
        "    db[i.to_bytes(4, 'big')] = b'v' * 20\n"
        "os._exit(0)\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script, str(tables / "state-0.db")], cwd=root, check=True)
    assert not list((tables / "state-0.db").glob("*.sst"))  # all in the log
    assert undo.revert(str(tables)) == (0, 0)
    db = rocksmem.open_outside(tables / "state-0.db")
    try:
        assert _entries_filtered(db) == (2000, 2000)
    finally:
        db.close()
