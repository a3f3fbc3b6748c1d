"""End-to-end speed of the engine against a trafilatura + jieba pipeline, side by side.

    .venv/bin/python bench/speed.py [--pages 600] [--rounds 3] [--state DIR]

Both run from this one process over the same dev pages, rounds alternating, and the
medians are compared. neardup runs exactly as `neardup dedup` does (parse, decode,
extract, normalise, template filter, fingerprint, index, decide, cluster), with RocksDB
state in a temporary directory, and with its page sandbox: a child process analyses
the next pages while this one decides (``Engine.process_many``), so neardup's pages/s
on the clock use more than one core; its CPU seconds (this process and its children)
are printed too, as pages per CPU-second. The reference pipeline is decode,
trafilatura, jieba, and a tf-weighted SimHash: what a straightforward implementation
costs per page. Also prints neardup's time by stage and the bytes on disk per page.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines
from tests.integration.helpers import tree_cpu
from worker.config import EngineConfig
from worker.contract import parse_raw
from worker.decode import decode
from worker.engine import STAGES, Engine
from worker.extract import extract
from worker.fingerprint import simhash
from worker.records import Rejected
from worker.store import RocksKV, open_state


def run_neardup(
    lines: list[bytes], cfg: EngineConfig, state: str
) -> tuple[float, float, Engine, int]:
    """(wall seconds, CPU seconds of this process and its sandbox, the engine, bytes)."""
    shutil.rmtree(state, ignore_errors=True)
    engine = Engine(open_state(state, cfg), cfg)
    engine.process(parse_raw(lines[0], cfg.max_bytes))  # the sandbox's child starts
    lines = lines[1:]
    c0, t0 = tree_cpu(os.getpid()), time.perf_counter()
    for _ in engine.process_many(parse_raw(raw, cfg.max_bytes) for raw in lines):
        pass
    elapsed, cpu = time.perf_counter() - t0, tree_cpu(os.getpid()) - c0
    engine.close()
    size = RocksKV(state).approximate_size()
    return elapsed, cpu, engine, size


def run_reference(lines: list[bytes], cfg: EngineConfig) -> float:
    import jieba

    t0 = time.perf_counter()
    for raw in lines:
        page = parse_raw(raw, cfg.max_bytes)
        dec = page if isinstance(page, Rejected) else decode(page)
        ext = dec if isinstance(dec, Rejected) else extract(dec, "trafilatura")
        if not isinstance(ext, Rejected):
            simhash(Counter(w for w in jieba.lcut(ext.text) if w.strip()))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=600, help="first N pages of the stream")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lines = raw_lines(args.data / "pages.jsonl.gz")[: args.pages]
    cfg = EngineConfig()
    mb = sum(len(x) for x in lines) / len(lines) / 1024
    print(
        f"{len(lines)} pages, mean raw-page line {mb:.0f} KiB; cpu count {os.cpu_count()}; "
        "neardup with its sandbox child, the reference in this process"
    )
    # warm both: jieba's and rjieba's dictionaries, the IDF table, OpenCC
    state = tempfile.mkdtemp(prefix="neardup-bench-")
    run_neardup(lines[:20], cfg, state)
    run_reference(lines[:20], cfg)
    mine, mine_cpu, ref = [], [], []
    last: Engine | None = None
    size = 0
    n = len(lines) - 1  # neardup's first page starts the sandbox, outside the clock
    for r in range(args.rounds):
        elapsed, cpu, last, size = run_neardup(lines, cfg, state)
        mine.append(n / elapsed)
        mine_cpu.append(n / cpu)
        ref.append(len(lines) / run_reference(lines, cfg))
        print(
            f"  round {r + 1}: neardup {mine[-1]:.0f} pages/s ({mine_cpu[-1]:.0f} per "
            f"CPU-second), trafilatura+jieba {ref[-1]:.1f} pages/s"
        )
    m, rf = statistics.median(mine), statistics.median(ref)
    print(f"\nneardup dedup:        median {m:.0f} pages/s on the clock, "
          f"{statistics.median(mine_cpu):.0f} pages per CPU-second")  # fmt: skip
    print(f"trafilatura + jieba:  median {rf:.1f} pages/s (one core)")
    print(f"ratio:                {m / rf:.1f}x on the clock")
    assert last is not None
    total = sum(last.stats.seconds[s] for s in STAGES)
    print("\nneardup's time by stage (last round; decode to fingerprint run in the child):")
    for s in STAGES:
        print(
            f"  {s:<12} {last.stats.seconds[s] / total:6.1%}  "
            f"{last.stats.seconds[s] / n * 1000:6.3f} ms/page"
        )
    print(f"  {'CPU a page':<12} {1000 / mine_cpu[-1]:6.3f} ms, the whole process tree")
    decided = sum(last.stats.decisions.values())
    print(
        f"\nRocksDB state: {size / 1e6:.1f} MB for {decided} decided pages = "
        f"{size / max(decided, 1):.0f} bytes per page (after close; WAL and SST files)"
    )
    shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
