"""Contract tests: the RocksDB and in-memory index behave the same."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.config import EngineConfig
from neardup.fingerprint import Fingerprints
from neardup.index import KVIndex, bucket_keys, make_entry, table_masks
from neardup.store import KV, BufferedKV, MemoryKV, RocksKV, StateError, check_marker, open_state

CFG = EngineConfig()


@pytest.fixture(params=["memory", "rocksdb"])
def kv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KV]:
    store: KV = (
        MemoryKV() if request.param == "memory" else RocksKV(str(tmp_path_factory.mktemp("state")))
    )
    yield store
    store.close()


def fps(fp1: int, fp2: int = 0, strings: tuple[int, ...] = ()) -> Fingerprints:
    return Fingerprints(fp1=fp1, fp2=fp2, strings=strings, words=10)


def add(index: KVIndex, pid: int, f: Fingerprints, order: int = 0) -> None:
    index.add(index.lookup(f, order), make_entry(pid, f, order), f)


def flip(x: int, bits: list[int]) -> int:
    for b in bits:
        x ^= 1 << b
    return x


def test_kv_roundtrip_and_prefix_delete(kv: KV) -> None:
    kv.put_many([(b"Ta1", b"1"), (b"Ta2", b"2"), (b"Tb1", b"3")])
    assert kv.get_many([b"Ta1", b"zz", b"Tb1"]) == [b"1", None, b"3"]
    kv.delete_prefix(b"Ta")
    assert kv.get_many([b"Ta1", b"Ta2", b"Tb1"]) == [None, None, b"3"]
    kv.delete_many([b"Tb1"])
    assert kv.get_many([b"Tb1"]) == [None]


_KEYS = st.binary(max_size=13).map(lambda b: bytes(b"abT"[x % 3] for x in b))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "prefix", "write"]), _KEYS)))
def test_memory_kv_is_a_dict_before_and_after_it_groups_keys(ops: list[tuple[str, bytes]]) -> None:
    # MemoryKV groups the keys of a kind once a prefix of 9 bytes or more of it is deleted
    kv, plain = MemoryKV(), {}
    for op, key in ops:
        if op == "put":
            kv.put_many([(key, b"v")])
            plain[key] = b"v"
        elif op == "delete":
            kv.delete_many([key])
            plain.pop(key, None)
        elif op == "prefix":
            kv.delete_prefix(key)
            plain = {k: v for k, v in plain.items() if not k.startswith(key)}
        else:  # a step: the prefix goes first, then a put under it and a delete
            kv.write([(key + b"a", b"w"), (key[:-1], None)], [key])
            plain = {k: v for k, v in plain.items() if not k.startswith(key)}
            plain[key + b"a"] = b"w"
            plain.pop(key[:-1], None)
        assert kv.data == plain
        assert kv.get_many(list(plain)) == list(plain.values())
        grouped = {k for k in plain if k and k[0] in kv._kinds}
        assert set().union(*kv._groups.values()) == grouped


def test_masks_cover_all_bits_and_tables_count() -> None:
    masks = table_masks(CFG)
    assert len(masks) == 4 and all(bin(m).count("1") == 16 for m in masks)
    assert sum(masks) == 2**64 - 1
    wide = CFG.with_overrides(blocks=6)
    assert len(table_masks(wide)) == 20 == wide.tables


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.lists(st.integers(0, 63), max_size=3, unique=True),
    st.sampled_from([4, 5, 6]),
)
def test_every_fingerprint_within_k_shares_a_bucket(fp: int, bits: list[int], blocks: int) -> None:
    cfg = CFG.with_overrides(blocks=blocks)
    masks = table_masks(cfg)
    near = flip(fp, bits)
    assert set(bucket_keys(b"P", fp, masks)) & set(bucket_keys(b"P", near, masks))


def test_bucket_keys_are_pinned() -> None:
    # The keys name stored buckets and route probes to table partitions: they must not
    # change. With 4 blocks and k1 = 3, table t keys on block t alone, counted from the
    # top: the prefix, the table number, then the 64 bits with the other blocks zeroed.
    fp = 0x1111_2222_3333_4444
    assert bucket_keys(b"P", fp, table_masks(CFG)) == [
        b"P\x00" + bytes.fromhex("1111000000000000"),
        b"P\x01" + bytes.fromhex("0000222200000000"),
        b"P\x02" + bytes.fromhex("0000000033330000"),
        b"P\x03" + bytes.fromhex("0000000000004444"),
    ]


def test_lookup_finds_within_k1_and_not_beyond(kv: KV) -> None:
    index = KVIndex(kv, CFG)
    rng = random.Random(1)
    base = rng.getrandbits(64)
    add(index, 1, fps(base, rng.getrandbits(64)))
    add(index, 2, fps(flip(base, [0, 17, 40]), rng.getrandbits(64)))
    add(index, 3, fps(flip(base, [1, 2, 3, 4, 5, 6, 7, 8]), rng.getrandbits(64)))
    found = index.lookup(fps(base, rng.getrandbits(64)), 0)
    assert sorted(int(p) for p in found.near["pid"]) == [1, 2]


def test_dual_threshold_via_secondary(kv: KV) -> None:
    index = KVIndex(kv, CFG)
    a, b = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    add(index, 7, fps(a, b))
    # D1 = 5 (beyond k1, within k2) and D2 = 2: found through the secondary tables
    q = fps(flip(a, [0, 16, 32, 48, 60]), flip(b, [3, 33]))
    assert [int(p) for p in index.lookup(q, 0).near["pid"]] == [7]
    # D1 = 5 and D2 = 5: not a candidate
    q2 = fps(flip(a, [0, 16, 32, 48, 60]), flip(b, [3, 19, 35, 51, 62]))
    assert len(index.lookup(q2, 0).near) == 0


def test_string_postings_count_shared(kv: KV) -> None:
    index = KVIndex(kv, CFG)
    add(index, 1, fps(1, 1, (10, 11, 12, 13)))
    add(index, 2, fps(2**63, 2**62, (12, 13, 99)))
    found = index.lookup(fps(2**40, 2**41, (11, 12, 13)), 0)
    shared = dict(
        zip((int(p) for p in found.shared["pid"]), found.shared_counts.tolist(), strict=True)
    )
    assert shared == {1: 3, 2: 2}


def test_sketches_roundtrip(kv: KV) -> None:
    index = KVIndex(kv, CFG)
    f = Fingerprints(1, 2, (), 5, 3, np.array([1, 2, 3], dtype="<u4").tobytes())
    add(index, 42, f)
    assert index.sketches([42, 43]) == {42: (3, f.sketch)}


def test_full_bucket_stops_growing_and_is_counted(kv: KV) -> None:
    cfg = CFG.with_overrides(bucket_cap=16)
    index = KVIndex(kv, cfg)
    rng = random.Random(3)
    for pid in range(20):
        # same primary fingerprint (one bucket per table), scattered secondary ones
        add(index, pid + 1, fps(0, rng.getrandbits(64)))
    assert index.capped["simhash"] == 4 * 4  # 4 tables, 4 entries over the cap
    assert len(index.lookup(fps(0, 1), 0).near) == 16


def test_retention_hides_and_prunes_old_entries(kv: KV) -> None:
    cfg = CFG.with_overrides(retention_days=1)
    index = KVIndex(kv, cfg)
    day = 86_400_000
    add(index, 1, fps(5, 5, (1, 2)), order=0)
    add(index, 2, fps(5, 5, (1, 2)), order=3 * day)
    found = index.lookup(fps(5, 5, (1, 2)), 3 * day)
    assert [int(p) for p in found.near["pid"]] == [2]
    assert [int(p) for p in found.shared["pid"]] == [2]


def test_marker_refuses_other_parameters(tmp_path: object) -> None:
    path = str(tmp_path)
    open_state(path, CFG).close()
    open_state(path, CFG.with_overrides(ccs_min=0.9)).close()  # decision-only: allowed
    with pytest.raises(StateError, match="new directory"):
        open_state(path, CFG.with_overrides(period_len=12))


def test_marker_on_memory() -> None:
    kv = MemoryKV()
    check_marker(kv, CFG, "memory")
    with pytest.raises(StateError):
        check_marker(kv, CFG.with_overrides(blocks=5), "memory")


def test_buffered_kv_commits_atomically_and_rolls_back() -> None:
    inner = MemoryKV()
    buf = BufferedKV(inner)
    buf.put_many([(b"a", b"1")])
    assert buf.get_many([b"a"]) == [b"1"] and inner.get_many([b"a"]) == [None]
    buf.rollback()
    assert buf.get_many([b"a"]) == [None]
    buf.put_many([(b"a", b"2")])
    buf.commit()
    assert inner.get_many([b"a"]) == [b"2"]


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_buffered_kv_commits_a_step_as_one_write(kind: str, tmp_path: Path) -> None:
    """Prefix deletes, puts and deletes of a step reach the store in one write (one
    atomic RocksDB batch): a crash cannot leave half a page's state."""
    inner = MemoryKV() if kind == "memory" else RocksKV(str(tmp_path / "state"))
    inner.put_many([(b"T\x01old1", b"1"), (b"T\x01old2", b"2"), (b"gone", b"3"), (b"T\x02", b"4")])
    writes: list[tuple[int, int]] = []
    real_write = inner.write

    def counted(records: Any, prefixes: Any = ()) -> None:
        writes.append((len(records), len(prefixes)))
        real_write(records, prefixes)

    inner.write = counted  # type: ignore[method-assign]
    buf = BufferedKV(inner)
    buf.put_many([(b"T\x03new", b"5")])
    buf.delete_many([b"gone"])
    buf.delete_prefix(b"T\x01")
    buf.commit()
    assert writes == [(2, 1)]
    got = inner.get_many([b"T\x01old1", b"T\x01old2", b"gone", b"T\x02", b"T\x03new"])
    assert got == [None, None, None, b"4", b"5"]
    buf.commit()  # nothing pending: no write at all
    assert writes == [(2, 1)]
    inner.close()


def _filter_policy(db_dir: Path) -> str:
    """The filter policy in the options file RocksDB wrote at the database's last open."""
    latest = max(db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    lines = latest.read_text().splitlines()
    return next(
        line.split("=", 1)[1] for line in lines if line.strip().startswith("filter_policy=")
    )


def test_rocks_state_found_on_disk_keeps_its_bloom_filter(tmp_path: Path) -> None:
    # rocksdict opens an existing database's default column family with the options in
    # its options file, no filter policy among them, unless told that family's options
    path = tmp_path / "state"
    kv = RocksKV(str(path))
    kv.put_many([(b"k", b"v")])
    kv.close()
    assert _filter_policy(path) == "bloomfilter"
    kv = RocksKV(str(path))
    try:
        assert kv.get_many([b"k"]) == [b"v"]
        assert _filter_policy(path) == "bloomfilter"
    finally:
        kv.close()


def test_rocks_state_has_the_block_cache_it_is_given_also_when_reopened(tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    for _ in range(2):
        kv = RocksKV(path, cache_mb=48)
        try:
            assert int(kv._db.property_value("rocksdb.block-cache-capacity")) == 48 << 20
        finally:
            kv.close()
    with pytest.raises(ValueError, match="at least 1 MiB"):
        RocksKV(path, cache_mb=0)
