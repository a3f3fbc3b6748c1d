"""The exactly-once task runtime (``neardup.kafka.delivery``) on a pass-through step.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/delivery.py \\
        [--records 40000] [--size 40] [--tasks 2] [--state] [--commit-min-ms 50]

Makes topics of its own (``bench-<random>``: input, output and changelog, ``--tasks``
partitions each), produces ``--records`` messages of ``--size`` bytes (not measured),
then runs one worker in this process until every record is committed. The step sends
each record on to the output partition of its input partition; with ``--state`` it also
puts one key a record (so each commit carries changelog records and a RocksDB write).
Prints the commit step's duration (begin to RocksDB written) and this process's CPU a
record over the run, from the first record read; asserts nothing. The topics are
deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neardup.kafka.assignor import Task
from neardup.kafka.delivery import Config, Out, Record
from neardup.kafka.runtime import Runtime
from neardup.kafka.taskstate import Overlay


@dataclass(frozen=True)
class Names:
    prefix: str

    def layout(self, counts: Mapping[str, int]) -> list[Task]:
        n = counts.get(f"{self.prefix}.in", 0)
        return [
            Task(
                f"task-{i}",
                (TopicPartition(f"{self.prefix}.in", i),),
                TopicPartition(f"{self.prefix}-changelog", i),
            )
            for i in range(n)
        ]


@dataclass
class PassThrough:
    out_topic: str
    state: bool

    def on_records(self, records: Sequence[Record], kv: Overlay, out: Out) -> None:
        send = out.send
        for r in records:
            send(self.out_topic, r.partition, r.key, r.value)
        if self.state:
            kv.put_many((r.key or b"", r.value or b"") for r in records)

    def on_tick(self, now: float, kv: Overlay, out: Out, caught_up: bool) -> None:
        pass


async def setup(bootstrap: str, prefix: str, tasks: int, records: int, size: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        compact = {"cleanup.policy": "compact"}
        await admin.create_topics(
            [
                NewTopic(f"{prefix}.in", tasks, 1),
                NewTopic(f"{prefix}.out", tasks, 1),
                NewTopic(f"{prefix}-changelog", tasks, 1, topic_configs=compact),
            ]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        value = os.urandom(size // 2).hex().encode()[:size]
        futures = []
        for p in range(tasks):
            batch = producer.create_batch()
            for i in range(p, records, tasks):
                key = b"k%d" % (i % 5000)
                if batch.append(key=key, value=value, timestamp=None) is None:
                    futures.append(await producer.send_batch(batch, f"{prefix}.in", partition=p))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
            futures.append(await producer.send_batch(batch, f"{prefix}.in", partition=p))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def measure(cfg: Config, names: Names, records: int, state: bool) -> None:
    rt = Runtime(cfg, names.layout, lambda task: PassThrough(f"{names.prefix}.out", state))
    await rt.start()
    run = asyncio.create_task(rt.run())
    started: tuple[float, float] | None = None
    while True:
        if started is None and rt.records:
            started = (time.perf_counter(), time.process_time())
        done = rt.records >= records and rt.tasks and not any(r.pending for r in rt.tasks.values())
        if done or run.done():
            break
        await asyncio.sleep(0.01)
    wall, cpu = time.perf_counter(), time.process_time()
    ntasks = len(rt.tasks)
    rt.stop()
    await run
    await rt.close()
    assert started is not None
    commits = sorted(rt.commit_seconds)
    ms = [c * 1000 for c in commits]
    print(f"records {rt.records}, tasks {ntasks}, state writes {'on' if state else 'off'}")
    print(f"wall {wall - started[0]:.2f} s, CPU {cpu - started[1]:.2f} s (from the first record)")
    print(f"client CPU a record: {(cpu - started[1]) / rt.records * 1e6:.1f} us")
    print(
        f"commits {len(ms)} ({rt.records / max(len(ms), 1):.0f} records each); commit step ms: "
        f"median {statistics.median(ms):.1f}, p90 {ms[int(len(ms) * 0.9)]:.1f}, max {ms[-1]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40000)
    parser.add_argument("--size", type=int, default=40)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--state", action="store_true")
    parser.add_argument("--commit-min-ms", type=int, default=50)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (scripts/kafka-local.sh start prints it)")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    names = Names(prefix)
    asyncio.run(setup(bootstrap, prefix, args.tasks, args.records, args.size))
    with tempfile.TemporaryDirectory() as state_dir:
        cfg = Config(
            bootstrap=bootstrap,
            app=prefix,
            topics=(f"{prefix}.in",),
            state_dir=state_dir,
            commit_min_ms=args.commit_min_ms,
        )
        asyncio.run(measure(cfg, names, args.records, args.state))
    asyncio.run(delete(bootstrap, prefix))


async def delete(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([f"{prefix}.in", f"{prefix}.out", f"{prefix}-changelog"])
    finally:
        await admin.close()


if __name__ == "__main__":
    main()
