"""What the integration tests share: topics with unique names, producing and consuming,
worker processes, the stream and the sequential reference (``neardup dedup``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neardup.cli import main as neardup
from neardup.contract import derive_page_id
from neardup.engine import page_order
from tests.corpus import line
from tests.gold import gold_stream

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample.jsonl"


# -- waiting -------------------------------------------------------------------------------


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2
) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# -- the stream ----------------------------------------------------------------------------


def _sort_key(value: bytes) -> tuple[int, int, str]:
    try:
        msg = json.loads(value)
        page_id = msg.get("page_id") or derive_page_id(msg["url"])
        return (1, page_order(msg["fetched_at"]), page_id)
    except (ValueError, KeyError, TypeError):
        return (0, 0, "")  # rejected whatever its place


def stream(seeds: Iterable[int] = (2026, 7, 11)) -> list[bytes]:
    """Raw-page messages: gold streams (their URLs made unique per seed, each seed an hour
    later) and the bundled sample, in (fetched_at, page_id) order, which is the order the
    worker decides in (see ``neardup.kafka.sequence``)."""
    values: list[bytes] = []
    for n, seed in enumerate(seeds):
        messages, _ = gold_stream(seed)
        for original in messages:
            msg = dict(original)
            msg["url"] = f"{msg['url']}?s={seed}"
            hour = int(msg["fetched_at"][11:13]) + 2 * n
            msg["fetched_at"] = f"{msg['fetched_at'][:11]}{hour:02d}{msg['fetched_at'][13:]}"
            values.append(line(msg).encode())
    values += [raw.rstrip(b"\n") for raw in SAMPLE.read_bytes().splitlines(keepends=True)]
    return sorted(values, key=_sort_key)


def message_key(value: bytes) -> bytes:
    """The producer's key: the URL, or the whole value for a message that is not JSON."""
    try:
        return str(json.loads(value)["url"]).encode()
    except (ValueError, KeyError, TypeError):
        return value[:64]


@dataclass
class Reference:
    decisions: list[dict[str, Any]]
    clusters: dict[str, str]
    rejects: list[dict[str, Any]]


def reference(values: list[bytes], tmp: Path) -> Reference:
    """``neardup dedup`` over the same messages in the same order."""
    pages = tmp / "stream.jsonl"
    pages.write_bytes(b"".join(v + b"\n" for v in values))
    out, clusters, rejects = tmp / "ref-decisions.jsonl", tmp / "ref-clusters.jsonl", tmp / "r"
    neardup(
        [
            "dedup",
            str(pages),
            "--out",
            str(out),
            "--clusters",
            str(clusters),
            "--rejects",
            str(rejects),
            "-q",
        ]
    )

    def read(p: Path) -> list[dict[str, Any]]:
        return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()]

    return Reference(
        read(out), {c["page_id"]: c["cluster_id"] for c in read(clusters)}, read(rejects)
    )


def stable(decision: dict[str, Any]) -> tuple[Any, ...]:
    """A decision without its time: what must be equal between runs."""
    return tuple(sorted((k, json.dumps(v)) for k, v in decision.items() if k != "decided_at"))


def fold(decisions: Iterable[dict[str, Any]], merges: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Final clusters: each page's cluster at decision time, then every merge (a union of
    two roots, the older absorbing the younger) applied, in whatever order they came."""
    parent: dict[str, str] = {}
    for m in merges:
        parent[m["from_cluster"]] = m["into_cluster"]

    def root(c: str) -> str:
        seen = set()
        while c in parent and c not in seen:
            seen.add(c)
            c = parent[c]
        return c

    return {d["page_id"]: root(d["cluster_id"]) for d in decisions}


# -- Kafka ---------------------------------------------------------------------------------


#: Every prefix a ``Names`` was made with in this process: the topics to delete at the
#: end of a test session on a broker that outlives it (``tests/integration/conftest.py``).
USED_PREFIXES: set[str] = set()


def _new_prefix() -> str:
    prefix = f"it-{uuid.uuid4().hex[:10]}"
    USED_PREFIXES.add(prefix)
    return prefix


@dataclass
class Names:
    """Unique topic names and app id for one test."""

    prefix: str = field(default_factory=_new_prefix)

    @property
    def app_id(self) -> str:
        return self.prefix

    @property
    def raw(self) -> str:
        return f"{self.prefix}.raw"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}.decisions"

    @property
    def merges(self) -> str:
        return f"{self.prefix}.merges"

    @property
    def rejects(self) -> str:
        return f"{self.prefix}.rejects"


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
        finally:
            await admin.close()

    asyncio.run(run())


def list_topics(bootstrap: str) -> set[str]:
    """The names of every topic on the broker."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def run() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(run())


def delete_topics(bootstrap: str, prefix: str | Iterable[str]) -> list[str]:
    """Delete every topic whose name is ``prefix`` (or one of several) followed by ``.``
    or ``-`` (one run's topics: its own and its workers' internal ones); returns their
    names. A broker kept for many runs fills its disk otherwise."""
    from aiokafka.admin import AIOKafkaAdminClient

    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    starts = tuple(f"{p}{sep}" for p in prefixes for sep in ".-")

    async def run() -> list[str]:
        if not starts:
            return []
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            names = sorted(t for t in await admin.list_topics() if t.startswith(starts))
            if names:
                await admin.delete_topics(names)
            return names
        finally:
            await admin.close()

    return asyncio.run(run())


def changelog_state(bootstrap: str, topic: str, partition: int, end: int) -> dict[bytes, bytes]:
    """What a task store mirroring a changelog partition holds once it has applied the
    partition's committed records below offset ``end`` (``neardup.kafka.taskstate``): each
    key's last value, keys whose last record is a tombstone left out, and the runtime's own
    (the state's format) too. Read with
    read_committed, as a restore reads: records of aborted transactions never count."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from neardup.kafka.taskstate import RESERVED

    async def run() -> dict[bytes, bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            state: dict[bytes, bytes | None] = {}
            deadline = time.monotonic() + 60
            while await consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topic}[{partition}] not read to offset {end}")
                fetched = await consumer.getmany(tp, timeout_ms=500)
                for record in fetched.get(tp, []):
                    if record.offset < end and not record.key.startswith(RESERVED):
                        state[record.key] = record.value
            return {k: v for k, v in state.items() if v is not None}
        finally:
            await consumer.stop()

    return asyncio.run(run())


def end_offsets(bootstrap: str, topics: dict[str, int]) -> dict[tuple[str, int], int]:
    """The end offset of every partition of ``topics`` (name: partition count)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict[tuple[str, int], int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
            ends = await consumer.end_offsets(tps)
            return {(tp.topic, tp.partition): int(n) for tp, n in ends.items()}
        finally:
            await consumer.stop()

    return asyncio.run(run())


def task_stores(state_dir: Path) -> dict[str, Path]:
    """A stopped worker's task stores (``neardup.kafka.delivery``: ``<state_dir>/<task>``)
    by task name."""
    return {p.name: p for p in sorted(state_dir.iterdir()) if (p / "CURRENT").is_file()}


def read_store(path: Path) -> tuple[str | None, int, dict[bytes, bytes]]:
    """A stopped worker's task store: the changelog partition it mirrors (``topic:n``),
    the next changelog offset it holds, and its items but the runtime's own keys."""
    from neardup.kafka.taskstate import items, stored_offset
    from neardup.store import RocksKV

    kv = RocksKV(str(path), read_only=True)
    try:
        source, offset = stored_offset(kv)
        return source, offset, dict(items(kv))
    finally:
        kv.close()


def stores_match_changelogs(
    bootstrap: str, workers: list[WorkerProcess]
) -> dict[Path, tuple[tuple[str, int], int]]:
    """Every task store the stopped ``workers`` keep holds exactly what the committed
    records of its changelog partition hold below the offset stored in it. Returns each
    store's changelog partition and that offset."""
    offsets: dict[Path, tuple[tuple[str, int], int]] = {}
    for w in workers:
        stores = task_stores(Path(w.env["NEARDUP_STATE_DIR"]))
        assert stores, f"no task stores in {w.env['NEARDUP_STATE_DIR']}"
        for path in stores.values():
            source, offset, kept = read_store(path)
            assert source is not None, f"{path} names no changelog"
            topic, _, partition = source.rpartition(":")
            want = changelog_state(bootstrap, topic, int(partition), offset)
            missing = want.keys() - kept.keys()
            extra = kept.keys() - want.keys()
            wrong = [k for k in want.keys() & kept.keys() if want[k] != kept[k]]
            assert not (missing or extra or wrong), (
                f"{path} (below offset {offset}): {len(missing)} keys missing, {len(extra)} "
                f"not in the changelog, {len(wrong)} with other values"
            )
            offsets[path] = ((topic, int(partition)), offset)
    return offsets


def produce(bootstrap: str, topic: str, values: Iterable[bytes], *, transaction: int = 0) -> None:
    """Produce ``values`` in order (keyed by URL) and wait until all are acknowledged;
    ``transaction``: in transactions of that many messages each (the broker writes a
    commit marker after each one, at an offset of its own that holds no message)."""
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            max_request_size=32 * 1024 * 1024,
            linger_ms=5,
            transactional_id=f"it-{uuid.uuid4().hex[:10]}" if transaction else None,
        )
        await producer.start()
        try:
            if not transaction:
                futures = [await producer.send(topic, v, key=message_key(v)) for v in values]
                await producer.flush()
                for f in futures:
                    await f
                return
            items = list(values)
            for at in range(0, len(items), transaction):
                async with producer.transaction():
                    for v in items[at : at + transaction]:
                        await producer.send(topic, v, key=message_key(v))
        finally:
            await producer.stop()

    asyncio.run(run())


class Collector:
    """Reads output topics from the beginning, in a background thread of its own.
    ``client`` adds keyword arguments of aiokafka's consumer (security)."""

    def __init__(
        self, bootstrap: str, topics: list[str], client: dict[str, Any] | None = None
    ) -> None:
        import threading

        self.bootstrap = bootstrap
        self.topics = topics
        self.client = client or {}
        self.messages: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
        #: When each message was read (time.time()), beside ``messages``.
        self.times: dict[str, list[float]] = {t: [] for t in topics}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
            metadata_max_age_ms=1000,
            # what downstream consumers must do: the partitioned worker's aborted
            # transactions leave records that only read_uncommitted readers see
            isolation_level="read_committed",
            **self.client,
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                now = time.time()
                for tp, records in batch.items():
                    for r in records:
                        self.messages[tp.topic].append(json.loads(r.value))
                        self.times[tp.topic].append(now)
        finally:
            await consumer.stop()

    def get(self, topic: str) -> list[dict[str, Any]]:
        return list(self.messages[topic])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- worker processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP (v4 and v6) addresses process ``pid`` listens on, from ``/proc`` (Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            raw = b"".join(
                bytes.fromhex(addr_hex[i : i + 8])[::-1] for i in range(0, len(addr_hex), 8)
            )
            found.add((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


class WorkerProcess:
    """``python -m neardup.kafka worker`` with its own state directory and HTTP port."""

    def __init__(
        self,
        bootstrap: str,
        names: Names,
        partitions: int,
        state_dir: Path,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        loglevel: str = "info",
    ) -> None:
        self.port = free_port()
        self.log = log
        self.loglevel = loglevel
        self.env = {
            **os.environ,
            "NEARDUP_BROKERS": bootstrap,
            "NEARDUP_APP_ID": names.app_id,
            "NEARDUP_TOPIC_RAW": names.raw,
            "NEARDUP_TOPIC_DECISIONS": names.decisions,
            "NEARDUP_TOPIC_MERGES": names.merges,
            "NEARDUP_TOPIC_REJECTS": names.rejects,
            "NEARDUP_PARTITIONS": str(partitions),
            "NEARDUP_STATE_DIR": str(state_dir),
            "NEARDUP_HTTP_PORT": str(self.port),
            "NEARDUP_MARK_INTERVAL_MS": "200",
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        #: Stopped or killed on purpose.
        self.ended = False
        #: RLIMIT_FSIZE of the worker process (None: the inherited one).
        self.fsize: int | None = None

    def start(self) -> WorkerProcess:
        fh = self.log.open("ab")
        self.ended = False
        argv = [sys.executable, "-m", "neardup.kafka", "worker", "-l", self.loglevel]
        if self.fsize is not None:  # set in the child, which then becomes the worker
            launch = (
                "import os, resource, sys; "
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({self.fsize}, {self.fsize})); "
                "os.execv(sys.argv[1], sys.argv[1:])"
            )
            argv = [sys.executable, "-c", launch, *argv]
        self.proc = subprocess.Popen(
            argv, env=self.env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT
        )
        fh.close()
        return self

    def get(self, path: str) -> int:
        return self.fetch(path)[0]

    def fetch(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the worker's endpoint: status and body (0 and "" if it does not
        answer)."""
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status), r.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed."""
        self.ended = True
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60) -> None:
        self.ended = True
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# -- a broker of one's own ------------------------------------------------------------------


def free_port_pair() -> int:
    """A loopback port whose successor is free too (the script's controller port)."""
    for _ in range(50):
        port = free_port()
        if port < 65535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no pair of free loopback ports")


class LocalBroker:
    """A broker of its own (``scripts/kafka-local.sh``) on free loopback ports, in
    ``run_dir``; ``env`` adds the script's other settings (its secured mode, say)."""

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port_pair()
        self.run_dir = run_dir
        self.env = {
            **os.environ,
            **(env or {}),
            "NEARDUP_KAFKA_DIR": str(run_dir),
            "NEARDUP_KAFKA_PORT": str(self.port),
        }
        self.bootstrap = f"127.0.0.1:{self.port}"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The script with ``args``; a first start may fetch the jars with Maven."""
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "kafka-local.sh"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kafka-local.sh {args}: {done.stderr[-2000:]}")
        return done

    def cluster_id(self) -> str:
        meta = (self.run_dir / "data" / "meta.properties").read_text()
        return next(x.split("=", 1)[1] for x in meta.splitlines() if x.startswith("cluster.id"))

    def config(self, *args: str) -> None:
        """``kafka-configs.sh`` (``kafka.admin.ConfigCommand``) against this broker."""
        version = os.environ.get("NEARDUP_KAFKA_VERSION", "4.1.1")
        cache = os.environ.get(
            "NEARDUP_KAFKA_CACHE", str(Path.home() / ".cache" / "neardup" / f"kafka-{version}")
        )
        cmd = ["java", "-cp", f"{cache}/libs/*", "kafka.admin.ConfigCommand"]
        subprocess.run(
            [*cmd, "--bootstrap-server", self.bootstrap, *args],
            check=True,
            capture_output=True,
            timeout=120,
        )


# -- one test's deployment -----------------------------------------------------------------


class Deployment:
    """Unique topics, a collector on the outputs and worker processes, for one test."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.names = Names()
        create_topics(bootstrap, {self.names.raw: partitions})
        self.collector = Collector(
            bootstrap, [self.names.decisions, self.names.merges, self.names.rejects]
        )
        self.workers: list[WorkerProcess] = []

    def worker(self, index: int, env: dict[str, str] | None = None) -> WorkerProcess:
        """A worker process; ``index`` names its state directory and log (a worker
        restarted with the same index keeps its state directory); ``env``: settings of
        its own."""
        w = WorkerProcess(
            self.bootstrap,
            self.names,
            self.partitions,
            self.tmp / f"worker{index}",
            self.tmp / f"worker{index}.log",
            env=env,
        )
        self.workers.append(w)
        return w

    def produce(self, values: Iterable[bytes], *, transaction: int = 0) -> None:
        produce(self.bootstrap, self.names.raw, values, transaction=transaction)

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """``wait_for``, failing at once if a worker that should run has died."""

        def check() -> bool:
            dead = [w for w in self.workers if w.proc is not None and not w.alive() and not w.ended]
            if dead:
                raise AssertionError(f"worker {dead[0].log.name} died:\n{dead[0].tail(40)}")
            return condition()

        try:
            wait_for(check, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.where()}") from None

    def where(self) -> str:
        """Where each live worker is (``neardup.kafka.dump``: SIGUSR1, answered in its
        log), for a failure that a worker went quiet."""
        live = [w for w in self.workers if w.alive()]
        sizes = {}
        for w in live:
            sizes[w.log] = w.log.stat().st_size
            assert w.proc is not None
            if _catches(w.proc.pid, signal.SIGUSR1):  # else SIGUSR1 would end it
                w.proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        parts = []
        for w in live:
            with w.log.open("rb") as fh:
                fh.seek(sizes[w.log])
                text = fh.read().decode(errors="replace")
            at = text.find("SIGUSR1: where the worker is")
            said = (
                "\n".join(text[at:].splitlines()[:250])
                if at >= 0
                else "(no answer: its event loop is blocked?)"
            )
            parts.append(f"--- {w.log.name}, its last warnings\n{warnings(w.log, sizes[w.log])}")
            parts.append(f"--- {w.log.name}, where it is\n{said}")
        return "\n".join(parts)

    def decisions(self) -> list[dict[str, Any]]:
        return self.collector.get(self.names.decisions)

    def merges(self) -> list[dict[str, Any]]:
        return self.collector.get(self.names.merges)

    def rejects(self) -> list[dict[str, Any]]:
        return self.collector.get(self.names.rejects)

    def decided(self) -> set[str]:
        return {d["page_id"] for d in self.decisions()}

    def logs(self) -> str:
        return "\n".join(f"--- {w.log.name}\n{w.tail()}" for w in self.workers)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.collector.close()


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc, Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((x.split()[1] for x in status.splitlines() if x.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)


# -- what every fault test checks ----------------------------------------------------------


def check_against(ref: Reference, d: Deployment) -> None:
    """Every page decided once (copies identical), the same decisions and final clusters as
    the sequential engine, and the same dead letters."""
    by_page: dict[str, list[dict[str, Any]]] = {}
    for dec in d.decisions():
        by_page.setdefault(dec["page_id"], []).append(dec)
    conflicting = {p: ds for p, ds in by_page.items() if any(x != ds[0] for x in ds)}
    assert not conflicting, f"conflicting decisions: {conflicting}"
    got = {stable(ds[0]) for ds in by_page.values()}
    want = {stable(x) for x in ref.decisions}
    if got != want:
        wanted = {json.loads(dict(x)["page_id"]): x for x in want}
        lines = []
        for x in sorted(got - want)[:5]:
            pid = json.loads(dict(x)["page_id"])
            lines.append(f"  got  {dict(x)}\n  want {dict(wanted.get(pid, ()))}")
        detail = "\n".join(lines)
        raise AssertionError(
            f"{len(got - want)} decisions differ, {len(want - got)} missing:\n{detail}"
        )
    assert fold([ds[0] for ds in by_page.values()], d.merges()) == ref.clusters

    # at least once, like decisions: a dead letter may come again after a rebalance, as an
    # identical copy (but for its time); the set of dead letters must be the reference's
    def letters(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted({(r["page_id"], r["url"], r["reason"]) for r in rows})

    assert letters(d.rejects()) == letters(ref.rejects)


def warnings(log: Path, size: int, last: int = 20) -> str:
    """The last ``last`` lines of ``log`` up to ``size`` bytes at level WARNING or above
    (what a worker said of a fault, before the dump that follows them)."""
    with log.open("rb") as fh:
        text = fh.read(size).decode(errors="replace")
    said = [
        line[:400]
        for line in text.splitlines()
        if any(level in line for level in ("WARNING", "ERROR", "CRITICAL"))
    ]
    return "\n".join(said[-last:]) or "(none)"


def all_out(ref: Reference, d: Deployment) -> bool:
    pages = {x["page_id"] for x in ref.decisions}
    return d.decided() >= pages and len(d.rejects()) >= len(ref.rejects)


def check_after_fault(values: list[bytes], ref: Reference, d: Deployment) -> tuple[int, int]:
    """After a fault: nothing lost and nothing decided twice (``accounted``), and the same
    decisions and clusters as ``neardup dedup`` (no page released late: docs/faults.md, Order)."""
    pages, out = accounted(values, ref, d)
    check_against(ref, d)
    return pages, out


def accounted(values: list[bytes], ref: Reference, d: Deployment) -> tuple[int, int]:
    """Pages in, and distinct decisions plus distinct rejections out; asserts that each
    input page got exactly one of the two (never both, never neither)."""
    decided = d.decided()
    rejected = {(r["page_id"], r["url"]) for r in d.rejects()}
    assert not decided & {pid for pid, _ in rejected}, "a page both decided and rejected"
    assert len(ref.decisions) + len(ref.rejects) == len(values)
    out = len(decided) + len(rejected)
    assert out == len(values), f"{len(values)} pages in, {out} out"
    return len(values), out


def _tree_fields(root: int, field: int) -> dict[int, int]:
    """Field ``field`` of /proc/<pid>/stat (counted after the command name) of a process
    and of each of its descendants now alive, by pid."""
    parents: dict[int, int] = {}
    values: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended while we looked
        parents[int(entry)] = int(fields[1])
        values[int(entry)] = int(fields[field])
    out = {}
    for pid, value in values.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            out[pid] = value
    return out


def _tree_sum(root: int, field: int) -> int:
    """The sum of field ``field`` of /proc/<pid>/stat over a process and all its
    descendants now alive."""
    return sum(_tree_fields(root, field).values())


def tree_pids(root: int) -> list[int]:
    """A process and its descendants now alive."""
    return list(_tree_fields(root, 1))


def tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants now alive."""
    return _tree_sum(root, 21) * os.sysconf("SC_PAGE_SIZE")


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants, those now alive
    and those that ended and were reaped by one of them (the engine analyses pages in
    sandbox children, which are replaced when one retires, times out or crashes)."""
    ticks = os.sysconf("SC_CLK_TCK")
    # fields 11-12: the process's own time; 13-14: that of its children it has waited for
    return sum(_tree_sum(root, field) for field in (11, 12, 13, 14)) / ticks
