"""The fingerprint index: SimHash block tables and period-string postings over a KV.

Block tables (Manku, Jain and Das Sarma 2007): the 64 bits are cut into ``blocks``
blocks. Two fingerprints within Hamming distance k differ in at most k blocks, so they
agree exactly on at least ``blocks - k`` of them. Each choice of ``blocks - k`` blocks is
one table, keyed by the fingerprint's bits in those blocks; a query reads one bucket per
table and keeps the fingerprints within distance. 4 blocks and k = 3 give 4 tables of 16
bits; 6 blocks give C(6, 3) = 20 tables of 32 bits, for billions of pages.

A bucket is one value: packed ``ENTRY`` records. Each entry carries what a decision needs
(both fingerprints, the number of period strings, the page's order), so deciding a page
reads no other page's record. Buckets stop growing at ``bucket_cap`` entries: later pages
are not added to a full bucket (they stay findable through their other buckets), and a
full period-string bucket is taken as too common to be evidence of containment.

Short pages (at most ``exact_shingles`` distinct 5-grams) are also posted under the
``minhash_keys`` smallest hashes of their 5-grams: a short text lightly edited can move
its SimHash far and change every sentence ending, but two texts of resemblance J share
the smallest hash with probability J, so two of eight is a candidate (Broder's bottom-k
as an index; for J >= 0.5 it finds more than 99 pairs in 100).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from neardup.config import EngineConfig
from neardup.facts import with_facts
from neardup.fingerprint import Fingerprints
from neardup.store import KV

ENTRY = np.dtype([("pid", "<u8"), ("fp1", "<u8"), ("fp2", "<u8"), ("order", "<i8"), ("n", "<u4")])
Entries = npt.NDArray[np.void]

_SIM_PRIMARY = b"P"
_SIM_SECONDARY = b"S"
_STRINGS = b"C"
_MINHASH = b"B"
_SKETCH = b"K"
_SHINGLES = struct.Struct("<I")
_DAY_MS = 86_400_000


def make_entry(pid: int, fps: Fingerprints, order: int) -> Entries:
    return np.array([(pid, fps.fp1, fps.fp2, order, len(fps.strings))], dtype=ENTRY)


def table_masks(cfg: EngineConfig) -> list[int]:
    """One 64-bit mask per table: the bits of the ``blocks - k1`` blocks it keys on."""
    sizes = [64 // cfg.blocks + (1 if i < 64 % cfg.blocks else 0) for i in range(cfg.blocks)]
    block_masks, shift = [], 64
    for size in sizes:
        shift -= size
        block_masks.append(((1 << size) - 1) << shift)
    return [
        sum(block_masks[i] for i in chosen)
        for chosen in itertools.combinations(range(cfg.blocks), cfg.blocks - cfg.k1)
    ]


def bucket_keys(prefix: bytes, fp: int, masks: Sequence[int]) -> list[bytes]:
    """The bucket key of ``fp`` in each table. Also the routing key of the Kafka worker."""
    return [prefix + bytes((t,)) + (fp & m).to_bytes(8, "big") for t, m in enumerate(masks)]


def string_keys(strings: Sequence[int]) -> list[bytes]:
    return [_STRINGS + s.to_bytes(8, "big") for s in strings]


def minhash_keys(fps: Fingerprints, cfg: EngineConfig) -> list[bytes]:
    """The posting keys of a short page's smallest 5-gram hashes (none for a longer
    page): the sketch's first ``minhash_keys`` hashes."""
    if not 0 < fps.shingles <= cfg.exact_shingles:
        return []
    head = np.frombuffer(fps.sketch[: 4 * cfg.minhash_keys], dtype="<u4")
    return [_MINHASH + int(h).to_bytes(4, "big") for h in head]


@dataclass(slots=True)
class Lookup:
    """What a query found, and the buckets it read, so that ``add`` need not read them again."""

    #: Entries of earlier pages that satisfy the dual-threshold SimHash rule, one per page.
    near: Entries
    #: Earlier pages sharing period strings: entry and number of shared strings.
    shared: Entries
    shared_counts: npt.NDArray[np.int64]
    buckets: dict[bytes, bytes | None] = field(default_factory=dict)
    #: Earlier short pages sharing at least ``minhash_shared`` of a short page's
    #: smallest 5-gram hashes, one entry per page.
    close: Entries = field(default_factory=lambda: np.empty(0, dtype=ENTRY))


class FingerprintIndex(Protocol):
    """Finds earlier pages near a page's fingerprints; remembers pages."""

    def lookup(self, fps: Fingerprints, order: int) -> Lookup: ...

    def sketches(self, pids: Sequence[int]) -> dict[int, tuple[int, bytes]]: ...

    def add(
        self, lookup: Lookup, entry: Entries, fps: Fingerprints, *, sketch: bool = True
    ) -> None: ...


class KVIndex:
    """The index over any ``KV``: memory for tests, RocksDB for real."""

    def __init__(self, kv: KV, cfg: EngineConfig) -> None:
        self.kv = kv
        self.cfg = cfg
        self.masks = table_masks(cfg)
        self.retention_ms = cfg.retention_days * _DAY_MS
        #: Entries not written because their bucket was full, by index part.
        self.capped = {"simhash": 0, "strings": 0, "minhash": 0}

    def keys(self, fps: Fingerprints) -> tuple[list[bytes], list[bytes]]:
        """The SimHash bucket keys, and the posting keys: period strings, then the
        smallest 5-gram hashes of a short page (``minhash_keys``)."""
        sim = bucket_keys(_SIM_PRIMARY, fps.fp1, self.masks)
        sim += bucket_keys(_SIM_SECONDARY, fps.fp2, self.masks)
        return sim, string_keys(fps.strings) + minhash_keys(fps, self.cfg)

    def _live(self, raw: bytes | None, order: int) -> Entries:
        if not raw:
            return np.empty(0, dtype=ENTRY)
        arr = np.frombuffer(raw, dtype=ENTRY)
        if self.retention_ms:
            arr = arr[arr["order"] >= order - self.retention_ms]
        return arr

    def lookup(self, fps: Fingerprints, order: int) -> Lookup:
        sim_keys, str_keys = self.keys(fps)
        return self.found(fps, order, self.kv.get_many(sim_keys + str_keys))

    def found(self, fps: Fingerprints, order: int, values: Sequence[bytes | None]) -> Lookup:
        """The lookup of a page of ``order`` from its buckets' values, read elsewhere
        (``values``: one per key of ``keys(fps)``, SimHash keys first; None for an empty
        bucket). The Kafka topology reads buckets on their partitions and answers with them."""
        sim_keys, str_keys = self.keys(fps)
        if len(values) != len(sim_keys) + len(str_keys):
            raise ValueError(
                f"{len(values)} bucket values for {len(sim_keys) + len(str_keys)} keys"
            )
        buckets = dict(zip(sim_keys + str_keys, values, strict=True))
        cfg = self.cfg

        # Buckets joined as bytes, then read once: np.concatenate of structured arrays
        # promotes the dtype field by field on every call, a third of the lookup's time.
        near = self._live(b"".join(v for v in values[: len(sim_keys)] if v), order)
        if len(near):
            d1 = np.bitwise_count(near["fp1"] ^ np.uint64(fps.fp1))
            d2 = np.bitwise_count(near["fp2"] ^ np.uint64(fps.fp2))
            near = near[(d1 <= cfg.k1) | ((d1 <= cfg.k2) & (d2 <= cfg.k1))]
            near = near[np.unique(near["pid"], return_index=True)[1]]

        split = len(sim_keys) + len(fps.strings)
        postings = self._postings(values[len(sim_keys) : split], order)
        if len(postings):
            _, first, counts = np.unique(postings["pid"], return_index=True, return_counts=True)
            keep = counts >= cfg.ccs_min_shared
            shared, shared_counts = postings[first[keep]], counts[keep].astype(np.int64)
        else:
            shared, shared_counts = np.empty(0, dtype=ENTRY), np.empty(0, dtype=np.int64)
        close = self._postings(values[split:], order)
        if len(close):
            _, first, counts = np.unique(close["pid"], return_index=True, return_counts=True)
            close = close[first[counts >= cfg.minhash_shared]]
        return Lookup(near, shared, shared_counts, buckets, close)

    def _postings(self, values: Sequence[bytes | None], order: int) -> Entries:
        """The live entries of posting lists, without the full ones: a full list is a
        string (or hash) too common to be evidence."""
        cap = self.cfg.bucket_cap * ENTRY.itemsize
        return self._live(b"".join(v for v in values if v is not None and len(v) < cap), order)

    @staticmethod
    def sketch_key(pid: int) -> bytes:
        """Where a page's shingle count and sketch are kept."""
        return _SKETCH + pid.to_bytes(8, "big")

    @staticmethod
    def sketch_value(fps: Fingerprints) -> bytes:
        """What is kept under ``sketch_key``: the shingle count, then the sketch with the
        page's facts (``neardup.facts.with_facts``)."""
        return _SHINGLES.pack(fps.shingles) + with_facts(fps.sketch, fps.facts)

    def sketches(self, pids: Sequence[int]) -> dict[int, tuple[int, bytes]]:
        """Shingle count and bottom-k sketch (with its facts: ``split_facts`` reads them)
        of each page in ``pids`` that has one."""
        values = self.kv.get_many([self.sketch_key(p) for p in pids])
        return {
            p: (_SHINGLES.unpack_from(v)[0], v[_SHINGLES.size :])
            for p, v in zip(pids, values, strict=True)
            if v is not None
        }

    def appended(self, raw: bytes | None, entry: Entries | bytes) -> bytes | None:
        """Bucket ``raw`` with ``entry`` (one entry, or its bytes) added and expired
        entries dropped, or None when the bucket is full (the entry is then not added)."""
        data = entry if isinstance(entry, bytes) else entry.tobytes()
        if len(data) != ENTRY.itemsize:
            raise ValueError(f"an index entry is {ENTRY.itemsize} bytes, not {len(data)}")
        if not self.retention_ms:  # nothing expires: the bucket's bytes stay as they are
            if raw and len(raw) >= self.cfg.bucket_cap * ENTRY.itemsize:
                return None
            return (raw or b"") + data
        one = np.frombuffer(data, dtype=ENTRY) if isinstance(entry, bytes) else entry
        old = self._live(raw, int(one["order"][0]))
        if len(old) >= self.cfg.bucket_cap:
            return None
        return old.tobytes() + data

    def add(
        self, lookup: Lookup, entry: Entries, fps: Fingerprints, *, sketch: bool = True
    ) -> None:
        """Add ``entry`` to the page's buckets (those ``lookup`` read), and its sketch
        unless ``sketch`` is false (a page id seen before keeps its first sketch)."""
        sim_keys, str_keys = self.keys(fps)
        missing = [k for k in sim_keys + str_keys if k not in lookup.buckets]
        if missing:
            lookup.buckets.update(zip(missing, self.kv.get_many(missing), strict=True))
        writes: list[tuple[bytes, bytes]] = []
        for part, keys in (("simhash", sim_keys), ("strings", str_keys)):
            for key in keys:
                new = self.appended(lookup.buckets[key], entry)
                if new is None:
                    self.capped["minhash" if key[:1] == _MINHASH else part] += 1
                    continue
                writes.append((key, new))
        if sketch:
            pid = int(entry["pid"][0])
            writes.append((self.sketch_key(pid), self.sketch_value(fps)))
        self.kv.put_many(writes)
