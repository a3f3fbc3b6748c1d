"""Local table partitions too old to catch up from their changelogs (``neardup.kafka.freshness``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.stores.rocksdb import Store
from faust.types import TP
from rocksdict import Options, Rdict

from neardup.kafka import faustfix, freshness
from neardup.kafka.app import Worker
from neardup.kafka.tablekv import Changelog
from neardup.kafka.topics import TopicNames, retention_of
from neardup.settings import Settings


def _db(path: Path, n: int = 1) -> None:
    db = Rdict(str(path), Options(raw_mode=True))
    for i in range(n):
        db[b"k%d" % i] = b"v" * 100
    db.close()


def test_a_stamp_lives_beside_rocksdb_files_through_writes_compactions_and_reopens(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state-0.db"
    _db(path)
    freshness.stamp(path, 1_000.5)
    db = Rdict(str(path), Options(raw_mode=True))
    for i in range(20_000):  # past a memtable: flushes, new files, obsolete ones deleted
        db[b"x%d" % i] = os.urandom(64)
    db.flush()
    db.compact_range(None, None)
    db.close()
    db = Rdict(str(path), Options(raw_mode=True))
    assert db[b"k0"] == b"v" * 100
    db.close()
    assert freshness.caught_up_at(path) == 1_000.5
    assert not (path / f"{freshness.STAMP}.tmp").exists()


def test_without_a_stamp_the_files_mtimes_say_when(tmp_path: Path) -> None:
    """A database from a build before stamps; a stamp that cannot be believed counts as
    infinitely old."""
    path = tmp_path / "state-0.db"
    assert freshness.caught_up_at(path) is None  # no database: nothing to judge
    _db(path)
    for f in path.rglob("*"):
        os.utime(f, (5_000.0, 5_000.0))
    assert freshness.caught_up_at(path) == 5_000.0
    now = time.time()
    for text in ("not a time\n", "", "nan\n", "inf\n", f"{now + 2 * 3600}\n"):
        (path / freshness.STAMP).write_text(text)  # torn, foreign, or from a clock ahead
        assert freshness.caught_up_at(path, now) == 0.0, text
        assert freshness.stale_age(path, now=now) is not None
    freshness.stamp(path, now + 60)  # a minute ahead: another machine's clock
    assert freshness.stale_age(path, now=now) is None


@pytest.mark.parametrize(("age_h", "removed"), [(11.9, False), (12.1, True)])
def test_a_database_is_removed_past_half_the_tombstone_retention(
    tmp_path: Path, age_h: float, removed: bool
) -> None:
    path = tmp_path / "buckets-3.db"
    _db(path)
    freshness.stamp(path, time.time() - age_h * 3600)
    (tmp_path / f"buckets-2.db{freshness.ASIDE}").mkdir()  # a removal cut short
    assert freshness.discard_stale(str(tmp_path)) == (["buckets-3.db"] if removed else [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buckets-3.db"]
    db = Rdict(str(path), Options(raw_mode=True))
    assert (db.get(b"k0") is None) == removed  # removed: empty, and restored from the start
    db.close()
    # stamped when the restore begins, not when the old contents were read
    assert (freshness.caught_up_at(path) or 0) > time.time() - 60 if removed else True


def test_the_retention_is_the_shortest_the_changelogs_have() -> None:
    """DescribeConfigs resources as aiokafka gives them: (error code, message, type, name,
    entries of (name, value, read only, source, sensitive, synonyms))."""

    def topic(name: str, ms: str, code: int = 0) -> tuple[Any, ...]:
        entries = [] if code else [("delete.retention.ms", ms, False, 5, False, [])]
        return (code, "", 2, name, entries)

    hour, week = "3600000", str(7 * 24 * 3600 * 1000)
    assert retention_of([topic("a", week), topic("b", week)]) == 7 * 24 * 3600 * 1000
    assert retention_of([topic("a", week), topic("b", hour)]) == 3_600_000
    # a changelog Faust has not created yet will have the worker's own setting
    assert retention_of([topic("a", week), topic("b", "", 3)]) == freshness.TOMBSTONE_RETENTION_MS
    # one the worker may not describe (29: topic authorization failed) counts as that too
    assert retention_of([topic("a", hour), topic("b", "", 29)]) == 3_600_000
    assert retention_of([]) == freshness.TOMBSTONE_RETENTION_MS


def test_the_changelog_topics_are_named_as_faust_names_them() -> None:
    routed = Settings(app_id="nd", topology="routed")
    assert TopicNames.of(routed).changelogs(routed) == [
        "nd-state-changelog",
        "nd-buckets-changelog",
        "nd-sketches-changelog",
    ]
    sequential = Settings(app_id="nd", topology="sequential")
    assert TopicNames.of(sequential).changelogs(sequential) == ["nd-state-changelog"]


def test_a_stale_partition_assigned_again_is_removed_even_while_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition held by another worker for days and assigned back: its database is
    closed if Faust left it open (it does not close revoked ones), removed (so Faust
    restores it whole), and the offsets the worker and Faust's recovery hold for it are
    forgotten; a fresh one stays open; a new one is stamped as its restore begins; a
    partition assigned before, or of another topic, is not looked at."""
    topic = "nd-state-changelog"
    changelog = Changelog(SimpleNamespace())

    class Table:  # hashable, as Faust's are
        changelog_topic = SimpleNamespace(topics={topic}, get_topic_name=lambda: topic)

    table = Table()
    paths = {p: tmp_path / f"state-{p}.db" for p in range(4)}
    for p, age in ((0, freshness.MAX_AGE_S + 60), (1, 60), (3, freshness.MAX_AGE_S + 60)):
        _db(paths[p])
        freshness.stamp(paths[p], time.time() - age)
    for p in range(4):
        changelog._persisted[(table, p)] = 41
    dbs = {p: Rdict(str(paths[p]), Options(raw_mode=True)) for p in (0, 1)}
    also_held = dbs[0]  # a second reference: dropping Faust's alone would not close it
    recovery = SimpleNamespace(
        active_offsets={TP(topic, 0): 41, TP(topic, 1): 41},
        standby_offsets={TP(topic, 2): 41},
        active_highwaters={TP(topic, 0): 90},
        standby_highwaters={TP(topic, 2): 90},
    )
    called: list[Any] = []

    async def faust_on_rebalance(*args: Any) -> None:
        called.append((args, sorted(dbs)))

    store: Any = SimpleNamespace(
        partition_path=paths.__getitem__,
        app=SimpleNamespace(neardup_changelog=changelog, tables=SimpleNamespace(recovery=recovery)),
        table=table,
        _dbs=dbs,
    )
    monkeypatch.setattr(Store, "on_rebalance", faust_on_rebalance)
    faustfix.fresh_assignments()
    new = {TP(topic, p) for p in range(3)} | {TP("nd-raw", 5)}
    assigned = new | {TP(topic, 3)}  # state-3 was assigned before: Faust holds it already
    asyncio.run(Store.on_rebalance(store, assigned, set(), new, 7))
    # then Faust's own, with the stale database closed and dropped, the fresh one open
    assert called == [((store, assigned, set(), new, 7), [1])]
    dbs[1].close()
    for p in (0, 2):  # empty, stamped now: restored from the start
        db = Rdict(str(paths[p]), Options(raw_mode=True))
        assert db.get(b"k0") is None
        db.close()
        assert (freshness.caught_up_at(paths[p]) or 0) > time.time() - 60
    del also_held
    db = Rdict(str(paths[3]), Options(raw_mode=True))
    assert db.get(b"k0") == b"v" * 100  # not newly assigned: not looked at here
    db.close()
    assert changelog._persisted == {(table, 3): 41}
    assert recovery.active_offsets == {TP(topic, 1): 41}  # the fresh one's stays
    assert recovery.standby_offsets == recovery.active_highwaters == {}
    assert recovery.standby_highwaters == {}


def test_a_standby_is_caught_up_to_the_latest_end_its_applied_offset_reached() -> None:
    """Faust applies a standby's records in batches: under steady writes its applied
    offset trails the changelog's end at every tick, and passes each end later."""
    marks = freshness.StandbyMarks()
    tp = TP("nd-state-changelog", 0)
    assert marks.caught_up_at(tp, None, None, 10.0) is None  # no fetch yet
    assert marks.caught_up_at(tp, 0, None, 20.0) == 20.0  # an empty changelog
    assert marks.caught_up_at(tp, 100, 40, 30.0) is None
    assert marks.caught_up_at(tp, 200, 120, 40.0) == 30.0  # past 99, not yet 199
    assert marks.caught_up_at(tp, 300, 150, 50.0) is None  # 30.0 was stamped already
    assert marks.caught_up_at(tp, 400, 350, 60.0) == 50.0
    assert marks.caught_up_at(tp, 400, 399, 70.0) == 70.0
    marks.keep([])
    assert marks.caught_up_at(tp, 500, 450, 80.0) is None  # a standby here again: anew


def test_the_worker_stamps_its_actives_and_the_standbys_at_the_changelogs_end(
    tmp_path: Path,
) -> None:
    """Faust applies a standby's records in batches (and its first read is from offset
    -1): a standby is stamped only once its applied offset reaches the changelog's end. A
    database open but no longer assigned (a late write reopened it) is not stamped."""
    names = [(t, p) for t in ("state", "buckets") for p in range(4)]
    paths = {k: tmp_path / f"{k[0]}-{k[1]}.db" for k in names}
    for path in paths.values():
        _db(path)
    # buckets: 0 active; 1 standby applied to the end; 2 standby behind; 3 standby with
    # nothing applied yet, its records buffered; state-0 active, state-1 open but not
    # assigned
    persisted = {1: 99, 2: 60, 3: None}
    highwater = {1: 100, 2: 100, 3: 100}

    def table(name: str, partitions: list[int]) -> Any:
        store = SimpleNamespace(
            _dbs=dict.fromkeys(partitions),
            partition_path=lambda p: paths[(name, p)],
            persisted_offset=lambda tp: persisted[tp.partition],
        )
        topic = SimpleNamespace(get_topic_name=lambda: f"nd-{name}-changelog")
        return SimpleNamespace(data=store, changelog_topic=topic)

    def tp(name: str, p: int) -> TP:
        return TP(f"nd-{name}-changelog", p)

    standbys = {tp("buckets", p) for p in (1, 2, 3)}
    consumer = SimpleNamespace(
        assignment=lambda: {tp("state", 0), tp("buckets", 0), *standbys, TP("nd-raw", 0)}
    )
    tables = {"state": table("state", [0, 1]), "buckets": table("buckets", [0, 1, 2, 3])}

    def flush_buffers() -> None:  # Faust applies the standby records it has buffered
        persisted[3] = buffered.pop(3, persisted[3])

    buffered = {3: 99}
    worker: Any = SimpleNamespace(
        app=SimpleNamespace(
            consumer=consumer,
            assignor=SimpleNamespace(assigned_standbys=lambda: standbys),
            tables=SimpleNamespace(
                values=tables.values, recovery=SimpleNamespace(flush_buffers=flush_buffers)
            ),
        )
    )
    worker.standby_marks = freshness.StandbyMarks()

    def ends() -> dict[TP, int]:  # as the broker says, asked at the tick
        return {tp("buckets", p): end for p, end in highwater.items()}

    asked = time.time() - 5
    assert Worker.stamp_tables(worker, ends(), asked) == 4
    stamped = {k for k, path in paths.items() if (path / freshness.STAMP).exists()}
    # buckets-3 had its records buffered, not applied: applied before stamping
    assert stamped == {("state", 0), ("buckets", 0), ("buckets", 1), ("buckets", 3)}
    for name in (("state", 0), ("buckets", 1)):  # when the ends were asked for
        assert abs((freshness.caught_up_at(paths[name]) or 0) - asked) < 0.01  # ms rounded
    # a tick later buckets-2 has applied past the end seen then, not the end now
    persisted[2], highwater[2] = 150, 300
    assert Worker.stamp_tables(worker, ends(), asked + 60) == 5
    assert abs((freshness.caught_up_at(paths[("buckets", 2)]) or 0) - asked) < 0.01
    # no ends from the broker this tick: only an end recorded before can be reached
    persisted[2] = 299
    assert Worker.stamp_tables(worker, {}, asked + 120) == 3  # the actives, buckets-2
    assert abs((freshness.caught_up_at(paths[("buckets", 2)]) or 0) - (asked + 60)) < 0.01
