"""Reading fetched raw pages: aiokafka's own CRC check against ``neardup.kafka.crc``.

    python bench/crc.py [--data DIR] [--pages N (0: all)] [--rounds R]

The dev pages become v2 record batches, one page a batch (a page is larger than a
producer's default batch), cut into fetches of ``STREAM_FETCH_BYTES`` as the broker
returns them; each round reads them all through aiokafka's ``PartitionRecords``, once
with aiokafka's check and once with the worker's, alternating. Prints the median time a
page of each and their ratio; asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import micro_args, raw_lines


def batches(values: list[bytes]) -> list[bytes]:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    out = []
    for offset, value in enumerate(values):
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, len(value) + 1024)
        builder.append(0, timestamp=None, key=None, value=value, headers=[])
        data = bytearray(builder.build())
        data[0:8] = offset.to_bytes(8, "big")  # the broker sets the base offset
        out.append(bytes(data))
    return out


def fetches(batches: list[bytes], size: int) -> list[bytes]:
    out, current = [], b""
    for batch in batches:
        if current and len(current) + len(batch) > size:
            out.append(current)
            current = b""
        current += batch
    return [*out, current] if current else out


def read(fetched: list[bytes], memory_records: Any, partition_records: Any) -> float:
    from aiokafka.consumer import fetcher
    from aiokafka.structs import TopicPartition

    tp = TopicPartition("raw", 0)
    start = time.perf_counter()
    for data in fetched:
        records = memory_records(data)
        part = partition_records(tp, records, None, 0, None, None, True, fetcher.READ_UNCOMMITTED)
        for _ in part:
            pass
    return time.perf_counter() - start


def main() -> None:
    args = micro_args(__doc__ or "")
    from aiokafka.consumer import fetcher

    from neardup.kafka import crc
    from neardup.kafka.app import STREAM_FETCH_BYTES

    values = [line.rstrip(b"\n") for line in raw_lines(args.data / "pages.jsonl.gz")]
    values = values[: args.pages] if args.pages else values
    fetched = fetches(batches(values), STREAM_FETCH_BYTES)
    mean = sum(map(len, values)) / len(values)
    print(f"{len(values)} pages ({mean / 1024:.0f} KiB a page), {len(fetched)} fetches")
    theirs = (fetcher.MemoryRecords, fetcher.PartitionRecords)
    crc.install()
    ours = (fetcher.MemoryRecords, fetcher.PartitionRecords)
    if ours == theirs:
        sys.exit("neardup.kafka.crc did not install (see its warning)")
    times: dict[str, list[float]] = {"aiokafka": [], "neardup.kafka.crc": []}
    for _ in range(args.rounds):
        times["aiokafka"].append(read(fetched, *theirs))
        times["neardup.kafka.crc"].append(read(fetched, *ours))
    medians = {name: statistics.median(t) / len(values) * 1e6 for name, t in times.items()}
    for name, us in medians.items():
        print(f"{name:18} {us:7.1f} us a page (median of {args.rounds} rounds)")
    print(f"ratio {medians['aiokafka'] / medians['neardup.kafka.crc']:.1f}x")


if __name__ == "__main__":
    main()
