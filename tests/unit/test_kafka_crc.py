"""``neardup.kafka.crc``: fetched batches checked with google-crc32c first, aiokafka's own
check kept for any partition where that check does not pass."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from aiokafka.consumer import fetcher
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.structs import TopicPartition

from neardup.kafka import crc

TP = TopicPartition("raw", 0)


def batch(first: int, values: list[bytes], compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=b"k", value=value, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, first)  # the broker sets the base offset
    return bytes(data)


def fetched(data: bytes, check_crcs: bool = True) -> fetcher.PartitionRecords:
    """What aiokafka's fetcher builds of one partition's fetched bytes."""
    records = fetcher.MemoryRecords(data)
    return fetcher.PartitionRecords(
        TP, records, None, 0, None, None, check_crcs, fetcher.READ_UNCOMMITTED
    )


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    """``crc.install`` for one test; aiokafka's own classes back after it."""
    theirs = (fetcher.MemoryRecords, fetcher.PartitionRecords)
    crc.install()
    yield
    fetcher.MemoryRecords, fetcher.PartitionRecords = theirs


def test_batches_that_pass_are_read_without_aiokafkas_own_check() -> None:
    data = batch(0, [b"a" * 3000, b"b"]) + batch(2, [b"c" * 5000])
    assert crc.batches_valid(data)
    part = fetched(data)
    assert part._check_crcs is False
    assert [r.value for r in part] == [b"a" * 3000, b"b", b"c" * 5000]
    assert [r.offset for r in fetched(data)] == [0, 1, 2]


def test_a_corrupt_batch_keeps_aiokafkas_check_which_raises() -> None:
    first = batch(0, [b"a" * 3000])
    data = first + flip(batch(1, [b"b" * 3000]), 200)  # a byte of the second batch's value
    assert not crc.batches_valid(data)
    part = fetched(data)
    assert part._check_crcs is True
    with pytest.raises(CorruptRecordException):
        list(part)


def test_a_corrupt_crc_field_is_caught_too() -> None:
    data = flip(batch(0, [b"a" * 100]), 18)  # inside the CRC itself
    assert not crc.batches_valid(data)
    with pytest.raises(CorruptRecordException):
        list(fetched(data))


def test_with_the_check_off_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(data: bytes) -> bool:
        raise AssertionError("checked although the consumer checks no CRC")

    monkeypatch.setattr(crc, "batches_valid", never)
    data = flip(batch(0, [b"a" * 3000]), 200)
    part = fetched(data, check_crcs=False)
    assert part._check_crcs is False
    assert len([r.value for r in part]) == 1  # read as aiokafka reads it with no check


def test_compressed_batches_are_checked_as_sent() -> None:
    data = batch(0, [b"a" * 3000, b"b" * 3000], compression=1)  # gzip
    assert crc.batches_valid(data)
    part = fetched(data)
    assert part._check_crcs is False
    assert [r.value for r in part] == [b"a" * 3000, b"b" * 3000]
    corrupt = flip(data, len(data) - 10)  # inside the compressed records
    assert not crc.batches_valid(corrupt)
    with pytest.raises(CorruptRecordException):
        list(fetched(corrupt))


def test_a_batch_cut_short_at_the_end_is_left_as_aiokafka_leaves_it() -> None:
    whole = batch(0, [b"a" * 100])
    data = whole + batch(1, [b"b" * 4000])[:1000]  # the fetch's size limit
    assert crc.batches_valid(data)
    assert [r.value for r in fetched(data)] == [b"a" * 100]
    assert crc.batches_valid(whole[:15])  # not even a whole head
    assert crc.batches_valid(b"")


def test_an_older_format_keeps_aiokafkas_check() -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"v")
    data = bytes(builder.build())
    assert not crc.batches_valid(data)
    part = fetched(data)
    assert part._check_crcs is True
    assert [r.value for r in part] == [b"v"]


def test_install_is_done_once() -> None:
    classes = (fetcher.MemoryRecords, fetcher.PartitionRecords)
    assert fetcher.PartitionRecords.neardup_crc
    crc.install()
    assert (fetcher.MemoryRecords, fetcher.PartitionRecords) == classes


def test_nothing_is_installed_without_the_c_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = (fetcher.MemoryRecords, fetcher.PartitionRecords)
    theirs = (fetcher.MemoryRecords.__mro__[1], fetcher.PartitionRecords.__mro__[1])
    fetcher.MemoryRecords, fetcher.PartitionRecords = theirs
    monkeypatch.setattr(crc.google_crc32c, "implementation", "python")
    crc.install()
    assert (fetcher.MemoryRecords, fetcher.PartitionRecords) == theirs != ours
