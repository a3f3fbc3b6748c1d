"""The routed topology's stateful stages without Kafka: CPU a page of the sequencer and of
the probes and records partitions, over RocksDB, on the analysed dev pages.

    .venv/bin/python bench/stages.py [--data DIR] [--pages 1000] [--rounds 3]

The worker's own process spends about 2 ms a page more than the engine's parent
(docs/benchmarks.md, Worker). This takes Kafka and Faust out of that: the pages are
analysed first, in this process; then, timed, they go through what the worker's agents
call, as the agents call it. The raw pages are spread over 4 partitions and sent to the
sequencer in frames of 32 (``wire.frame``, as the analyse agent sends them), each followed
by a drain mark; every sequencer step takes the pending messages and releases
until nothing more can go (``Worker._sequence``); probes and records go to 4 partitions,
each a RocksDB of its own, and their answers back to the sequencer in frames
(``Worker._route``). Each round starts from empty stores. Prints, per round and as
medians, the CPU (``time.process_time``) a page of:

* ``forward``: the analyse agent's encoding of each page for the sequencer and framing;
* ``sequencer``: unframing and decoding, ``RoutedStage.accept``/``release`` (ordering,
  the template filter, the journal, deciding, the clusters);
* ``route``: unframing, ``route_step`` (``probe_store``/``records_store``), encoding the
  answers.

Asserts nothing; checks that every page got exactly one decision.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import analysed_pages, micro_args
from neardup.config import EngineConfig
from neardup.engine import Analysed
from neardup.kafka import wire
from neardup.kafka.route import RoutedStage, route_step
from neardup.kafka.stage import Emit
from neardup.store import RocksKV

PARTITIONS = 4
FRAME = 32
STAGES = ("forward", "sequencer", "route")


class ScanRocksKV(RocksKV):
    """``RocksKV`` with the prefix scan the worker's tables have (``TableKV.scan``)."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            yield key, value


class Round:
    """One pass of the pages through the stages, with fresh stores under ``tmp``."""

    def __init__(self, tmp: Path, cfg: EngineConfig) -> None:
        self.state = ScanRocksKV(str(tmp / "state"))
        # the worker's steps wait for a commit a sequencer message (``JournalKV.hold``)
        self.stage = RoutedStage(self.state, cfg, PARTITIONS, hold=True)
        self.buckets = [RocksKV(str(tmp / f"buckets{p}")) for p in range(PARTITIONS)]
        self.records = [RocksKV(str(tmp / f"records{p}")) for p in range(PARTITIONS)]
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self.decided: list[str] = []
        self.offset = 0  # of the sequencer topic

    def close(self) -> None:
        for kv in [self.state, *self.buckets, *self.records]:
            kv.close()

    def run(self, pages: list[Analysed]) -> None:
        offsets = [0] * PARTITIONS
        for start in range(0, len(pages), FRAME):
            t0 = time.process_time()
            msgs = []
            for i, a in enumerate(pages[start : start + FRAME], start):
                p = i % PARTITIONS
                msgs.append(wire.encode(wire.PageMsg(p, offsets[p], PARTITIONS, a)))
                offsets[p] += 1
            frame = wire.frame(msgs)
            self.cpu["forward"] += time.process_time() - t0
            self._sequence([frame])
            # made after the pages reached the sequencer: it vouches for them (``Sequencer``)
            marks = tuple(wire.Mark(p, offsets[p]) for p in range(PARTITIONS))
            self._sequence(
                [wire.frame([wire.encode(wire.MarksMsg(PARTITIONS, marks, time.time()))])]
            )
        while self.stage.flights:
            before = len(self.decided)
            self._sequence([])
            if len(self.decided) == before and not self.stage.flights:
                break

    def _sequence(self, frames: list[bytes]) -> None:
        """A sequencer step over ``frames``, then the routing it causes, until quiet."""
        while True:
            t0 = time.process_time()
            emits: list[Emit] = []
            for raw in frames:
                self.stage.offset = self.offset
                self.offset += 1
                self.stage.arrived = time.time()
                for msg in (wire.decode(item) for item in wire.unframe(raw)):
                    emits += self.stage.accept(msg)
                emits += self.stage.release(200)
                while self.stage.busy():
                    emits += self.stage.release(200)
                self.stage.commit()
            if not frames:
                emits += self.stage.release(200)
                self.stage.commit()
            self.cpu["sequencer"] += time.process_time() - t0
            self.decided += [e.key.decode() for e in emits if e.topic == "decisions" and e.key]
            frames = self._route(emits)
            if not frames:
                return

    def _route(self, emits: list[Emit]) -> list[bytes]:
        """The probes and records partitions' steps over what the sequencer sent: their
        answers, framed as the agents frame them."""
        t0 = time.process_time()
        internal: dict[tuple[str, int], list[bytes]] = {}
        for e in emits:
            if e.topic in ("probes", "records") and e.partition is not None:
                internal.setdefault((e.topic, e.partition), []).append(e.value)
        frames = [wire.frame(values) for values in internal.values()]
        replies: list[bytes] = []
        for (topic, p), raw in zip(internal, frames, strict=True):
            kv = self.buckets[p] if topic == "probes" else self.records[p]
            msgs = [wire.decode_route(item) for item in wire.unframe(raw)]
            replies += map(wire.encode, route_step(self.stage.index, kv, msgs))
        self.cpu["route"] += time.process_time() - t0
        return [wire.frame(replies)] if replies else []


def main() -> None:
    args = micro_args(__doc__ or "")
    cfg = EngineConfig()
    pages = sorted(analysed_pages(args.data, args.pages, cfg), key=lambda a: a.order)
    n = len(pages)
    print(f"{n} analysed pages, {PARTITIONS} partitions, frames of {FRAME}; ms of CPU a page")
    per: dict[str, list[float]] = {s: [] for s in STAGES}
    for r in range(args.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="neardup-stages-"))
        try:
            run = Round(tmp, cfg)
            try:
                run.run(pages)
            finally:
                run.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if sorted(run.decided) != sorted(a.page.page_id for a in pages):
            raise SystemExit(f"round {r + 1}: {len(run.decided)} decisions for {n} pages")
        for s in STAGES:
            per[s].append(1000 * run.cpu[s] / n)
        print(f"  round {r + 1}: " + ", ".join(f"{s} {per[s][-1]:.3f}" for s in STAGES))
    med = {s: statistics.median(v) for s, v in per.items()}
    print("medians: " + ", ".join(f"{s} {med[s]:.3f}" for s in STAGES)
          + f"; all {sum(med.values()):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
