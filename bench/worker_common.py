"""What the worker benchmarks share: CPU meters over process trees, the engine's rate in
this process, the dev pages replayed under new ids, a run's topics and worker processes,
and a broker of the bench's own."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.engine import Engine
from neardup.store import open_state
from tests.integration.helpers import (
    Collector,
    LocalBroker,
    Names,
    WorkerProcess,
    create_topics,
    delete_topics,
    tree_cpu,
    tree_pids,
)


def own_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process, without its children."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of process trees over a window, by sampling ``/proc`` every
    ``interval`` seconds: for every process seen in the trees, its user + system time at
    the last sample less that at the first (0 for one that started later). Processes that
    end, whoever reaps them, keep what the last sample saw (up to ``interval`` of theirs
    is lost); cumulative children's times (which a zygote that dies before reaping its
    workers never passes on) are not used."""

    def __init__(self, roots: list[int], interval: float = 0.25) -> None:
        self.roots, self.interval = roots, interval
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._sample(start=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, start: bool = False) -> None:
        for root in self.roots:
            for pid in tree_pids(root):
                with contextlib.suppress(OSError, IndexError, ValueError):  # it ended
                    cpu = own_cpu(pid)
                    self.first.setdefault(pid, cpu if start else 0.0)
                    self.last[pid] = cpu

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> tuple[float, float]:
        """CPU seconds of the whole trees, and of their roots alone, since the start."""
        self._stop.set()
        self._thread.join()
        self._sample()
        used = {pid: self.last[pid] - self.first[pid] for pid in self.last}
        return sum(used.values()), sum(used.get(pid, 0.0) for pid in self.roots)


@dataclasses.dataclass(frozen=True)
class Rate:
    """Pages/s on the clock, and CPU seconds a page: the whole process tree, and the
    part of it spent in the top processes (the rest is their sandbox children's)."""

    pages_s: float
    cpu: float
    own_cpu: float
    #: The broker's CPU a page in the same window (None: its pid is not known).
    broker_cpu: float | None = None
    #: A worker joined after pages were out: the window holds that rebalance.
    joined_late: bool = False

    def split(self) -> str:
        broker = "" if self.broker_cpu is None else f"; the broker {self.broker_cpu * 1000:.1f}"
        late = "; a worker joined after pages were out" if self.joined_late else ""
        return (
            f"{self.cpu * 1000:5.1f} ms CPU a page ({self.own_cpu * 1000:.1f} in the "
            f"process, {(self.cpu - self.own_cpu) * 1000:.1f} in its sandbox{broker}){late}"
        )


def engine_rate(
    lines: list[bytes], pin: bool = False, state: Path | None = None, retention_days: int = 0
) -> Rate:
    """The embedded engine (``neardup dedup`` without file I/O) in this process, with its
    state in memory, or in RocksDB at ``state`` (as ``neardup dedup --state``): pages/s
    on the clock, and CPU a page (this process and its sandbox children). ``pin``: on
    core 0 only, sandbox child included."""
    if pin:
        every = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {0})  # the sandbox's zygote, started below, inherits it
        try:
            return engine_rate(lines, state=state, retention_days=retention_days)
        finally:
            os.sched_setaffinity(0, every)
    cfg = EngineConfig(retention_days=retention_days)
    if state is not None:
        shutil.rmtree(state, ignore_errors=True)
    engine = Engine(open_state(None if state is None else str(state), cfg), cfg)
    engine.process(parse_raw(lines[0], cfg.max_bytes))  # the sandbox starts
    me = os.getpid()
    c0, o0, t0 = tree_cpu(me), own_cpu(me), time.perf_counter()
    for _ in engine.process_many(parse_raw(line, cfg.max_bytes) for line in lines[1:]):
        pass
    elapsed, cpu, own = time.perf_counter() - t0, tree_cpu(me) - c0, own_cpu(me) - o0
    engine.close()
    if state is not None:
        shutil.rmtree(state, ignore_errors=True)
    n = len(lines) - 1
    return Rate(n / elapsed, cpu / n, own / n)


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
        finally:
            await admin.close()

    asyncio.run(run())


def copies(lines: list[bytes], start: int, stop: int) -> Iterator[bytes]:
    """Pages ``start`` to ``stop`` of the dev stream repeated: each copy under new ids, two
    days after the one before (made one at a time: 100,000 pages are ~16 GB)."""
    for i in range(start, stop):
        msg = json.loads(lines[i % len(lines)])
        copy = i // len(lines)
        msg["url"] = f"{msg['url']}#copy{copy}"
        fetched = dt.datetime.fromisoformat(msg["fetched_at"].replace("Z", "+00:00"))
        later = fetched + dt.timedelta(days=2 * copy)
        msg["fetched_at"] = later.isoformat(timespec="seconds").replace("+00:00", "Z")
        yield json.dumps(msg, ensure_ascii=False).encode()


class Run:
    """Topics of their own, a collector, and worker processes."""

    def __init__(
        self,
        bootstrap: str,
        tmp: Path,
        partitions: int,
        raw_configs: dict[str, str] | None = None,
        *,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        self.bootstrap, self.tmp, self.partitions = bootstrap, tmp, partitions
        tmp.mkdir(parents=True, exist_ok=True)
        self.names = Names()
        if raw_configs:
            create_topic(bootstrap, self.names.raw, partitions, raw_configs)
        else:
            create_topics(bootstrap, {self.names.raw: partitions})
        self.collector = Collector(bootstrap, [self.names.decisions, self.names.rejects])
        self.workers: list[WorkerProcess] = []
        self.worker_env = worker_env or {}

    def worker(self, i: int) -> WorkerProcess:
        w = WorkerProcess(
            self.bootstrap,
            self.names,
            self.partitions,
            self.tmp / f"w{i}",
            self.tmp / f"w{i}.log",
        )
        w.env["NEARDUP_MARK_INTERVAL_MS"] = "500"  # the worker's default, not the tests' 200
        w.env.update(self.worker_env)
        self.workers.append(w)
        return w

    def outputs(self) -> int:
        """Decisions and dead letters read so far (a page answered twice counts twice)."""
        return len(self.collector.messages[self.names.decisions]) + len(
            self.collector.messages[self.names.rejects]
        )

    def answered(self) -> int:
        """Distinct pages with a decision or a dead letter read so far."""
        ids = {
            m.get("page_id") or m.get("url")
            for topic in (self.names.decisions, self.names.rejects)
            for m in self.collector.messages[topic]
        }
        return len(ids)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.collector.close()
        # a run of three passes leaves some 2 GB of topics on the broker
        try:
            delete_topics(self.bootstrap, self.names.prefix)
        except Exception as exc:  # the broker gone: the run's own error matters more
            print(f"the run's topics were not deleted: {exc!r}", file=sys.stderr)


def pin_tree(root: int, cpu: int | set[int]) -> None:
    """Every thread of a process and of its descendants now alive onto one core, or a set
    of cores (threads and processes started later inherit it from the one that starts
    them)."""
    cpus = {cpu} if isinstance(cpu, int) else cpu
    for pid in tree_pids(root):
        with contextlib.suppress(OSError):  # ended while we looked
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def broker_on(broker_pid: int | None, cpu: int | None) -> Iterator[None]:
    """The broker's threads on core ``cpu`` only for the block, then on every core again
    (``cpu`` or ``broker_pid`` None: nothing changes)."""
    if broker_pid is None or cpu is None:
        yield
        return
    pin_tree(broker_pid, cpu)
    try:
        yield
    finally:
        pin_tree(broker_pid, set(range(os.cpu_count() or 1)))


def broker_pid(run_dir: Path) -> int | None:
    """The pid of scripts/kafka-local.sh's broker in ``run_dir`` (None if not running)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((run_dir / "kafka.pid").read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"kafka.Kafka" in fh.read():
                return pid
    return None


def local_broker() -> LocalBroker:
    # Kafka's default group delay (the script's is 0, for tests): workers started together
    # then form one group, as on a production broker, instead of the first one starting
    # alone and the others' joining rebalancing it in the measured window
    broker = LocalBroker(
        Path(tempfile.mkdtemp(prefix="neardup-kafka-bench-")),
        {"NEARDUP_KAFKA_GROUP_DELAY_MS": "3000"},
    )
    broker.run("start")
    return broker
