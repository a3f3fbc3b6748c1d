"""Missed and false matches of a run dumped by ``bench/quality.py --dump DIR``.

    .venv/bin/python bench/pairs.py DIR/heldout [--texts]

For every labelled page that the engine matched with no earlier page of its story, the
nearest such page the lookup found (by resemblance), with its J, containment, CCS, sizes
and numbers (shared, only in this page, only in the other: ``neardup.facts``), or that
none was found; then every verified match between pages of different stories. Grouped
counts by transformation close each part.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import read_jsonl


def _row(c: dict[str, Any], shingles: int) -> str:
    return (
        f"n={shingles}/{c['n_other']} J={c['jac']:.3f} C={c['cont']:.3f} ccs={c['ccs']:.2f} "
        f"strings={c['fewer']} d1={c['d1']} kept={c['kept']} facts={c.get('facts')}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("stem", type=Path, help="DIR/<stream>, as --dump wrote it")
    ap.add_argument("--texts", action="store_true", help="print both texts of false matches")
    args = ap.parse_args()
    labels = {lab["url"]: lab for lab in read_jsonl(Path(f"{args.stem}.labels.jsonl.gz"))}
    rows = read_jsonl(Path(f"{args.stem}.jsonl.gz"))
    story = {r["pid"]: labels.get(r["url"], {}).get("story") for r in rows}
    text = {r["pid"]: r["text"] for r in rows}
    missed: Counter[str] = Counter()
    false: list[str] = []
    for r in rows:
        lab = labels.get(r["url"])
        if lab is None:
            continue
        same = [c for c in r["cands"] if story.get(c["pid"]) == lab["story"]]
        for c in r["cands"]:
            if c.get("matched") and story.get(c["pid"]) != lab["story"]:
                false.append(f"{lab.get('kind')}: {_row(c, r['shingles'])}")
                if args.texts:
                    false.append(f"    A {r['text'][:300]!r}\n    B {text[c['pid']][:300]!r}")
        if lab.get("first") or any(c.get("matched") for c in same):
            continue
        how = "+".join(lab.get("transforms", [])) or "-"
        missed[how] += 1
        best = max(same, key=lambda c: c["jac"], default=None)
        found = _row(best, r["shingles"]) if best else "no page of its story found"
        print(f"missed {how:34s} {found}")
    print(f"\nmissed pages by transformation ({sum(missed.values())}):")
    for how, n in missed.most_common():
        print(f"  {n:4d} {how}")
    print(f"\nmatches across stories ({len(false)}):")
    print("\n".join(f"  {line}" for line in false))


if __name__ == "__main__":
    main()
