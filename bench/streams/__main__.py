"""Write the held-out stream: ``python -m bench.streams --out DIR [--seed N]``."""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from pathlib import Path

from bench.common import DATA
from bench.streams.heldout import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev", help="the dev stream")
    ap.add_argument("--out", type=Path, required=True, help="directory to write (not the repo)")
    ap.add_argument("--seed", type=int, default=39)
    args = ap.parse_args()
    t0 = time.perf_counter()
    stream = build(args.data, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out / "pages.jsonl.gz", "wb") as fh:
        fh.writelines(line + b"\n" for line in stream.lines)
    with gzip.open(args.out / "labels.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(lab, ensure_ascii=False) + "\n" for lab in stream.labels)
    kinds = Counter(lab["kind"] for lab in stream.labels)
    stories = len({lab["story"] for lab in stream.labels})
    print(
        f"{len(stream.lines)} pages, {stories} stories, kinds {dict(kinds)}, "
        f"written to {args.out} in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
