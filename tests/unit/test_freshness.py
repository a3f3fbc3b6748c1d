"""Local table partitions too old to catch up from their changelogs (``worker.kafka.freshness``)."""

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

from worker.kafka import faustfix, freshness
from worker.kafka.app import Worker
from worker.kafka.tablekv import Changelog
from worker.kafka.topics import TopicNames, retention_of
from worker.settings import Settings


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
    restores it whole), and the changelog offset the worker had cached for it is read
    afresh; a fresh one stays open; a new one is stamped as its restore begins."""
    changelog = Changelog(SimpleNamespace())

    class Table:  # hashable, as Faust's are
        changelog_topic = SimpleNamespace(topics={"nd-state-changelog"})

    table = Table()
    paths = {p: tmp_path / f"state-{p}.db" for p in range(3)}
    for p in (0, 1):
        _db(paths[p])
        freshness.stamp(paths[p], time.time() - (freshness.MAX_AGE_S + 60 if p == 0 else 60))
    for p in range(3):
        changelog._persisted[(table, p)] = 41
    dbs = {p: Rdict(str(paths[p]), Options(raw_mode=True)) for p in (0, 1)}
    called: list[Any] = []

    async def faust_on_rebalance(*args: Any) -> None:
        called.append((args, sorted(dbs)))

    store: Any = SimpleNamespace(
        partition_path=paths.__getitem__,
        app=SimpleNamespace(neardup_changelog=changelog),
        table=table,
        _dbs=dbs,
    )
    monkeypatch.setattr(Store, "on_rebalance", faust_on_rebalance)
    faustfix.fresh_assignments()
    tps = {TP("nd-state-changelog", p) for p in range(3)} | {TP("nd-raw", 0)}
    asyncio.run(Store.on_rebalance(store, tps, set(), tps, 7))
    # then Faust's own, with the stale database closed and dropped, the fresh one open
    assert called == [((store, tps, set(), tps, 7), [1])]
    dbs[1].close()
    for p in (0, 2):  # empty, stamped now: restored from the start
        db = Rdict(str(paths[p]), Options(raw_mode=True))
        assert db.get(b"k0") is None
        db.close()
        assert (freshness.caught_up_at(paths[p]) or 0) > time.time() - 60
    assert changelog._persisted == {}


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
    # nothing applied yet; state-0 active, state-1 open but not assigned
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
        assignment=lambda: {tp("state", 0), tp("buckets", 0), *standbys, TP("nd-raw", 0)},
        highwater=lambda t: highwater[t.partition],
    )
    tables = {"state": table("state", [0, 1]), "buckets": table("buckets", [0, 1, 2, 3])}
    worker: Any = SimpleNamespace(
        app=SimpleNamespace(
            consumer=consumer,
            assignor=SimpleNamespace(assigned_standbys=lambda: standbys),
            tables=tables,
        )
    )
    before = time.time()
    assert Worker.stamp_tables(worker) == 3
    stamped = {k for k, path in paths.items() if (path / freshness.STAMP).exists()}
    assert stamped == {("state", 0), ("buckets", 0), ("buckets", 1)}
    assert (freshness.caught_up_at(paths[("state", 0)]) or 0) >= before - 0.01  # ms rounded
