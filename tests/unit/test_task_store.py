"""A task store's format and freshness (``neardup.kafka.taskstate.open_store``), without a
broker: state of another format is refused in one line, the format goes into the
changelog with the task's first commit, and a store away longer than its changelog keeps
tombstones is restored afresh, as long as the brokers say (or Kafka's default)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from neardup import __version__
from neardup.config import EngineConfig
from neardup.flow import codec, storeformat
from neardup.flow.decide import DecideTask
from neardup.flow.messages import Answer, PageRecord
from neardup.flow.pending import ANSWER, Pending, Stored, heard_key
from neardup.flow.upkeep import PROGRESS
from neardup.flow.watermark import key_bytes
from neardup.kafka import topics
from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Config, Record, TaskRunner
from neardup.kafka.taskstate import (
    FORMAT_KEY,
    OFFSET_KEY,
    SOURCE_KEY,
    SYNCED_KEY,
    UNSENT_KEY,
    Overlay,
    StateFormatError,
    items,
    open_store,
    stored_offset,
)
from neardup.store import MemoryKV, RocksKV, StateError
from tests.unit.test_kafka_delivery import Count, Producer

LOG = TopicPartition("app-part-changelog", 0)
SOURCE = f"{LOG.topic}:0".encode()
DAY_MS = 86_400_000
NOW = 1_800_000_000.0
#: ``test_the_stored_layouts_are_the_formats_own``: the bytes of format 2 (messages 2).
STORED_HEX = (
    "0a000000000000000c00000000000000280000000200000012000000040000007031"
    "687474703a2f2f612e6578616d706c652f310707070764"
)
PENDING_HEX = "01000000000000000000000000"  # its answers are kept apart (``HEARD_HEX``)
HEARD_HEX = "4e800000000000000a70316100000000"


class Changelog:
    """A stand-in for the restore's reader: one changelog partition of committed records
    from offset ``begin`` (a compacted log keeps gaps: records carry their offsets)."""

    def __init__(self, records: list[tuple[int, bytes, bytes | None]], end: int) -> None:
        self.records, self.end = records, end
        self.begin = records[0][0] if records else end
        self.pos = 0

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.begin for tp in tps}

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.end for tp in tps}

    def assign(self, tps: list[Any]) -> None:
        pass

    def seek(self, tp: Any, offset: int) -> None:
        self.pos = offset

    async def position(self, tp: Any) -> int:
        return self.pos

    async def getmany(self, tp: Any, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        got = [r for r in self.records if r[0] >= self.pos][:max_records]
        self.pos = got[-1][0] + 1 if got else self.end
        return {tp: [_Rec(o, k, v) for o, k, v in got]}

    def unsubscribe(self) -> None:
        pass


class _Rec:
    def __init__(self, offset: int, key: bytes, value: bytes | None) -> None:
        self.offset, self.key, self.value = offset, key, value


def _open(path: Path, log: Changelog, retention_ms: int | None = None) -> RocksKV:
    return asyncio.run(
        open_store(str(path), LOG, log, delete_retention_ms=retention_ms, clock=lambda: NOW)
    )


def _seed(path: Path, records: list[tuple[bytes, bytes | None]]) -> None:
    kv = RocksKV(str(path))
    kv.write(records)
    kv.close()


def _marker(state: int, messages: int, by: str = "0.0.1") -> bytes:
    return json.dumps({"state": state, "messages": messages, "written_by": by}).encode()


# -- the format ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        (_marker(storeformat.STATE_FORMAT + 1, 1), f"format {storeformat.STATE_FORMAT + 1} "),
        (_marker(storeformat.STATE_FORMAT, 99), "(messages 99)"),
        (None, "no recorded format"),  # state that predates the marker
    ],
)
def test_a_store_of_another_format_is_refused_in_one_line_naming_both(
    tmp_path: Path, marker: bytes | None, said: str
) -> None:
    held: list[tuple[bytes, bytes | None]] = [(b"dpage", b"\x01\x02"), (SOURCE_KEY, SOURCE)]
    if marker is not None:
        held.append((FORMAT_KEY, marker))
    _seed(tmp_path / "part-0", [*held, (OFFSET_KEY, b"4"), (SYNCED_KEY, str(NOW).encode())])
    with pytest.raises(StateFormatError) as caught:
        _open(tmp_path / "part-0", Changelog([(3, b"dpage", b"\x01\x02")], end=4))
    text = str(caught.value)
    assert "\n" not in text
    assert said in text
    assert f"keeps {storeformat.describe(storeformat.current())}" in text
    assert "NEARDUP_APP_ID" in text and str(tmp_path / "part-0") in text
    # refused before the restore: the store is left as it was
    kv = RocksKV(str(tmp_path / "part-0"), read_only=True)
    assert dict(items(kv)) == {b"dpage": b"\x01\x02"}
    kv.close()


@pytest.mark.parametrize("marker", [_marker(storeformat.STATE_FORMAT + 1, 1), None])
def test_a_changelog_of_another_format_is_refused_when_restored(
    tmp_path: Path, marker: bytes | None
) -> None:
    records: list[tuple[int, bytes, bytes | None]] = [(1, b"dpage", b"x")]
    if marker is not None:
        records.insert(0, (0, FORMAT_KEY, marker))
    with pytest.raises(StateFormatError, match="NEARDUP_APP_ID"):
        _open(tmp_path / "part-0", Changelog(records, end=2))


def test_a_new_store_sends_its_format_with_its_first_commit_even_after_an_abort(
    tmp_path: Path,
) -> None:
    store = _open(tmp_path / "new", Changelog([], end=0))
    assert store.get_many([FORMAT_KEY]) == [storeformat.marker()]
    producer = Producer(store)
    cfg = Config(bootstrap="-", app="app", topics=("in",), state_dir="-")
    inp = TopicPartition("in", 0)
    runner = TaskRunner(Task("part-0", (inp,), LOG), lambda task: Count(), cfg, producer)
    runner.kv = Overlay(store, clock=lambda: NOW + 5)
    runner.committed, runner.next = {inp: 0}, {inp: 0}
    assert runner.pending  # the marker alone makes the task commit
    runner.kv.put_many([(b"k", b"1")])
    runner.kv.drop()  # an aborted step
    assert runner.kv.dirty == {FORMAT_KEY: storeformat.marker()}
    records = [Record("in", 0, 0, b"k0", b"v", 0)]
    runner.step.on_records(records, runner.kv, runner.out)
    runner.stepped(records)
    asyncio.run(runner.commit("app"))
    sent = [kv for c in producer.calls if c[:2] == ("batch", LOG.topic) for kv in c[3]]
    assert (FORMAT_KEY, storeformat.marker()) in sent
    assert store.get_many([UNSENT_KEY, SYNCED_KEY]) == [None, b"%.3f" % (NOW + 5)]
    assert Overlay(store).dirty == {}  # sent once
    store.close()
    # a store restored from that changelog alone has the format, and nothing to send
    log = Changelog([(100 + i, k, v) for i, (k, v) in enumerate(sent)], end=100 + len(sent))
    again = _open(tmp_path / "restored", log)
    assert again.get_many([FORMAT_KEY, UNSENT_KEY]) == [storeformat.marker(), None]
    assert dict(items(again)) == {b"k0": b"1"} and Overlay(again).dirty == {}
    again.close()


def test_a_store_of_this_format_opens_again(tmp_path: Path) -> None:
    _open(tmp_path / "s", Changelog([], end=0)).close()
    log = Changelog([(0, FORMAT_KEY, storeformat.marker()), (1, b"a", b"1")], end=2)
    store = _open(tmp_path / "s", log)
    assert dict(items(store)) == {b"a": b"1"} and stored_offset(store) == (SOURCE.decode(), 2)
    store.close()


# -- freshness -----------------------------------------------------------------------------


def _away(tmp_path: Path, synced: float | None) -> Path:
    """A store that held ``a`` and ``b`` at changelog offset 3, in step at ``synced``; the
    changelog then deleted ``a`` and compaction removed the tombstone."""
    path = tmp_path / "part-0"
    held = [(FORMAT_KEY, storeformat.marker()), (b"a", b"1"), (b"b", b"2")]
    held += [(SOURCE_KEY, SOURCE), (OFFSET_KEY, b"3")]
    if synced is not None:
        held.append((SYNCED_KEY, b"%.3f" % synced))
    _seed(path, held)
    return path


def _compacted() -> Changelog:
    # offsets 0-2: marker, a, b; 3: b again; 4: a's tombstone, compacted away
    return Changelog([(0, FORMAT_KEY, storeformat.marker()), (3, b"b", b"3")], end=5)


def test_a_store_away_longer_than_the_tombstones_are_kept_is_restored_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="neardup.kafka")
    path = _away(tmp_path, synced=NOW - 2 * DAY_MS / 1000)
    store = _open(path, _compacted(), retention_ms=DAY_MS)
    assert dict(items(store)) == {b"b": b"3"}  # a's deletion is not missed
    assert store.get_many([SYNCED_KEY]) == [b"%.3f" % NOW]
    store.close()
    said = [r for r in caplog.records if "rebuilding it from the changelog" in r.message]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "delete.retention.ms (86400 s)" in said[0].message


def test_without_the_retention_the_same_store_keeps_a_deleted_key(tmp_path: Path) -> None:
    """What the check prevents: caught up from its offset, the store keeps ``a``."""
    store = _open(_away(tmp_path, synced=NOW - 2 * DAY_MS / 1000), _compacted())
    assert dict(items(store)) == {b"a": b"1", b"b": b"3"}
    store.close()


def test_a_store_back_within_the_retention_catches_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="neardup.kafka")
    path = _away(tmp_path, synced=NOW - 3600)
    log = Changelog([(0, FORMAT_KEY, storeformat.marker()), (3, b"b", b"3"), (4, b"a", None)], 5)
    store = _open(path, log, retention_ms=DAY_MS)
    assert dict(items(store)) == {b"b": b"3"} and stored_offset(store)[1] == 5
    store.close()
    assert "rebuilding" not in caplog.text


def test_a_store_never_caught_up_is_restored_afresh_when_the_retention_is_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="neardup.kafka")
    store = _open(_away(tmp_path, synced=None), _compacted(), retention_ms=DAY_MS)
    assert dict(items(store)) == {b"b": b"3"}
    store.close()
    assert "was never caught up with its changelog" in caplog.text


def test_each_commit_records_when_the_store_was_in_step(tmp_path: Path) -> None:
    store = RocksKV(str(tmp_path / "s"))
    now = [NOW]
    kv = Overlay(store, clock=lambda: now[0])
    kv.flush(None)  # a commit without changelog records: still in step
    assert store.get_many([SYNCED_KEY]) == [b"%.3f" % NOW]
    now[0] += 60
    kv.put_many([(b"a", b"1")])
    kv.flush(8)
    assert store.get_many([SYNCED_KEY, OFFSET_KEY]) == [b"%.3f" % (NOW + 60), b"8"]
    store.close()


def test_the_marker_names_this_version() -> None:
    found = storeformat.read_marker(storeformat.marker())
    assert storeformat.fits(found) and found["written_by"] == __version__
    assert not storeformat.fits(storeformat.read_marker(b"not json"))
    assert storeformat.describe(None) == "no recorded format"


# -- a stored value that does not unpack ---------------------------------------------------


def _stored() -> Stored:
    return Stored(PageRecord("p1", "http://a.example/1", 10, 40, b"\x07" * 16), b"")


@pytest.mark.parametrize("cut", [3, 30, -1])
def test_a_stored_page_record_that_does_not_unpack_is_a_state_error(cut: int) -> None:
    raw = _stored().pack()
    assert Stored.unpack(raw) == _stored()
    with pytest.raises(StateError, match=r"stored page record .* does not unpack"):
        Stored.unpack(raw[:cut])


@pytest.mark.parametrize(
    "raw",
    [
        b"\x01\x02",  # shorter than its head
        Pending(asked=2, drop=1).pack() + b"\x00",  # bytes after its messages
        Pending(asked=2).pack()[:-1] + b"\x01",  # an edge flagged, none held
        Pending(answers=[]).pack()[:9] + b"\x01\x00\x00\x00" + b"\x00",  # a message cut short
    ],
)
def test_a_pending_page_that_does_not_unpack_is_a_state_error(raw: bytes) -> None:
    with pytest.raises(StateError, match=r"stored pending page .* does not unpack") as caught:
        Pending.unpack(None, raw)
    assert "docs/kafka.md, Upgrading" in str(caught.value)


def test_a_decide_task_over_a_damaged_pending_page_stops_rather_than_replays() -> None:
    """The step raises ``StateError``, which the runtime does not replay: it stops the
    worker with the error's one line (``neardup.kafka.runtime``)."""
    kv = MemoryKV()
    kv.put_many([(PROGRESS + key_bytes((10, "p1")), b"\x01\x02\x03")])
    with pytest.raises(StateError):
        DecideTask(kv, EngineConfig(extract_timeout_s=0), 0, 1)


# -- the changelogs' delete.retention.ms ---------------------------------------------------


class _Described:
    def __init__(self, resources: list[tuple[Any, ...]]) -> None:
        self.resources = resources


class _Admin:
    def __init__(self, answer: list[_Described] | Exception) -> None:
        self.answer = answer

    async def describe_configs(self, resources: list[Any]) -> list[_Described]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _retention(monkeypatch: pytest.MonkeyPatch, admin: _Admin) -> dict[str, int]:
    @contextlib.asynccontextmanager
    async def client(settings: Any, timeout_s: float) -> AsyncIterator[_Admin]:
        yield admin

    monkeypatch.setattr(topics, "admin_client", client)
    names = SimpleNamespace(
        analyse_changelog="a-analyse-changelog",
        part_changelog="a-part-changelog",
        order_changelog="a-order-changelog",
    )
    return asyncio.run(topics.delete_retention(SimpleNamespace(), names))  # type: ignore[arg-type]


def test_each_changelogs_retention_is_read_and_kafkas_default_taken_where_denied(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    entry = ("delete.retention.ms", "3600000", False, 1, False, [])
    described = [
        (
            0,
            "",
            2,
            "a-analyse-changelog",
            [("cleanup.policy", "compact", False, 1, False, []), entry],
        ),
        (29, "Topic authorization failed", 2, "a-part-changelog", []),
        (0, "", 2, "a-order-changelog", [("delete.retention.ms", "7200000", False, 5, False, [])]),
    ]
    got = _retention(monkeypatch, _Admin([_Described(described)]))
    default = topics.DEFAULT_DELETE_RETENTION_MS
    assert got == {
        "a-analyse-changelog": 3_600_000,
        "a-part-changelog": default,
        "a-order-changelog": 7_200_000,
    }
    said = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "a-part-changelog" in said[0] and "DescribeConfigs" in said[0]


def test_a_broker_that_describes_nothing_gives_kafkas_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = _retention(monkeypatch, _Admin(KafkaError("ClusterAuthorizationFailed")))
    assert set(got.values()) == {topics.DEFAULT_DELETE_RETENTION_MS} and len(got) == 3


def test_the_stored_layouts_are_the_formats_own() -> None:
    """Pinned bytes of what the decide stage keeps: a change to them without a bump of
    ``STATE_FORMAT`` (or of ``codec.VERSION``) fails here. Bump, then pin the new bytes."""
    stored = Stored(PageRecord("p1", "http://a.example/1", 10, 40, b"\x07" * 4), b"d", 12)
    answer = Answer((10, "p1"), 5, (b"k",), (None,))
    pending = Pending(asked=1, drop=0, answers=[answer])
    got = (storeformat.STATE_FORMAT, codec.VERSION, stored.pack().hex(), pending.pack().hex())
    assert got == (2, 2, STORED_HEX, PENDING_HEX)
    assert heard_key(answer.key, ANSWER, 0).hex() == HEARD_HEX
