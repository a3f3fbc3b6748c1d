"""End-to-end speed of the engine against a trafilatura + jieba pipeline, side by side.

    .venv/bin/python bench/speed.py [--pages 600] [--rounds 3] [--issue-pages FILE] [--no-command]

The first three run in this one process over the same dev pages, rounds alternating, and
the medians are compared:

* neardup as `neardup dedup` runs by default (parse, decode, extract, normalise,
  template filter, fingerprint, index, decide, cluster), with RocksDB state in a
  temporary directory and its page sandbox: a child process analyses the next pages
  while this one decides (``Engine.process_many``), so its pages/s on the clock use more
  than one core;
* neardup in one process (``--set extract_timeout_s=0``: no sandbox), the same state;
* the reference: decode, trafilatura, jieba and a tf-weighted SimHash, one core: what a
  straightforward implementation costs a page;
* the whole command in one process (``python -m neardup.cli dedup FILE --state DIR --set
  extract_timeout_s=0``) over the dev stream's file as it is, every page of it, gzip
  decompression and the interpreter's start-up included: the strictest reading of the
  target (``--no-command`` leaves it out).

Each one's CPU seconds (this process and its children) give pages per CPU-second. The
issue's target is 300 pages/s a core where the reference made 25-30 pages/s, that is
10x to 12x the reference. The ratio is printed, but it is a lenient reading: the dev
pages cost trafilatura more than the issue's pages (13.0 against 16.9 pages per
CPU-second, measured side by side). Each round therefore also
times trafilatura and one lexbor parse on the issue's own 134 pages
(``--issue-pages``, the extraction dev set), which it measured at 27 and about 1,500
pages/s: how much slower this machine runs than that one, for Python-heavy code and for
C, and so what neardup would make there. Also prints neardup's time by stage and the
bytes on disk per page.
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

from bench.common import DATA, ROOT, raw_lines
from bench.cpu import run as run_cli
from bench.extraction import PARSE_ONLY, load_pages, time_all
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.decode import decode
from neardup.engine import STAGES, Engine
from neardup.extract import extract
from neardup.records import Rejected
from neardup.simhash import simhash
from neardup.store import RocksKV, open_state
from tests.integration.helpers import tree_cpu


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


def run_reference(lines: list[bytes], cfg: EngineConfig) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of the reference pipeline."""
    import jieba

    c0, t0 = time.process_time(), time.perf_counter()
    for raw in lines:
        page = parse_raw(raw, cfg.max_bytes)
        dec = page if isinstance(page, Rejected) else decode(page)
        ext = dec if isinstance(dec, Rejected) else extract(dec, "trafilatura")
        if not isinstance(ext, Rejected):
            simhash(Counter(w for w in jieba.lcut(ext.text) if w.strip()))
    return time.perf_counter() - t0, time.process_time() - c0


#: The issue's target: pages/s a core, and the reference's pages/s where it was set.
TARGET, REFERENCE_THERE = 300.0, (25.0, 30.0)
#: What the issue measured on its 134 pages (../shared/data/extraction-dev), one core:
#: trafilatura, and one lexbor parse.
ISSUE_PAGES_THERE = {"trafilatura": 27.0, PARSE_ONLY: 1500.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=600, help="first N pages of the stream")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--issue-pages",
        type=Path,
        default=DATA / "extraction-dev" / "pages.jsonl.gz",
        help="the pages the issue timed trafilatura and lexbor on (calibration)",
    )
    ap.add_argument("--no-command", action="store_true", help="leave the whole command out")
    args = ap.parse_args()
    lines = raw_lines(args.data / "pages.jsonl.gz")[: args.pages]
    issue_pages = load_pages(args.issue_pages) if args.issue_pages.exists() else []
    arms = {"sandbox": EngineConfig(), "one process": EngineConfig(extract_timeout_s=0)}
    mb = sum(len(x) for x in lines) / len(lines) / 1024
    print(f"{len(lines)} pages, mean raw-page line {mb:.0f} KiB; cpu count {os.cpu_count()}")
    # warm all: jieba's and rjieba's dictionaries, the IDF table, OpenCC, trafilatura
    state = tempfile.mkdtemp(prefix="neardup-bench-")
    command_dir = tempfile.mkdtemp(prefix="neardup-bench-command-")
    for cfg in arms.values():
        run_neardup(lines[:20], cfg, state)
    run_reference(lines[:20], EngineConfig())
    command = "command, one process"
    clock: dict[str, list[float]] = {a: [] for a in [*arms, "reference"]}
    if not args.no_command:
        clock[command] = []
    per_cpu: dict[str, list[float]] = {a: [] for a in clock}
    calibration: dict[str, list[float]] = {name: [] for name in ISSUE_PAGES_THERE}
    last: Engine | None = None
    size = 0
    n = len(lines) - 1  # neardup's first page starts the sandbox, outside the clock
    for r in range(args.rounds):
        for arm, cfg in arms.items():
            elapsed, cpu, engine, on_disk = run_neardup(lines, cfg, state)
            clock[arm].append(n / elapsed)
            per_cpu[arm].append(n / cpu)
            if arm == "sandbox":  # the stage times and the state size printed below
                last, size = engine, on_disk
        elapsed, cpu = run_reference(lines, EngineConfig())
        clock["reference"].append(len(lines) / elapsed)
        per_cpu["reference"].append(len(lines) / cpu)
        if not args.no_command:
            cpu, elapsed, pages = run_cli(
                ROOT, args.data / "pages.jsonl.gz", Path(command_dir) / "out.jsonl",
                ("--set", "extract_timeout_s=0"),
            )  # fmt: skip
            clock[command].append(pages / elapsed)
            per_cpu[command].append(pages / cpu)
        if issue_pages:
            for name, rate in time_all(issue_pages, ["trafilatura"], 1).items():
                calibration[name].append(rate)
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
        if a == command:
            label = "neardup dedup, the command"
        print(f"  {label:<28} {med[a]:6.1f} ({statistics.median(rates):6.1f}){ratio}")
    print(
        f"target: {TARGET:.0f} pages/s a core against the reference's "
        f"{REFERENCE_THERE[0]:.0f}-{REFERENCE_THERE[1]:.0f} where it was set, so "
        f"{low:.0f}x-{high:.0f}x the reference per CPU-second; here "
        f"{low * ref:.0f}-{high * ref:.0f} pages per CPU-second"
    )
    if issue_pages:
        # the same code on the same pages as where the target was set: how much slower
        # this machine runs, from Python-heavy code (trafilatura) and from C (lexbor)
        slower = {
            n: there / statistics.median(calibration[n]) for n, there in ISSUE_PAGES_THERE.items()
        }
        lo, hi = min(slower.values()), max(slower.values())
        print(
            "calibration on the issue's own 134 pages, pages per CPU-second here (there): "
            + ", ".join(
                f"{n} {statistics.median(calibration[n]):.1f} ({there:.0f})"
                for n, there in ISSUE_PAGES_THERE.items()
            )
            + f"; this machine ran x{lo:.2f} to x{hi:.2f} slower, so neardup there: "
            + ", ".join(f"{a} {med[a] * lo:.0f}-{med[a] * hi:.0f}" for a in med if a != "reference")
            + f" pages per CPU-second (target {TARGET:.0f})"
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
    if not args.no_command:
        print(
            f"the command, one process: every page of {args.data / 'pages.jsonl.gz'} as it is "
            "(gzip), the interpreter's start-up included"
        )
    decided = sum(last.stats.decisions.values())
    print(
        f"\nRocksDB state: {size / 1e6:.1f} MB for {decided} decided pages = "
        f"{size / max(decided, 1):.0f} bytes per page (after close; WAL and SST files)"
    )
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(command_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
