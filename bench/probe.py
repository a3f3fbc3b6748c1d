"""The routed topology's bucket probe (``neardup.kafka.route.probe_bucket``): empty buckets
through their shortcut against the general numpy path, side by side.

    .venv/bin/python bench/probe.py [--data DIR] [--pages 300] [--rounds 5]

Analyses the first dev pages in this process and counts the buckets each page probes
(its SimHash blocks and its period strings). Then, for each page, a probe that adds its
entry to an empty bucket is timed through ``probe_bucket`` and through the general path
(``_probe_filled``), rounds alternating. Prints medians in microseconds a bucket;
asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import analysed_pages, micro_args
from neardup.config import EngineConfig
from neardup.index import KVIndex, make_entry
from neardup.kafka import wire
from neardup.kafka.route import _probe_filled, probe_bucket
from neardup.store import MemoryKV

Probe = Callable[[KVIndex, bytes | None, bytes | None, wire.ProbeMsg], object]


def _us_a_probe(f: Probe, index: KVIndex, probes: list[wire.ProbeMsg], repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for probe in probes:
            f(index, None, None, probe)
    return (time.perf_counter() - t0) / (repeat * len(probes)) * 1e6


def main() -> None:
    args = micro_args(__doc__ or "")
    cfg = EngineConfig()
    index = KVIndex(MemoryKV(), cfg)
    probes: list[wire.ProbeMsg] = []
    buckets: list[int] = []
    for a in analysed_pages(args.data, args.pages, cfg):
        sim_keys, str_keys = index.keys(a.fps)
        buckets.append(len(sim_keys) + len(str_keys))
        entry = np.asarray(make_entry(a.pid, a.fps, a.order)).tobytes()
        probes.append(wire.ProbeMsg(len(probes), a.pid, True, entry, ()))
    print(f"{len(probes)} analysed pages, {statistics.mean(buckets):.1f} buckets a page probed")
    fast, general = [], []
    for _ in range(args.rounds):
        general.append(_us_a_probe(_probe_filled, index, probes, 20))
        fast.append(_us_a_probe(probe_bucket, index, probes, 20))
    g, f = statistics.median(general), statistics.median(fast)
    print(f"an empty bucket, adding the page's entry: general path {g:.2f} us, shortcut {f:.2f} us")
    print(f"  x{g / f:.1f}; at most {statistics.mean(buckets) * (g - f):.0f} us a page saved")


if __name__ == "__main__":
    main()
