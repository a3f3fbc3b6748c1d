"""Today's sequencer for ``bench/scale.py``: one routed worker deciding pre-analysed pages
from a filled sequencer topic. Prints nothing; ``run_sequencer`` returns the figures."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.scale import DAY_MS, produce
from neardup.engine import Analysed, page_pid

# The worker, with the sequencer stage's own CPU taken on the way: the thread time of its
# synchronous steps (``accept``, ``release``, ``commit``, ``busy``; nested calls counted
# once), written to a file every 0.2 s. The Kafka I/O around them is left out.
_LAUNCH = r"""
import os, runpy, sys, threading, time
from neardup.kafka import route, stage
spent, depth = [0.0], [0]
def wrap(cls, name):
    f = getattr(cls, name)
    def timed(*a, **k):
        if depth[0]:
            return f(*a, **k)
        depth[0] += 1
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            spent[0] += time.thread_time() - t
            depth[0] -= 1
    setattr(cls, name, timed)
for cls in (route.RoutedStage, stage.DecideStage):
    for name in ("accept", "release", "commit", "busy", "resend_stalled"):
        if name in vars(cls):
            wrap(cls, name)
out = sys.argv.pop(1)
def dump():
    while True:
        time.sleep(0.2)
        with open(out + ".tmp", "w") as fh:
            fh.write(repr(spent[0]))
        os.replace(out + ".tmp", out)
threading.Thread(target=dump, daemon=True).start()
sys.argv[0] = "neardup.kafka"
runpy.run_module("neardup.kafka", run_name="__main__", alter_sys=True)
"""


def _spent(path: Path) -> float:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return 0.0


def run_sequencer(bootstrap: str, tmp: Path, analysed: list[Analysed], n: int) -> dict[str, float]:
    """Today's sequencer topic filled with ``n`` pages' ``PageMsg`` frames (the dev pages
    replayed as in ``bench/scale.py``) and a drained mark, then one routed worker (one
    partition, an empty raw topic). From its first decision to its last: pages/s, CPU a
    page of the worker's process tree, and of the sequencer stage's own steps."""
    import subprocess

    from bench.worker import create_topic
    from neardup.kafka import wire
    from neardup.kafka.app import SEQUENCER_FRAME_BYTES
    from neardup.kafka.topics import STATE_MAX_MESSAGE_BYTES
    from tests.integration.helpers import (
        ROOT,
        Collector,
        Names,
        WorkerProcess,
        create_topics,
        delete_topics,
        tree_cpu,
        wait_for,
    )

    names = Names()
    sequencer = f"{names.app_id}-sequencer"
    create_topics(bootstrap, {names.raw: 1})
    create_topic(bootstrap, sequencer, 1, {"max.message.bytes": str(STATE_MAX_MESSAGE_BYTES)})
    span = analysed[-1].order - analysed[0].order + 2 * DAY_MS
    now = time.time()

    def frames() -> Iterator[bytes]:
        group: list[bytes] = []
        size = 0
        for i in range(n):
            r, p = divmod(i, len(analysed))
            a = analysed[p]
            if r:
                new = f"{a.page.page_id}#{r}"
                page = replace(a.page, page_id=new, url=f"{a.page.url}#{r}")
                a = replace(a, page=page, pid=page_pid(new), order=a.order + r * span)
            group.append(wire.encode(wire.PageMsg(0, i, 1, a, now)))
            size += len(group[-1])
            if size >= SEQUENCER_FRAME_BYTES:
                yield wire.frame(group)
                group, size = [], 0
        if group:
            yield wire.frame(group)
        yield wire.encode(wire.MarksMsg(1, (wire.Mark(0, n),), time.time()))

    asyncio.run(produce(bootstrap, sequencer, frames()))
    collector = Collector(bootstrap, [names.decisions, names.rejects])
    spent = tmp / "sequencer-cpu"
    # passes are 2 days apart and the dev pages span 12 hours: with 1 day of retention no
    # pass finds the one before it, as the order task's replayed edges assume
    env = {"NEARDUP_RETENTION_DAYS": "1"}
    worker = WorkerProcess(bootstrap, names, 1, tmp / "seq", tmp / "seq.log", env=env)
    argv = [sys.executable, "-c", _LAUNCH, str(spent), "worker", "-l", "info"]
    try:
        with worker.log.open("ab") as fh:
            worker.proc = subprocess.Popen(
                argv, env=worker.env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT
            )

        def decided() -> int:
            return len(collector.times[names.decisions])

        wait_for(lambda: decided() > 0, 600, "the worker's first decision", interval=0.05)
        c0, s0, d0 = tree_cpu(worker.proc.pid), _spent(spent), decided()
        wait_for(lambda: decided() >= n, 1800, f"{n} decisions", interval=0.05)
        cpu, done = tree_cpu(worker.proc.pid) - c0, time.time()
        # the stage's time is written every 0.2 s: its figure from after the last decision
        wait_for(lambda: spent.stat().st_mtime > done, 30, "the stage's CPU", interval=0.05)
        stage_cpu = _spent(spent) - s0
        times = collector.times[names.decisions]
        pages = max(n - d0, 1)
        return {
            "pages": n,
            "pages_s": (n - 1) / max(times[-1] - times[0], 1e-9),
            "cpu": cpu / pages,
            "stage_cpu": stage_cpu / pages,
            "load": os.getloadavg()[0],
        }
    except AssertionError:
        print(worker.tail(40), file=sys.stderr)
        raise
    finally:
        worker.stop()
        collector.close()
        delete_topics(bootstrap, names.prefix)


def summary(seq: dict[str, Any]) -> str:
    return (
        f"today's sequencer: {seq['pages']:.0f} pages in one routed worker: "
        f"{seq['pages_s']:,.0f} pages/s, {seq['cpu'] * 1000:.3f} ms CPU a page in the worker's "
        f"process tree, {seq['stage_cpu'] * 1000:.3f} ms of it in the sequencer stage's steps"
    )
