"""What the analysis sandbox costs: `neardup dedup` with and without it, side by side.

    .venv/bin/python bench/sandbox.py [--pages 600] [--rounds 3]

Runs the real command (`python -m neardup.cli dedup`, in-memory state) over the first
``--pages`` dev pages, once with the default config (sandbox on) and once with
``--set extract_timeout_s=0`` (analysis in the process, unbounded), rounds alternating so
that both see the same machine load. Reports wall time per run (start-up included) and
the pages/s the command prints (its page loop, which includes starting the child), then
the steady per-page cost of the pipe alone: ``Sandbox.analyse`` against ``analyse`` on
the same pages in this process, after both are warm. Also checks that both modes decide
every page the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, ROOT, raw_lines
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import analyse
from neardup.records import RawPage
from neardup.sandbox import Sandbox

PAGES = DATA / "neardup-dev" / "pages.jsonl.gz"
MODES = {"sandbox": [], "in-process": ["--set", "extract_timeout_s=0"]}
_RATE = re.compile(r"\(([\d.]+) pages/s\)")


def run_cli(pages: Path, out: Path, extra: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the command and its sandbox child, the pages/s the
    command reports). CPU time barely moves with the load of other processes on the host;
    wall time does."""
    cmd = [sys.executable, "-m", "neardup.cli", "dedup", str(pages), "--out", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode not in (0, 3):
        raise SystemExit(f"{cmd} failed ({done.returncode}):\n{done.stderr}")
    match = _RATE.search(done.stderr)
    return wall, cpu, float(match.group(1)) if match else float("nan")


def decisions(path: Path) -> dict[str, tuple[str, str | None, str, str]]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        out[d["page_id"]] = (d["decision"], d["duplicate_of"], d["cluster_id"], d["fingerprint"])
    return out


def per_page(pages: list[RawPage], cfg: EngineConfig, rounds: int) -> tuple[float, float]:
    """Median ms/page of ``analyse`` in this process and through the sandbox, warm."""
    inproc, boxed = [], []
    with Sandbox(cfg) as sandbox:
        sandbox.analyse(pages[0])
        analyse(pages[0], cfg)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for page in pages:
                analyse(page, cfg)
            inproc.append((time.perf_counter() - t0) * 1000 / len(pages))
            t0 = time.perf_counter()
            for page in pages:
                sandbox.analyse(page)
            boxed.append((time.perf_counter() - t0) * 1000 / len(pages))
    return statistics.median(inproc), statistics.median(boxed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lines = raw_lines(PAGES)[: args.pages]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pages.jsonl"
        src.write_bytes(b"".join(lines))
        walls: dict[str, list[float]] = {m: [] for m in MODES}
        cpus: dict[str, list[float]] = {m: [] for m in MODES}
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode, extra in MODES.items():
                wall, cpu, rate = run_cli(src, Path(tmp) / f"{mode}.jsonl", extra)
                walls[mode].append(wall)
                cpus[mode].append(cpu)
                rates[mode].append(rate)
        same = decisions(Path(tmp) / "sandbox.jsonl") == decisions(Path(tmp) / "in-process.jsonl")
    n = len(lines)
    print(f"neardup dedup, {n} dev pages, {args.rounds} rounds alternating (medians):")
    for mode in MODES:
        wall = statistics.median(walls[mode])
        print(
            f"  {mode:10s} wall {wall:6.2f} s = {n / wall:6.1f} pages/s end to end "
            f"(runs {min(walls[mode]):.2f}-{max(walls[mode]):.2f} s); command reports "
            f"{statistics.median(rates[mode]):6.1f} pages/s; CPU "
            f"{1000 * statistics.median(cpus[mode]) / n:5.2f} ms/page"
        )
    ratio = statistics.median(walls["in-process"]) / statistics.median(walls["sandbox"])
    cpu_ratio = statistics.median(cpus["sandbox"]) / statistics.median(cpus["in-process"])
    print(f"  sandbox throughput / in-process: {ratio:.3f} (wall, end to end)")
    print(f"  sandbox CPU / in-process: {cpu_ratio:.3f}")
    print(f"  load average during the runs: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"  identical decisions: {same}")
    cfg = EngineConfig()
    pages = [p for raw in lines if isinstance(p := parse_raw(raw, cfg.max_bytes), RawPage)]
    inproc, boxed = per_page(pages, cfg, args.rounds)
    print(
        f"analyse, warm, per page: in-process {inproc:.2f} ms, sandbox {boxed:.2f} ms "
        f"(+{boxed - inproc:.2f} ms, {boxed / inproc - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
