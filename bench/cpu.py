"""CPU a page of `neardup dedup`, whole process tree, optionally against another checkout.

    .venv/bin/python bench/cpu.py [--rounds 3] [--pages FILE] [--against DIR]

Runs the real command (`python -m neardup.cli dedup FILE --state DIR`, the defaults, so
with the page sandbox) over the dev stream and reports the CPU seconds of the command,
its sandbox zygote and worker (getrusage of the reaped children: user + system), start-up
included, as ms a page and pages per CPU-second. On a shared machine wall time swings
with the other processes' load and CPU time much less; with ``--against`` the two
checkouts run alternately, round after round, so both see the same load, and the ratio
of their medians is printed. The decisions of the two must be the same, byte for byte
(``decided_at`` and the engine's parameters aside, which it prints where they differ):
the script says so or fails.
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

from bench.common import DATA, ROOT


def run(
    checkout: Path, pages: Path, out: Path, extra: tuple[str, ...] = ()
) -> tuple[float, float, int]:
    """(CPU seconds of the process tree, wall seconds, pages decided or rejected) of
    ``neardup dedup`` with ``extra`` arguments."""
    state = out.with_suffix(".state")
    shutil.rmtree(state, ignore_errors=True)
    cmd = [sys.executable, "-m", "neardup.cli", "dedup", str(pages), "--out", str(out),
           "--state", str(state), *extra]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(state, ignore_errors=True)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{cmd} in {checkout} failed ({done.returncode}):\n{done.stderr}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    first = done.stderr.split("neardup: ", 1)[1] if "neardup: " in done.stderr else "0"
    return cpu, wall, int(first.split()[0])


def decisions(path: Path) -> tuple[list[str], set[str]]:
    """The decisions without ``decided_at`` and ``engine``, and the engine's parameters
    (a parameter added or changed between two checkouts is told apart from a decision
    that changed)."""
    out, params = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        d.pop("decided_at", None)
        engine = d.pop("engine", None)
        if engine:
            params.update(str(engine.get("params", "")).split(";"))
        out.append(json.dumps(d, ensure_ascii=False, sort_keys=True))
    return out, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pages", type=Path, default=DATA / "neardup-dev" / "pages.jsonl.gz")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", type=Path, help="another checkout (with its neardup/) to compare")
    args = ap.parse_args()
    arms = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    wall: dict[str, list[float]] = {a: [] for a in arms}
    n = 0
    with tempfile.TemporaryDirectory(prefix="neardup-cpu-") as tmp:
        for r in range(args.rounds):
            # alternate which arm goes first, so neither always runs after the other
            for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                c, w, n = run(arms[arm], args.pages, Path(tmp) / f"{arm}.jsonl")
                cpu[arm].append(c)
                wall[arm].append(w)
                print(f"  round {r + 1} {arm:8s} CPU {c:6.2f} s = {1000 * c / n:5.2f} ms/page, "
                      f"wall {w:6.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        same, params = True, (set[str](), set[str]())
        if len(arms) > 1:
            (mine, my_params), (theirs, their_params) = (
                decisions(Path(tmp) / f"{arm}.jsonl") for arm in arms
            )
            same, params = mine == theirs, (my_params - their_params, their_params - my_params)
    print(f"\nneardup dedup, {n} pages, {args.rounds} rounds, {os.cpu_count()} CPUs (medians):")
    for arm in arms:
        c = statistics.median(cpu[arm])
        print(f"  {arm:8s} {arms[arm]}: CPU {1000 * c / n:.2f} ms/page = {n / c:.0f} pages per "
              f"CPU-second (runs {min(cpu[arm]):.2f}-{max(cpu[arm]):.2f} s); wall median "
              f"{statistics.median(wall[arm]):.1f} s")  # fmt: skip
    if args.against:
        ratio = statistics.median(cpu["this"]) / statistics.median(cpu["against"])
        print(f"  CPU this / against: {ratio:.3f}")
        print(f"  identical decisions: {same}")
        if any(params):
            print(f"  engine parameters only in this: {sorted(params[0])}; "
                  f"only in against: {sorted(params[1])}")  # fmt: skip
        if not same:
            raise SystemExit("the two checkouts decide differently")


if __name__ == "__main__":
    main()
