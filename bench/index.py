"""Index lookups against RocksDB holding N synthetic pages (default 10 million).

    .venv/bin/python bench/index.py [--pages 10000000] [--queries 20000] [--strings S]
                                    [--settle] [--cache-mb MB] [--idle S] [--dir DIR]
                                    [--keep]

The block tables (4 primary + 4 secondary, 16-bit keys with the default k1 = 3) are
filled with N random pages in bulk, written exactly as KVIndex writes them (one value of
packed entries per bucket); with ``--strings S``, also S period-string postings a page
(random strings, one entry each), so that the state holds the keys a real one does
besides the buckets. Then KVIndex.lookup runs for queries that are half near an
indexed page (0-3 bits flipped in fp1, so at least one must be found) and half random,
each with 25 period-string keys (which miss: most of a new page's strings are new).
Latency is per lookup, wall clock, one thread, OS page cache warm (the benchmark has just
written the files). Prints p50, p99, p99.9, the recall of the near queries, and bytes on
disk per page.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neardup.config import EngineConfig
from neardup.fingerprint import Fingerprints
from neardup.index import ENTRY, KVIndex, string_keys, table_masks
from neardup.store import RocksKV

CHUNK = 1 << 20


def fill(kv: RocksKV, n: int, cfg: EngineConfig, rng: np.random.Generator) -> np.ndarray:
    entries = np.zeros(n, dtype=ENTRY)
    entries["pid"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    entries["fp1"] = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    entries["fp2"] = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    entries["order"] = np.arange(n, dtype=np.int64)
    entries["n"] = 20
    for prefix, field in ((b"P", "fp1"), (b"S", "fp2")):
        for t, mask in enumerate(table_masks(cfg)):
            keys = entries[field] & np.uint64(mask)
            order = np.argsort(keys, kind="stable")
            sorted_keys, sorted_entries = keys[order], entries[order]
            bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [n]))
            batch: list[tuple[bytes, bytes]] = []
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                key = prefix + bytes((t,)) + int(sorted_keys[s]).to_bytes(8, "big")
                batch.append((key, sorted_entries[s : min(e, s + cfg.bucket_cap)].tobytes()))
                if len(batch) >= 4096:
                    kv.put_many(batch)
                    batch = []
            kv.put_many(batch)
            print(
                f"  table {prefix.decode()}{t}: {len(starts)} buckets, "
                f"mean {n / len(starts):.0f} entries",
                flush=True,
            )
    return entries


def fill_strings(kv: RocksKV, entries: np.ndarray, per_page: int, rng: np.random.Generator) -> None:
    """``per_page`` period-string postings for each page: a random string, its entry."""
    for start in range(0, len(entries), CHUNK):
        part = entries[start : start + CHUNK]
        for _ in range(per_page):
            strings = rng.integers(0, 2**63, len(part), dtype=np.uint64).tolist()
            keys = string_keys(strings)
            values = [part[i : i + 1].tobytes() for i in range(len(part))]
            for at in range(0, len(keys), 4096):
                kv.put_many(zip(keys[at : at + 4096], values[at : at + 4096], strict=True))
        print(f"  strings: {min(start + CHUNK, len(entries)):,} pages", flush=True)


Query = tuple[Fingerprints, int | None]  # the fingerprints, and the pid they must find


def make_queries(entries: np.ndarray, n: int, rng: np.random.Generator) -> list[Query]:
    """Half near an indexed page (0-3 bits of fp1 flipped), half random; 25 strings each."""
    queries: list[Query] = []
    for q in range(n):
        target: int | None = None
        if q % 2 == 0:
            entry = entries[int(rng.integers(0, len(entries)))]
            target, fp1 = int(entry["pid"]), int(entry["fp1"])
            for bit in rng.choice(64, size=int(rng.integers(0, 4)), replace=False).tolist():
                fp1 ^= 1 << bit
            fp2 = int(rng.integers(0, 2**63))
        else:
            fp1, fp2 = (int(x) for x in rng.integers(0, 2**63, 2))
        strings = tuple(int(x) for x in rng.integers(0, 2**63, 25))
        queries.append((Fingerprints(fp1=fp1, fp2=fp2, strings=strings, words=100), target))
    return queries


def measure(index: KVIndex, queries: list[Query], order: int, title: str) -> None:
    lat: list[float] = []
    found = near = 0
    for fps, target in queries:
        t = time.perf_counter()
        result = index.lookup(fps, order)
        lat.append(time.perf_counter() - t)
        if target is not None:
            near += 1
            found += target in set(result.near["pid"].tolist())
    ms = np.array(lat) * 1000
    print(f"\n{title}:")
    print(
        f"  p50 {np.percentile(ms, 50):.3f} ms   p99 {np.percentile(ms, 99):.3f} ms   "
        f"p99.9 {np.percentile(ms, 99.9):.3f} ms   max {ms.max():.3f} ms"
    )
    print(f"  near queries that found their page: {found}/{near}")


def _prop(kv: RocksKV, name: str) -> int:
    value = kv.int_property(f"rocksdb.{name}")
    if value is None:
        raise SystemExit(f"RocksDB has no property {name!r}")
    return value


def _busy(kv: RocksKV) -> bool:
    """A flush or a compaction is pending or running."""
    names = ("mem-table-flush-pending", "num-running-flushes", "compaction-pending",
             "num-running-compactions")  # fmt: skip
    return any(_prop(kv, name) for name in names)


def _levels(kv: RocksKV) -> str:
    files = [_prop(kv, f"num-files-at-level{level}") for level in range(7)]
    pending = _prop(kv, "estimate-pending-compaction-bytes")
    return f"files by level {files}, compaction pending {pending / 1e9:.2f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--strings", type=int, default=0, help="period strings a page to store")
    ap.add_argument(
        "--settle",
        action="store_true",
        help="query once RocksDB has no flush or compaction pending or running, not right "
        "after the fill",
    )
    ap.add_argument("--cache-mb", type=int, default=RocksKV.CACHE_MB, help="block cache, MiB")
    ap.add_argument(
        "--idle",
        type=int,
        default=0,
        metavar="S",
        help="then S seconds idle, and the same lookups again (a host that reclaims idle "
        "page cache has dropped the files' pages by then)",
    )
    ap.add_argument("--dir", default="/tmp/neardup-index-bench")
    ap.add_argument("--keep", action="store_true", help="keep the RocksDB directory")
    args = ap.parse_args()
    cfg = EngineConfig()
    rng = np.random.default_rng(20261121)
    shutil.rmtree(args.dir, ignore_errors=True)
    kv = RocksKV(args.dir, args.cache_mb)
    t0 = time.perf_counter()
    print(f"filling {args.pages:,} synthetic pages ...")
    entries = fill(kv, args.pages, cfg, rng)
    if args.strings:
        fill_strings(kv, entries, args.strings, rng)
    print(f"filled in {time.perf_counter() - t0:.0f} s; {_levels(kv)}")
    if args.settle:
        t1 = time.perf_counter()
        while _busy(kv):
            time.sleep(1)
        print(f"settled in {time.perf_counter() - t1:.0f} s; {_levels(kv)}")
    index = KVIndex(kv, cfg)
    queries = make_queries(entries, args.queries, rng)
    measure(index, queries, args.pages, f"{args.queries:,} lookups against {args.pages:,} pages")
    if args.idle:
        time.sleep(args.idle)
        measure(index, queries, args.pages, f"the same lookups again after {args.idle} s idle")
    kv.close()
    size = RocksKV(args.dir).approximate_size()
    print(
        f"  {'state' if args.strings else 'block tables'} on disk: {size / 1e9:.2f} GB = "
        f"{size / args.pages:.0f} bytes per page ({8 + args.strings} entries of "
        f"{ENTRY.itemsize} bytes each before compression)"
    )
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
