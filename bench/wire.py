"""The worker's internal page message: the standard json module against orjson.

    .venv/bin/python bench/wire.py [--data DIR] [--pages 300] [--rounds 5]

Analyses the first dev pages in this process, builds the ``PageMsg`` the analyse agent
sends the sequencer for each, and times, side by side, encoding it, parsing it, and
decoding it with its fields (``wire._from``), with each library. Prints medians of the
rounds in microseconds a page; asserts nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import analysed_pages, micro_args
from neardup.config import EngineConfig
from neardup.kafka import wire


def _median_us(f: Callable[[Any], object], xs: Sequence[Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in xs:
            f(x)
        times.append((time.perf_counter() - t0) / len(xs) * 1e6)
    return statistics.median(times)


def main() -> None:
    args = micro_args(__doc__ or "")
    pages = analysed_pages(args.data, args.pages, EngineConfig())
    msgs = [wire.PageMsg(0, i, 4, a, 1.0, i) for i, a in enumerate(pages)]

    def body(m: wire.PageMsg) -> dict[str, Any]:
        return {"v": wire.WIRE_VERSION, **wire._body(m)}

    def with_json(m: wire.PageMsg) -> bytes:
        return json.dumps(body(m), ensure_ascii=False, separators=(",", ":")).encode()

    def with_orjson(m: wire.PageMsg) -> bytes:
        return orjson.dumps(body(m))

    raws = [with_orjson(m) for m in msgs]
    assert all(json.loads(r) == orjson.loads(with_json(m)) for r, m in zip(raws, msgs, strict=True))
    mean = sum(map(len, raws)) // len(raws)
    print(f"{len(msgs)} analysed pages, {mean} bytes a message on average; microseconds a page:")
    rows: list[tuple[str, Callable[[Any], object], Callable[[Any], object], Sequence[Any]]] = [
        ("encode", with_json, with_orjson, msgs),
        ("parse", json.loads, orjson.loads, raws),
        (
            "decode with fields",
            lambda r: wire._from(json.loads(r)),
            lambda r: wire._from(orjson.loads(r)),
            raws,
        ),
    ]
    for name, slow, fast, xs in rows:
        us_json, us_orjson = _median_us(slow, xs, args.rounds), _median_us(fast, xs, args.rounds)
        print(
            f"  {name:20s} json {us_json:6.1f}   orjson {us_orjson:6.1f}"
            f"   x{us_orjson / us_json:.2f}"
        )


if __name__ == "__main__":
    main()
