"""``worker.kafka.undo``: after a crash at any point, undoing what the changelog may lack
and replaying the changelog from the floor leaves a table partition exactly as the
changelog has it (what a full restore gives)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict, WriteBatch

from worker.kafka import tablekv, undo
from worker.kafka.tablekv import Changelog

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


def _changelog(db: Rdict, producer: _Producer) -> tuple[Changelog, _Table, bytes]:
    """A Changelog over one table partition, with one local write (and its undo record)
    waiting for the next flush."""
    app = SimpleNamespace(producer=SimpleNamespace(_producer=producer))
    table = _Table(db)
    changelog = Changelog(app)
    undo_key = _write(db, [(b"k", b"new")], None, set())[0]
    changelog.add(table, 0, [(b"k", b"new")], undo_key, [b"k"])
    return changelog, table, undo_key


@pytest.mark.parametrize("how", ["acknowledged", "failed", "cancelled", "not handed over"])
def test_a_flush_that_does_not_reach_the_broker_leaves_its_writes_to_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A send that fails or is cancelled (a shutdown in the middle of a flush, say) leaves
    the flush's undo records and a stop that is not clean, so the next start undoes those
    writes; it does not put the tables in doubt, which would discard them whole."""
    doubted: list[bool] = []
    monkeypatch.setattr(tablekv, "on_doubt", lambda: doubted.append(True))
    db = _open(tmp_path / "db")
    db[b"k"] = b"old"
    producer = _Producer(asyncio.CancelledError() if how == "not handed over" else None)
    changelog, table, undo_key = _changelog(db, producer)

    async def flush() -> None:
        task = asyncio.ensure_future(changelog.flush())
        while not producer.futures and not task.done():
            await asyncio.sleep(0)
        if how == "acknowledged":
            producer.futures[0].set_result(SimpleNamespace(offset=41))
        elif how == "failed":
            producer.futures[0].set_exception(RuntimeError("KafkaTimeoutError"))
        elif how == "cancelled":
            producer.futures[0].cancel()
        await task

    if how == "acknowledged":
        asyncio.run(flush())
        assert changelog.clean and not changelog.unsent
        assert db.get(undo_key) is None  # the changelog has the write: nothing to undo
        assert table.data.offsets == {TP("t-changelog", 0): 41}
    else:
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            asyncio.run(flush())
        assert changelog.unsent and not changelog.clean
        assert db.get(undo_key) is not None
        assert undo.revert_db(db) == 1 and db[b"k"] == b"old"
    assert not changelog.failed and not doubted
    db.close()
