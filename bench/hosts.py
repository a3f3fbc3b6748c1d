"""The template filter's state under a stream of pages from ever new hosts.

    .venv/bin/python bench/hosts.py [--per-day 4000] [--idle-days 2] [--pages 120000]
                                    [--strings 40] [--reports 6] [--dir DIR]

Every page comes from a host never seen before, ``--per-day`` new hosts a fetch day, with
``--strings`` random period strings: the worst case for the number of hosts, which
``template_idle_days`` bounds (hosts idle longer are swept). The filter runs
on RocksDB (``RocksKV``, each page's writes in one batch, as ``neardup dedup --state``
writes them). Prints, ``--reports`` times over the run: the hosts, day lists and
template counts held, the hosts dropped so far, the bytes on disk (after a flush; a
compaction may or may not have run), and the filter's CPU a page so far (the reports'
own key counts left out).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neardup.config import EngineConfig
from neardup.store import BufferedKV, RocksKV
from neardup.template import TemplateFilter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-day", type=int, default=4000, help="new hosts a fetch day")
    ap.add_argument("--idle-days", type=int, default=2, help="template_idle_days")
    ap.add_argument("--pages", type=int, default=120_000)
    ap.add_argument("--strings", type=int, default=40, help="period strings a page")
    ap.add_argument("--reports", type=int, default=6)
    ap.add_argument("--dir", default=None, help="where the state goes (default: a temp dir)")
    args = ap.parse_args()

    where = Path(args.dir or tempfile.mkdtemp(prefix="neardup-hosts-"))
    inner = RocksKV(str(where / "state"), cache_mb=64)
    kv = BufferedKV(inner)
    templates = TemplateFilter(kv, EngineConfig(template_idle_days=args.idle_days))
    rng = random.Random(1)
    every = max(1, args.pages // args.reports)
    print(
        f"template_idle_days {args.idle_days}, {args.per_day} new hosts a day, "
        f"{args.strings} strings a page, a new host a page"
    )
    t0 = time.process_time()
    counting = 0.0  # CPU of the reports' key counts, left out of the CPU a page
    try:
        for page in range(1, args.pages + 1):
            strings = [rng.getrandbits(63) for _ in range(args.strings)]
            order = (page // args.per_day) * 86_400_000
            templates.filter(f"h{page}.example.cn", strings, order=order)
            kv.commit()
            if page % every == 0:
                r0 = time.process_time()
                held = {b"H": 0, b"D": 0, b"T": 0}
                for key in inner._db.keys():  # noqa: SIM118 (a Rdict, not a dict)
                    prefix = bytes(cast("bytes", key)[:1])
                    if prefix in held:
                        held[prefix] += 1
                inner._db.flush()
                cpu_ms = 1e3 * (r0 - t0 - counting) / page
                print(
                    f"pages {page:>8,}: hosts {held[b'H']:,}, day lists {held[b'D']:,}, "
                    f"counts {held[b'T']:,}, dropped {templates.hosts_evicted:,}, "
                    f"{inner.approximate_size() / 1e6:.1f} MB on disk, "
                    f"{cpu_ms:.3f} ms CPU a page so far",
                    flush=True,
                )
                counting += time.process_time() - r0
    finally:
        inner.close()
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
