"""End-to-end speed of the engine against a trafilatura + jieba pipeline, side by side.

    .venv/bin/python bench/speed.py [--pages 600] [--rounds 3]

All three run from this one process over the same dev pages, rounds alternating, and
the medians are compared:

* neardup as `neardup dedup` runs by default (parse, decode, extract, normalise,
  template filter, fingerprint, index, decide, cluster), with RocksDB state in a
  temporary directory and its page sandbox: a child process analyses the next pages
  while this one decides (``Engine.process_many``), so its pages/s on the clock use more
  than one core;
* neardup in one process (``--set extract_timeout_s=0``: no sandbox), the same state;
* the reference: decode, trafilatura, jieba and a tf-weighted SimHash, one core: what a
  straightforward implementation costs a page.

Each one's CPU seconds (this process and its children) give pages per CPU-second. The
issue's target, 300 pages/s a core against 25-30 pages/s for the reference on the
machine where it was set, is a ratio of 10x to 12x per CPU-second; the machines here
change speed from day to day, and the reference measured in the same run carries that
change. Also prints neardup's time by stage and the bytes on disk per page.
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


def run_reference(lines: list[bytes], cfg: EngineConfig) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, of which trafilatura's) of the
    reference pipeline."""
    import jieba

    c0, t0 = time.process_time(), time.perf_counter()
    in_trafilatura = 0.0
    for raw in lines:
        page = parse_raw(raw, cfg.max_bytes)
        dec = page if isinstance(page, Rejected) else decode(page)
        e0 = time.process_time()
        ext = dec if isinstance(dec, Rejected) else extract(dec, "trafilatura")
        in_trafilatura += time.process_time() - e0
        if not isinstance(ext, Rejected):
            simhash(Counter(w for w in jieba.lcut(ext.text) if w.strip()))
    return time.perf_counter() - t0, time.process_time() - c0, in_trafilatura


#: The issue's target: pages/s a core, and the reference's pages/s where it was set
#: (trafilatura + jieba; trafilatura alone made 27, on pages of 156 KB on average).
TARGET, REFERENCE_THERE, TRAFILATURA_THERE = 300.0, (25.0, 30.0), 27.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=600, help="first N pages of the stream")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lines = raw_lines(args.data / "pages.jsonl.gz")[: args.pages]
    arms = {"sandbox": EngineConfig(), "one process": EngineConfig(extract_timeout_s=0)}
    mb = sum(len(x) for x in lines) / len(lines) / 1024
    print(f"{len(lines)} pages, mean raw-page line {mb:.0f} KiB; cpu count {os.cpu_count()}")
    # warm all: jieba's and rjieba's dictionaries, the IDF table, OpenCC, trafilatura
    state = tempfile.mkdtemp(prefix="neardup-bench-")
    for cfg in arms.values():
        run_neardup(lines[:20], cfg, state)
    run_reference(lines[:20], EngineConfig())
    clock: dict[str, list[float]] = {a: [] for a in [*arms, "reference"]}
    per_cpu: dict[str, list[float]] = {a: [] for a in clock}
    trafilatura: list[float] = []
    last: Engine | None = None
    size = 0
    n = len(lines) - 1  # neardup's first page starts the sandbox, outside the clock
    for r in range(args.rounds):
        for arm, cfg in arms.items():
            elapsed, cpu, engine, size = run_neardup(lines, cfg, state)
            clock[arm].append(n / elapsed)
            per_cpu[arm].append(n / cpu)
            last = engine if arm == "sandbox" else last
        elapsed, cpu, in_trafilatura = run_reference(lines, EngineConfig())
        clock["reference"].append(len(lines) / elapsed)
        per_cpu["reference"].append(len(lines) / cpu)
        trafilatura.append(len(lines) / in_trafilatura)
        print(
            f"  round {r + 1}: "
            + ", ".join(
                f"{a} {clock[a][-1]:.1f} pages/s ({per_cpu[a][-1]:.1f} per CPU-second)"
                for a in clock
            ),
            flush=True,
        )
    med = {a: statistics.median(v) for a, v in per_cpu.items()}
    ref = med["reference"]
    low, high = (TARGET / there for there in reversed(REFERENCE_THERE))
    print(f"\nmedians of {args.rounds} rounds, pages per CPU-second (and on the clock):")
    for a, rates in clock.items():
        ratio = "" if a == "reference" else f"  {med[a] / ref:5.1f}x the reference"
        label = "trafilatura + jieba" if a == "reference" else f"neardup dedup, {a}"
        print(f"  {label:<28} {med[a]:6.1f} ({statistics.median(rates):6.1f}){ratio}")
    print(
        f"target: {TARGET:.0f} pages/s a core against the reference's "
        f"{REFERENCE_THERE[0]:.0f}-{REFERENCE_THERE[1]:.0f} where it was set, so "
        f"{low:.0f}x-{high:.0f}x the reference per CPU-second; here "
        f"{low * ref:.0f}-{high * ref:.0f} pages per CPU-second"
    )
    alone = statistics.median(trafilatura)
    scaled = TARGET / TRAFILATURA_THERE
    print(
        f"cross-check: trafilatura alone {alone:.1f} pages per CPU-second here (its "
        f"{TRAFILATURA_THERE:.0f} pages/s where the target was set, on larger pages), so "
        f"{scaled:.1f}x that, {scaled * alone:.0f} pages per CPU-second; neardup makes "
        + ", ".join(f"{med[a] / alone:.1f}x ({a})" for a in arms)
    )
    assert last is not None
    total = sum(last.stats.seconds[s] for s in STAGES)
    print("\nneardup's time by stage (sandbox, last round; decode to fingerprint in the child):")
    for s in STAGES:
        print(
            f"  {s:<12} {last.stats.seconds[s] / total:6.1%}  "
            f"{last.stats.seconds[s] / n * 1000:6.3f} ms/page"
        )
    print(f"  {'CPU a page':<12} {1000 / per_cpu['sandbox'][-1]:6.3f} ms, the whole process tree")
    decided = sum(last.stats.decisions.values())
    print(
        f"\nRocksDB state: {size / 1e6:.1f} MB for {decided} decided pages = "
        f"{size / max(decided, 1):.0f} bytes per page (after close; WAL and SST files)"
    )
    shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
