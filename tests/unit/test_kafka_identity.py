"""Local tables that do not belong to the brokers' topics are discarded before Faust starts
(``neardup.kafka.identity``); and Faust's ConsistencyError, should one still come, is said
in one line that does not promise what a restart cannot do."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from neardup.kafka import identity
from neardup.kafka.__main__ import fatal_message
from neardup.kafka.identity import Brokers, persisted_offsets, stale_reason
from neardup.kafka.undo import OFFSET_KEY
from neardup.settings import Settings

APP = "app"
STATE = (f"{APP}-state-changelog", 0)


def _table(tabledir: Path, name: str, offset: int | None) -> Path:
    """A table partition's database as Faust leaves it: its items and, if it has applied
    any of its changelog, the offset it reached."""
    path = tabledir / name
    db = Rdict(str(path), Options(raw_mode=True))
    db[b"some-key"] = b"some value"
    if offset is not None:
        db[OFFSET_KEY] = str(offset).encode()
    db.close()
    return path


def test_the_offsets_the_local_tables_applied_are_read_per_changelog_partition(
    tmp_path: Path,
) -> None:
    _table(tmp_path, "state-0.db", 41)
    _table(tmp_path, "buckets-3.db", 7)
    _table(tmp_path, "sketches-1.db", None)  # restored nothing yet: nothing to compare
    (tmp_path / "sketches-2.db").mkdir()  # made for a restore not begun: no database yet
    got = persisted_offsets(str(tmp_path), APP)
    assert got == {STATE: 41, (f"{APP}-buckets-changelog", 3): 7}
    assert persisted_offsets(str(tmp_path / "absent"), APP) == {}


@pytest.mark.parametrize(
    ("marker", "brokers", "persisted", "why"),
    [
        # the README's recipe run twice: kafka-local.sh stop deleted the broker's data
        ({"cluster_id": "old"}, Brokers("new", {STATE: 100}), {STATE: 9}, "cluster old"),
        ({"app_id": "other"}, Brokers("c", {STATE: 100}), {STATE: 9}, "NEARDUP_APP_ID=other"),
        # the changelog deleted and made again: it ends before what the table applied
        ({"cluster_id": "c"}, Brokers("c", {STATE: 5}), {STATE: 9}, "ends before offset 5"),
        ({"cluster_id": "c"}, Brokers("c", {STATE: 9}), {STATE: 9}, "ends before offset 9"),
        ({}, Brokers("c", {}), {STATE: 9}, "does not exist"),  # a state from before markers
    ],
)
def test_tables_built_on_other_topics_are_stale(
    marker: dict[str, str], brokers: Brokers, persisted: dict[tuple[str, int], int], why: str
) -> None:
    reason = stale_reason(marker, brokers, APP, persisted)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    ("marker", "brokers", "persisted"),
    [
        ({"cluster_id": "c", "app_id": APP}, Brokers("c", {STATE: 10}), {STATE: 9}),
        ({}, Brokers("c", {STATE: 10}), {STATE: 9}),
        ({"cluster_id": "c"}, Brokers("c", {}), {}),  # no table has applied anything
    ],
)
def test_tables_behind_their_changelogs_on_the_same_cluster_are_kept(
    marker: dict[str, str], brokers: Brokers, persisted: dict[tuple[str, int], int]
) -> None:
    assert stale_reason(marker, brokers, APP, persisted) is None


def test_stale_tables_are_discarded_once_with_one_line_and_the_marker_follows_the_brokers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    tables = state / "v1" / "tables"
    tables.mkdir(parents=True)
    _table(tables, "state-0.db", 9)
    brokers = {"now": Brokers("cluster-a", {STATE: 10})}

    async def read_brokers(settings: Settings, tps: list[tuple[str, int]]) -> Brokers:
        assert tps == [STATE]  # asks only of the changelog partitions of local tables
        return brokers["now"]

    monkeypatch.setattr(identity, "read_brokers", read_brokers)
    settings = Settings(app_id=APP, state_dir=str(state))
    with caplog.at_level(logging.WARNING, "neardup.kafka"):
        assert identity.rebuild_if_stale(settings, str(tables)) is None  # first start
        assert (tables / "state-0.db").is_dir()
        assert identity.read_marker(str(state)) == {"cluster_id": "cluster-a", "app_id": APP}
        brokers["now"] = Brokers("cluster-b", {STATE: 10})  # a new broker, refilled past 9
        reason = identity.rebuild_if_stale(settings, str(tables))
    assert reason is not None and "cluster-a" in reason and "cluster-b" in reason
    assert not tables.exists()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "discarding them" in said[0] and "\n" not in said[0]
    assert identity.read_marker(str(state))["cluster_id"] == "cluster-b"


def test_a_marker_that_cannot_be_read_counts_as_none(tmp_path: Path) -> None:
    (tmp_path / identity.MARKER).write_text("{torn")
    assert identity.read_marker(str(tmp_path)) == {}
    (tmp_path / identity.MARKER).write_text('["a list"]')
    assert identity.read_marker(str(tmp_path)) == {}


def test_a_consistency_error_is_one_line_that_promises_no_restart_it_cannot_keep() -> None:
    from faust.exceptions import ConsistencyError
    from faust.tables.recovery import E_PERSISTED_OFFSET

    exc = ConsistencyError(E_PERSISTED_OFFSET.format("TP(topic='a-state-changelog')", 153, -1))
    line = fatal_message(exc, "/var/lib/neardup")
    assert "\n" not in line and "(153 > -1)" in line
    assert "discarded and rebuilt" in line and "Most likely" not in line
    # what it says of other errors, which a restart does help with
    assert "read again at the next start" not in line
    assert "read again at the next start" in fatal_message(RuntimeError("x"), "/s")
