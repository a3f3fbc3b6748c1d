"""Resuming `neardup dedup` from its --state over pages it decided already, against the
run that decided them.

    .venv/bin/python bench/resume.py [--pages FILE] [--rounds 3]

Runs the command as a user would, in a new process each time: once fresh with a new
state directory, then ``--rounds`` times again over the same input with that state (every
page then skipped before it is analysed). Prints wall-clock and CPU seconds (the
process and its children, the sandbox included) of each, and the resumed run's share of
the fresh one, median over the rounds. The issue's target: under 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA

NEARDUP = Path(sys.executable).parent / "neardup"


def run(pages: Path, state: Path, out: Path) -> tuple[float, float, dict[str, object]]:
    """Wall and CPU seconds of one `neardup dedup` run, and its --stats."""
    stats = out.with_suffix(".stats.json")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    argv = [str(NEARDUP), "dedup", str(pages), "--out", str(out), "--state", str(state)]
    done = subprocess.run([*argv, "-q", "--stats", str(stats)], check=False)
    if done.returncode not in (0, 3):  # 3: some pages rejected, which is data
        raise SystemExit(f"neardup exited with {done.returncode}")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(stats.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, default=DATA / "neardup-dev" / "pages.jsonl.gz")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="neardup-resume-"))
    try:
        state = work / "state"
        wall0, cpu0, fresh = run(args.pages, state, work / "fresh.jsonl")
        print(f"fresh:   {fresh['pages']:,} pages, {wall0:.1f} s wall, {cpu0:.1f} s CPU")
        walls, cpus = [], []
        for i in range(args.rounds):
            wall, cpu, again = run(args.pages, state, work / f"again{i}.jsonl")
            walls.append(wall)
            cpus.append(cpu)
            print(
                f"resumed: {again['pages']:,} pages, {again['skipped']:,} skipped, "
                f"{again['decided']:,} decided, {wall:.1f} s wall, {cpu:.1f} s CPU"
            )
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(
            f"resumed against fresh (median of {args.rounds}): wall {wall / wall0:.1%}, "
            f"CPU {cpu / cpu0:.1%} (load average {os.getloadavg()[0]:.1f})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
