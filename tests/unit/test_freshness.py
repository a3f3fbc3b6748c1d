"""Local table partitions too old to catch up from their changelogs (``worker.kafka.freshness``)."""

from __future__ import annotations

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


def test_without_a_readable_stamp_the_files_mtimes_say_when(tmp_path: Path) -> None:
    path = tmp_path / "state-0.db"
    assert freshness.caught_up_at(path) is None  # no database: nothing to judge
    _db(path)
    for f in path.rglob("*"):
        os.utime(f, (5_000.0, 5_000.0))
    assert freshness.caught_up_at(path) == 5_000.0
    (path / freshness.STAMP).write_text("not a time\n")  # a torn or foreign file
    os.utime(path / freshness.STAMP, (4_000.0, 4_000.0))
    assert freshness.caught_up_at(path) == 5_000.0


@pytest.mark.parametrize(("age_h", "removed"), [(11.9, False), (12.1, True)])
def test_a_database_is_removed_past_half_the_tombstone_retention(
    tmp_path: Path, age_h: float, removed: bool
) -> None:
    path = tmp_path / "buckets-3.db"
    _db(path)
    freshness.stamp(path, 100_000.0)
    day = freshness.max_age_s(24 * 3600 * 1000)
    assert freshness.discard_if_stale(path, day, now=100_000.0 + age_h * 3600) == removed
    assert path.exists() != removed


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


def test_faust_opens_a_stale_partition_empty_and_forgets_its_cached_offset(
    tmp_path: Path,
) -> None:
    """A partition held by another worker for days and assigned back: its database is
    removed before Faust opens it (so Faust restores it whole), and the changelog offset
    the worker had cached for it is read afresh."""
    faustfix.fresh_opens()
    changelog = Changelog(SimpleNamespace())
    table = object()
    paths = {0: tmp_path / "state-0.db", 1: tmp_path / "state-1.db"}
    for p, path in paths.items():
        _db(path)
        freshness.stamp(path, time.time() - (freshness.MAX_AGE_S + 60 if p == 0 else 60))
        changelog._persisted[(table, p)] = 41
    store: Any = SimpleNamespace(
        partition_path=paths.__getitem__,
        app=SimpleNamespace(neardup_changelog=changelog),
        table=table,
        read_only=False,
        rocksdb_options=SimpleNamespace(
            open=lambda path, read_only: Rdict(str(path), Options(raw_mode=True))
        ),
    )
    stale, fresh = Store._open_for_partition(store, 0), Store._open_for_partition(store, 1)
    try:
        assert stale.get(b"k0") is None  # restored from the changelog next
        assert fresh.get(b"k0") == b"v" * 100  # catches up from its persisted offset
    finally:
        stale.close()
        fresh.close()
    assert changelog._persisted == {}


def test_the_worker_stamps_what_it_holds_except_standbys_still_behind(tmp_path: Path) -> None:
    paths = {(t, p): tmp_path / f"{t}-{p}.db" for t in ("state", "buckets") for p in (0, 1)}
    for path in paths.values():
        _db(path)

    def table(name: str, partitions: list[int]) -> Any:
        store = SimpleNamespace(
            _dbs=dict.fromkeys(partitions), partition_path=lambda p: paths[(name, p)]
        )
        topic = SimpleNamespace(get_topic_name=lambda: f"nd-{name}-changelog")
        return SimpleNamespace(data=store, changelog_topic=topic)

    behind = {TP("nd-buckets-changelog", 1): 7, TP("nd-state-changelog", 0): 0}
    recovery = SimpleNamespace(standby_remaining=lambda: behind)
    tables = {"state": table("state", [0]), "buckets": table("buckets", [0, 1])}
    worker: Any = SimpleNamespace(
        app=SimpleNamespace(tables=SimpleNamespace(recovery=recovery, values=tables.values))
    )
    before = time.time()
    assert Worker.stamp_tables(worker) == 2
    stamped = {k for k, path in paths.items() if (path / freshness.STAMP).exists()}
    assert stamped == {("state", 0), ("buckets", 0)}  # state-1 is not held here
    assert (freshness.caught_up_at(paths[("state", 0)]) or 0) >= before - 0.01  # ms rounded
