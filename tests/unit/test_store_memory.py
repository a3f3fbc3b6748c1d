"""The memory of a process's RocksDB stores given one ``SharedMemory``: one block cache
for all of them, and their memtables held to one budget, whatever the number of stores."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neardup.store import RocksKV, SharedMemory

MIB = 1 << 20


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SharedMemory, list[RocksKV]]]:
    """Two stores on one 16 MiB budget, and one with a cache of its own."""
    memory = SharedMemory(16)
    opened = [
        RocksKV(str(tmp_path / "a"), shared=memory),
        RocksKV(str(tmp_path / "b"), shared=memory),
        RocksKV(str(tmp_path / "own"), 32),
    ]
    yield memory, opened
    for kv in opened:
        kv.close()


def capacity(kv: RocksKV) -> int | None:
    return kv.int_property("rocksdb.block-cache-capacity")


def test_stores_given_one_memory_share_its_block_cache(
    stores: tuple[SharedMemory, list[RocksKV]],
) -> None:
    memory, (a, b, own) = stores
    assert [capacity(a), capacity(b), capacity(own)] == [16 * MIB, 16 * MIB, 32 * MIB]
    # the one cache, not a copy of its size: a change to it is seen by both stores
    memory.cache.set_capacity(4 * MIB)
    assert [capacity(a), capacity(b), capacity(own)] == [4 * MIB, 4 * MIB, 32 * MIB]


def test_memtables_are_charged_to_the_shared_budget(
    stores: tuple[SharedMemory, list[RocksKV]],
) -> None:
    memory, (a, b, own) = stores
    used = [memory.write_buffers.get_usage()]
    for kv in (a, b, own):
        kv.put_many([(b"%d" % i, b"v" * 1000) for i in range(1000)])
        used.append(memory.write_buffers.get_usage())
    assert used[1] > used[0] and used[2] > used[1], used  # both stores' writes count
    assert used[3] == used[2], used  # a store with memory of its own is not charged


def test_memtables_stay_within_the_budget(
    stores: tuple[SharedMemory, list[RocksKV]],
) -> None:
    """24 MiB written, 12 to each store: under each store's write buffer, so RocksDB alone
    would flush neither; the budget (half the 16 MiB) makes them flush."""
    memory, (a, b, _) = stores
    value = b"v" * 1024
    for n in range(12 * 1024 // 256):
        for kv in (a, b):
            kv.put_many([(b"%06d-%d" % (n, i), value) for i in range(256)])

    def memtables() -> int:
        return sum(kv.int_property("rocksdb.cur-size-all-mem-tables") or 0 for kv in (a, b))

    # the budget, and an arena block (an eighth of the write buffer) a store beyond it
    bound = memory.cache_mb * MIB // 2 + 2 * (SharedMemory.WRITE_BUFFER_MB * MIB // 8)
    deadline = time.monotonic() + 10  # flushes run in the background
    while memtables() > bound and time.monotonic() < deadline:
        time.sleep(0.05)
    assert memtables() <= bound, (memtables(), bound)
    # nothing lost to the flushes
    assert a.get_many([b"000000-0", b"%06d-255" % (12 * 1024 // 256 - 1)]) == [value, value]
