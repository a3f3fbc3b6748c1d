"""``worker.kafka.undo``: after a crash at any point, undoing what the changelog may lack
and replaying the changelog from the floor leaves a table partition exactly as the
changelog has it (what a full restore gives)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict, WriteBatch

from worker.kafka import undo

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


@settings(max_examples=200, deadline=None)
@given(flushes, st.data())
def test_undo_then_replay_is_the_changelogs_state(
    tmp_path_factory: object, flushed: list[list[list[Record]]], data: st.DataObject
) -> None:
    path = Path(tmp_path_factory.mktemp("db"))  # type: ignore[attr-defined]
    # how far each flush got when the worker died: the broker has the first `received`,
    # and the worker had seen the acknowledgement of the first `acked` of those
    received = data.draw(st.integers(0, len(flushed)))
    acked = data.draw(st.integers(0, received))
    changelog: list[Record] = []
    db = _open(path)
    persisted: int | None = None
    undo_keys: list[list[bytes]] = []
    ends: list[int] = []  # each received flush's last changelog offset

    def ack(j: int) -> None:  # Changelog._send's callback, then _forget
        nonlocal persisted
        persisted = ends[j]
        db[undo.OFFSET_KEY] = str(persisted).encode()
        # _forget may not delete the undo records (the partition revoked meanwhile)
        if data.draw(st.booleans()):
            for key in undo_keys[j]:
                del db[key]

    done = 0
    for i, flush in enumerate(flushed):
        covered: set[bytes] = set()
        undo_keys.append([])
        for planned in flush:
            records = _appended(db, planned)
            # acknowledgements come later than the writes, in order, any number at a time
            if done < min(acked, i):
                for _ in range(data.draw(st.integers(0, min(acked, i) - done))):
                    ack(done)
                    done += 1
            undo_keys[i] += _write(db, records, persisted, covered)
            if i < received:
                changelog.extend(records)
        if i < received:
            ends.append(len(changelog) - 1)
    while done < acked:
        ack(done)
        done += 1
    db.close()  # killed: what RocksDB has written stays

    db = _open(path)
    undo.revert_db(db)
    floor = db.get(undo.OFFSET_KEY)
    start = 0 if floor is None else int(floor) + 1
    for k, v in changelog[start:]:  # Faust's recovery from the persisted offset on
        if v is None:
            if k in db:
                del db[k]
        else:
            db[k] = v
    got = _table(db)
    assert not [k for k, _ in db.items(from_key=undo.UNDO_PREFIX)]
    db.close()

    want: dict[bytes, bytes] = {}
    for k, v in changelog:
        if v is None:
            want.pop(k, None)
        else:
            want[k] = v
    assert got == want


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
