"""One memory budget for the RocksDB databases of the worker's tables.

Faust opens a RocksDB database for each table partition a worker holds, active or
standby, and gives each its own options (``faust.stores.rocksdb`` defaults): a block
cache of 2 GiB and up to three memtables of 64 MiB. A worker that holds the state table
and N partitions of the buckets and of the sketches has 2N + 1 of them, so its memory
grows with its state towards (2N + 1) x 2.2 GiB, far past any container limit, and
never levels off where the operator can see it coming.

``bound`` gives every database the worker opens one shared block cache of
``memory_bytes`` and one write buffer manager that charges their memtables to that
cache (RocksDB's way of keeping "memtables + block cache under a single limit"). Each
memtable is at most ``MEMTABLE_BYTES``: small enough that one database cannot take the
whole write budget before a flush. Bloom filters and the index type stay as Faust set
them. Reads past the cache go to the files, through the operating system's page cache,
which the kernel can reclaim.

Every database is opened with these options for its default column family, given as
such (``open``; ``open_outside`` for the undo pass at start, before Faust). Given only as
the database's options, rocksdict (0.3.29) takes the column family's from the database's
own options file when it exists, with a block cache of 8 MiB and no filter policy: a
worker that found its tables on disk (a restart, a partition that came back) read them
with a cache of their own outside the budget, and without bloom filters, and the undo
pass flushed the log it replayed into table files without a filter.

Only the worker's tables (Faust's store) are bounded here; ``neardup dedup --state``
opens a single database (``neardup.store.RocksKV``) with options of its own.
"""

from __future__ import annotations

from typing import Any

from neardup.kafka.faustfix import _once

#: The most one table partition's memtable may hold before it is flushed.
MEMTABLE_BYTES = 16 << 20

_budget: dict[str, Any] = {}


def bound(memory_bytes: int) -> None:
    """Make every RocksDB database Faust opens from now on in this process share one
    block cache of ``memory_bytes``, their memtables counted in it."""
    import rocksdict
    from faust.stores import rocksdb as faust_rocksdb

    cache = rocksdict.Cache(memory_bytes)
    manager = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
        memory_bytes // 2, False, cache
    )
    _budget.update(cache=cache, manager=manager, bytes=memory_bytes)
    cls = faust_rocksdb.RocksDBOptions
    original = cls.as_options

    def as_options(self: Any) -> Any:
        options = original(self)
        if not (self.use_rocksdict and _budget):
            return options
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_filter_size, True)
        table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        table.set_block_cache(_budget["cache"])
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(_budget["manager"])
        options.set_write_buffer_size(min(int(self.write_buffer_size), MEMTABLE_BYTES))
        return options

    _once(cls, "as_options", as_options)  # a later call only changes ``_budget``
    faust_open = cls.open

    def open_db(self: Any, path: Any, *, read_only: bool = False) -> Any:
        if not self.use_rocksdict:
            return faust_open(self, path, read_only=read_only)
        return _open(self, path)

    _once(cls, "open", open_db)


def open_outside(path: Any) -> Any:
    """A table partition's database opened outside Faust (before it starts), with the
    options Faust would give it, for its default column family too."""
    from faust.stores.rocksdb import RocksDBOptions

    return _open(RocksDBOptions(use_rocksdict=True), path)


def _open(config: Any, path: Any) -> Any:
    """Faust's ``RocksDBOptions.open`` (rocksdict) for ``config``, a ``RocksDBOptions``, with
    the options given for the default column family too (see the module's docstring)."""
    import rocksdict

    options = config.as_options()
    access = (
        rocksdict.AccessType.read_write()
        if config.ttl is None
        else rocksdict.AccessType.with_ttl(config.ttl)
    )
    db = rocksdict.Rdict(
        str(path), options=options, column_families={"default": options}, access_type=access
    )
    db.set_read_options(rocksdict.ReadOptions())
    return db


def usage() -> tuple[int, int] | None:
    """Bytes the shared cache holds now (blocks and memtables), and its capacity; None
    when ``bound`` was not called."""
    if not _budget:
        return None
    return int(_budget["cache"].get_usage()), int(_budget["bytes"])
