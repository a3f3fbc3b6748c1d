"""``neardup.kafka.rocksmem``: every RocksDB database Faust opens for the worker's tables
shares one bounded block cache, their memtables charged to it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from faust.stores.rocksdb import RocksDBOptions

from neardup.kafka import rocksmem

MIB = 1 << 20


@pytest.fixture
def bounded() -> Iterator[None]:
    rocksmem.bound(64 * MIB)
    yield
    rocksmem._budget.clear()  # Faust's own options again for the rest of the process


def test_the_table_databases_share_one_cache_that_counts_their_memtables(
    bounded: None, tmp_path: Path
) -> None:
    options = RocksDBOptions(use_rocksdict=True)
    dbs = [options.open(tmp_path / f"partition-{i}") for i in range(3)]
    try:
        usage = rocksmem.usage()
        assert usage is not None and usage[1] == 64 * MIB
        before = usage[0]
        for i in range(30_000):  # about 2 MiB into each database's memtable
            dbs[i % 3][os.urandom(16)] = os.urandom(200)
        after = rocksmem.usage()
        assert after is not None and after[0] >= before + 4 * MIB
    finally:
        for db in dbs:
            db.close()


def test_without_a_bound_faust_keeps_its_own_options(tmp_path: Path) -> None:
    assert rocksmem.usage() is None
    db = RocksDBOptions(use_rocksdict=True).open(tmp_path / "partition-0")
    db[b"k"] = b"v"
    assert db[b"k"] == b"v"
    db.close()


def test_a_database_found_on_disk_gets_the_shared_cache_and_a_filter(
    bounded: None, tmp_path: Path
) -> None:
    # rocksdict opens an existing database's default column family with the options in
    # its options file (a cache of 8 MiB, no filter) unless told that family's options
    path = tmp_path / "partition-0"
    options = RocksDBOptions(use_rocksdict=True)
    db = options.open(path)
    db[b"k"] = b"v"
    db.close()
    db = options.open(path)
    try:
        assert db[b"k"] == b"v"
        assert int(db.property_value("rocksdb.block-cache-capacity")) == 64 * MIB
        usage = rocksmem.usage()  # the budget's cache itself, not one of the same size
        assert usage is not None
        assert int(db.property_value("rocksdb.block-cache-usage")) == usage[0]
        latest = max(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
        assert "filter_policy=bloomfilter" in latest.read_text()
    finally:
        db.close()
