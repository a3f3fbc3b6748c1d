"""Key-value state behind the index, the template counts and the clusters.

Two implementations of one small protocol: ``MemoryKV`` for tests and ``RocksKV``
(RocksDB through rocksdict) for the command line. A format marker written beside
the data records the engine parameters; opening state made with other parameters
is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, cast

from neardup import __version__
from neardup.config import EngineConfig

#: Bump when the byte layout of keys or values changes.
FORMAT_VERSION = 1
MARKER_KEY = b"\x00marker"


class StateError(RuntimeError):
    """The state on disk was written with other engine parameters or format."""


class KV(Protocol):
    """Byte keys to byte values, read and written in batches."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None: ...

    def delete_many(self, keys: Iterable[bytes]) -> None: ...

    def delete_prefix(self, prefix: bytes) -> None: ...

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        """Deletes the keys under ``prefixes``, then puts (a value) and deletes (None), in
        order; one atomic batch where the store has them."""

    def close(self) -> None: ...


class MemoryKV:
    """A dict. For tests and for short runs without ``--state``.

    Once a prefix at least ``GROUP`` bytes long is deleted (a kind and an 8-byte id: the
    template counts of one host), the keys of that kind (first byte) are also grouped by
    their first ``GROUP`` bytes, so that such a delete looks at its group only. The
    template filter's host bound deletes a host's counts on nearly every page once it is
    reached, and a scan of every key then took 7 ms a page at 1,000 hosts. Keys of other
    kinds cost what a dict's do."""

    GROUP = 9

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        #: Kinds (first bytes) grouped, and their keys by their first GROUP bytes.
        self._kinds: set[int] = set()
        self._groups: dict[bytes, set[bytes]] = {}

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self.data.get
        return [get(k) for k in keys]

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The items whose keys start with ``prefix``, in key order (as RocksDB's)."""
        for key in sorted(k for k in self.data if k.startswith(prefix)):
            yield key, self.data[key]

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        if self._kinds:
            self._apply(list(items))
        else:
            self.data.update(items)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self._apply([(k, None) for k in keys])

    def delete_prefix(self, prefix: bytes) -> None:
        self._apply([(k, None) for k in self._under(prefix)])

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        """Deletes the keys under ``prefixes``, then puts (a value) and deletes (None), in
        order."""
        for prefix in prefixes:
            self.delete_prefix(prefix)
        self._apply(records)

    def _under(self, prefix: bytes) -> list[bytes]:
        n = self.GROUP
        if len(prefix) < n:
            return [k for k in self.data if k.startswith(prefix)]
        if prefix[0] not in self._kinds:
            self._kinds.add(prefix[0])
            for k in self.data:
                if k[:1] == prefix[:1]:
                    self._groups.setdefault(k[:n], set()).add(k)
        return [k for k in self._groups.get(prefix[:n], ()) if k.startswith(prefix)]

    def _apply(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        data, kinds = self.data, self._kinds
        if not kinds:
            for k, v in records:
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            return
        groups, n = self._groups, self.GROUP
        for k, v in records:
            grouped = bool(k) and k[0] in kinds
            if v is None:
                if data.pop(k, None) is not None and grouped:
                    group = groups[k[:n]]
                    group.discard(k)
                    if not group:
                        del groups[k[:n]]
            else:
                if grouped and k not in data:
                    groups.setdefault(k[:n], set()).add(k)
                data[k] = v

    def close(self) -> None:
        pass


class SharedMemory:
    """One memory budget for all the RocksDB stores of a process that are given it: one
    block cache, into which their memtables are charged too (RocksDB's write buffer
    manager), so that the process's RocksDB memory stays near ``cache_mb`` whatever the
    number of its stores. A worker has one for its tasks' stores: a cache each would make
    its bound grow with the tasks it owns."""

    #: Memtables, MiB a store: RocksDB's own default is 64 MiB (and up to two).
    WRITE_BUFFER_MB = 16

    def __init__(self, cache_mb: int) -> None:
        from rocksdict import Cache, WriteBufferManager

        if cache_mb < 1:
            raise ValueError(f"the block cache needs at least 1 MiB, not {cache_mb}")
        self.cache_mb = cache_mb
        self.cache = Cache(cache_mb << 20)
        # memtables charged to the cache: their memory is taken from the blocks cached,
        # and once they hold half the budget the store written to flushes one (no stall)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            cache_mb << 19, False, self.cache
        )


class RocksKV:
    """RocksDB through rocksdict, values as raw bytes, writes in one batch per call."""

    #: Bloom filter bits a key in the table files: most reads miss (a bucket, a period
    #: string or a template count no page had yet), and a miss then costs a filter probe
    #: a file instead of a search of its index and data blocks. 10 bits: about 1% false
    #: positives.
    BLOOM_BITS = 10
    #: Block cache, MiB (``cache_mb``): RocksDB's own default is 32 MiB.
    CACHE_MB = 256

    def __init__(
        self,
        path: str,
        cache_mb: int = CACHE_MB,
        *,
        read_only: bool = False,
        shared: SharedMemory | None = None,
    ) -> None:
        """``read_only``: open state that exists, without writing it nor taking its lock (a
        run may be writing it meanwhile); none there is a StateError.

        ``shared``: the block cache and memtable budget of this store, shared with the
        other stores given it (``cache_mb`` is then not used), and memtables of
        ``SharedMemory.WRITE_BUFFER_MB``. None: a block cache of its own and RocksDB's
        default memtables.

        ``cache_mb``: the block cache. It holds the blocks read most recently in this
        process's memory, where a host that reclaims idle page cache (as this project's
        machine does, after about a minute) cannot take them: at 10 million pages, the
        same lookups after 150 s idle took p99 1.222 ms with RocksDB's 32 MiB and 0.215
        ms with 3 GiB (``bench/index.py --idle``)."""
        from rocksdict import AccessType, BlockBasedOptions, Cache, Options, Rdict

        if cache_mb < 1:
            raise ValueError(f"the block cache needs at least 1 MiB, not {cache_mb}")

        if read_only:
            # rocksdict would write a config file into any directory it is given
            if not os.path.isdir(path):
                raise StateError(f"no state at {path}: no such directory")
            if not os.path.isfile(os.path.join(path, "CURRENT")):
                raise StateError(f"no state at {path}: the directory holds no RocksDB data")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:  # a file there, a parent that is a file, no permission
            raise StateError(f"cannot create RocksDB state at {path}: {exc}") from exc
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.increase_parallelism(os.cpu_count() or 1)
        opts.set_max_background_jobs(2)
        table = BlockBasedOptions()
        table.set_bloom_filter(self.BLOOM_BITS, False)  # a full filter per file
        if shared is None:
            table.set_block_cache(Cache(cache_mb << 20))
        else:
            table.set_block_cache(shared.cache)
            opts.set_write_buffer_manager(shared.write_buffers)
            opts.set_write_buffer_size(shared.WRITE_BUFFER_MB << 20)
        opts.set_block_based_table_factory(table)
        self.path = path
        try:
            # the options for the default column family too: given only as the database's,
            # rocksdict takes that family's from the database's options file when the
            # database exists, with no filter policy
            access = AccessType.read_only() if read_only else AccessType.read_write()
            self._db = Rdict(path, opts, column_families={"default": opts}, access_type=access)
        except Exception as exc:  # rocksdict raises a bare Exception for IO errors
            raise StateError(f"cannot open RocksDB state at {path}: {exc}") from exc

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        values = cast("list[bytes | None]", self._db.get(list(keys)))
        return values

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.write(list(items))

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self.write([(k, None) for k in keys])

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        """Deletes the keys under ``prefixes``, then puts (a value) and deletes (None), in
        order, all in one atomic batch."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for prefix in prefixes:
            for key in self._keys_under(prefix):
                batch.delete(key)
        for k, v in records:
            if v is None:
                batch.delete(k)
            else:
                batch.put(k, v)
        self._db.write(batch)

    def delete_prefix(self, prefix: bytes) -> None:
        self.write((), (prefix,))

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The items whose keys start with ``prefix``, in key order."""
        items = cast("Iterator[tuple[bytes, bytes]]", self._db.items(from_key=prefix))
        for key, value in items:
            if not key.startswith(prefix):
                break
            yield key, value

    def _keys_under(self, prefix: bytes) -> Iterator[bytes]:
        """The keys that start with ``prefix``, read from the database, to delete one by
        one: a range tombstone for each host the template filter drops slowed every read
        of the memtable (``bench/hosts.py`` shows it)."""
        for key in cast("Iterator[bytes]", self._db.keys(from_key=prefix)):
            if not key.startswith(prefix):
                break
            yield key

    def close(self) -> None:
        self._db.close()

    def estimated_keys(self) -> int:
        """RocksDB's estimate of the keys held (``rocksdb.estimate-num-keys``): cheap, read
        from its table properties and memtables, no scan."""
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    def int_property(self, name: str) -> int | None:
        """One of RocksDB's integer properties (``rocksdb.block-cache-capacity``,
        ``rocksdb.cur-size-all-mem-tables`` ...); None if it has no such property."""
        return self._db.property_int_value(name)

    def approximate_size(self) -> int:
        """Bytes of the files under the state directory."""
        total = 0
        for root, _, files in os.walk(self.path):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        return total


def check_marker(kv: KV, cfg: EngineConfig, where: str) -> None:
    """Write the format marker into fresh state, or refuse state made with other parameters."""
    (raw,) = kv.get_many([MARKER_KEY])
    want = {"format": FORMAT_VERSION, "params": cfg.index_marker()}
    if raw is None:
        kv.put_many([(MARKER_KEY, json.dumps({**want, "written_by": __version__}).encode())])
        return
    have = json.loads(raw)
    if have.get("format") != FORMAT_VERSION or have.get("params") != want["params"]:
        raise StateError(
            f"the state at {where} was written with format {have.get('format')} and "
            f"parameters {have.get('params')!r}, but this engine uses format {FORMAT_VERSION} "
            f"and {want['params']!r}. Its fingerprints are not comparable: point --state at "
            f"a new directory (or rerun with the parameters it was made with)."
        )


def open_to_read(path: str, cache_mb: int = RocksKV.CACHE_MB) -> RocksKV:
    """The RocksDB state at ``path``, opened read-only, whatever engine parameters made it
    (reading its records and clusters compares no fingerprints); StateError when there is
    none, or it is not neardup's, or of a format this version does not read."""
    kv = RocksKV(path, cache_mb, read_only=True)
    try:
        (raw,) = kv.get_many([MARKER_KEY])
        if raw is None:
            raise StateError(f"{path} is a RocksDB database, but not neardup state (no marker)")
        have = json.loads(raw).get("format")
        if have != FORMAT_VERSION:
            raise StateError(
                f"the state at {path} was written with format {have}; this neardup "
                f"({__version__}) reads format {FORMAT_VERSION}: read it with the version "
                f"that wrote it ({json.loads(raw).get('written_by')})"
            )
    except BaseException:
        kv.close()
        raise
    return kv


def open_state(path: str | None, cfg: EngineConfig, cache_mb: int = RocksKV.CACHE_MB) -> KV:
    """RocksDB state at ``path`` (checked against ``cfg``; ``cache_mb``: its block cache),
    or memory when ``path`` is None."""
    kv: KV = MemoryKV() if path is None else RocksKV(path, cache_mb)
    try:
        check_marker(kv, cfg, path or "memory")
    except StateError:
        kv.close()
        raise
    return kv


class BufferedKV:
    """Reads through to ``inner``; writes wait in memory until ``commit`` writes them in one
    batch, so that one page's updates land together or not at all.

    Prefix deletes apply before the puts and deletes of the same step, whatever the order
    of the calls: a step never puts a key under a prefix it deletes (the template filter
    deletes a generation it no longer writes, and the counts of a host other than the
    page's). Reads in the step do not see its prefix deletes."""

    _DELETED = b""

    def __init__(self, inner: KV) -> None:
        self.inner = inner
        self._puts: dict[bytes, bytes | None] = {}
        self._prefixes: list[bytes] = []
        self._on_commit: list[Callable[[], None]] = []

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once this step's writes are written; never if it is rolled back.
        ``fn`` must not raise: the step is written by then."""
        self._on_commit.append(fn)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        misses: list[int] = []
        for i, k in enumerate(keys):
            if k in self._puts:
                out.append(self._puts[k])
            else:
                out.append(None)
                misses.append(i)
        if misses:
            for i, v in zip(misses, self.inner.get_many([keys[i] for i in misses]), strict=True):
                out[i] = v
        return out

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self._puts.update(items)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self._puts[k] = None

    def delete_prefix(self, prefix: bytes) -> None:
        self._prefixes.append(prefix)

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], prefixes: Sequence[bytes] = ()
    ) -> None:
        self._prefixes.extend(prefixes)
        self._puts.update(records)

    def commit(self) -> None:
        """Write the step with one ``write`` of the inner store: one atomic batch in
        RocksDB, one journal entry in the worker's state, one table write (and undo
        record) on a partition of the worker's index."""
        if self._puts or self._prefixes:
            self.inner.write(list(self._puts.items()), self._prefixes)
        done = self._on_commit[:]
        self.rollback()
        for fn in done:
            fn()

    def rollback(self) -> None:
        self._puts.clear()
        self._prefixes.clear()
        self._on_commit.clear()

    def close(self) -> None:
        self.rollback()
        self.inner.close()
