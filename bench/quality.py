"""Dedup quality on the labelled dev stream, against two baselines run on the same pages.

    .venv/bin/python bench/quality.py [--data ../shared/data/neardup-dev] [--limit N]

neardup: the engine with its default settings, exactly as `neardup dedup` runs it.
Baselines (each page against all earlier pages, clusters by union of matches):
  * plain SimHash: trafilatura text, jieba words, tf weights, 64 bits, k = 3;
  * MinHash-LSH: character 5-grams of the trafilatura text, datasketch, 128 permutations,
    threshold 0.5.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, raw_lines, read_jsonl
from neardup.cli import config_from_sets
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.decode import decode
from neardup.engine import Engine
from neardup.evaluate import Report, score
from neardup.extract import extract
from neardup.fingerprint import simhash
from neardup.records import Rejected
from neardup.store import MemoryKV


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def record(self, url: str, hits: list[str]) -> dict[str, Any]:
        """Join ``url`` with its ``hits``; its decision in the scoring's terms."""
        for u in hits:
            self.union(url, u)
        return {
            "page_id": url,
            "decision": "duplicate" if hits else "unique",
            "duplicate_of": hits[0] if hits else None,
        }


def run_neardup(
    lines: list[bytes], cfg: EngineConfig
) -> tuple[dict[str, str], dict[str, Any], float]:
    engine = Engine(MemoryKV(), cfg)
    decisions: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for raw in lines:
        out = engine.process(parse_raw(raw, cfg.max_bytes))
        if not isinstance(out, Rejected):
            decisions[out.decision["url"]] = out.decision
    elapsed = time.perf_counter() - t0
    clusters = {url: engine.cluster_of(d["page_id"]) for url, d in decisions.items()}
    return clusters, decisions, elapsed


def baseline_texts(lines: list[bytes], cfg: EngineConfig) -> list[tuple[str, str] | None]:
    """(url, trafilatura main text) per page, in order."""
    out: list[tuple[str, str] | None] = []
    for raw in lines:
        page = parse_raw(raw, cfg.max_bytes)
        dec = page if isinstance(page, Rejected) else decode(page)
        ext = dec if isinstance(dec, Rejected) else extract(dec, "trafilatura")
        out.append(None if isinstance(ext, Rejected) else (ext.page.url, ext.text))
    return out


def run_simhash(texts: list[tuple[str, str] | None]) -> tuple[dict[str, str], dict[str, Any]]:
    import jieba

    jieba.setLogLevel(60)
    uf, seen, decisions = UnionFind(), [], {}
    for item in texts:
        if item is None:
            continue
        url, text = item
        # words: jieba's tokens with a letter or digit (its punctuation tokens, kept until
        # 2026-11-25, gave every page the same heavy features and chained 504 pages)
        words = [w for w in jieba.lcut(text) if any(c.isalnum() for c in w)]
        fp = simhash(Counter(words))
        hits = [u for u, f in seen if (f ^ fp).bit_count() <= 3]
        decisions[url] = uf.record(url, hits)
        seen.append((url, fp))
    return {u: uf.find(u) for u in decisions}, decisions


def run_minhash(texts: list[tuple[str, str] | None]) -> tuple[dict[str, str], dict[str, Any]]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.5, num_perm=128)
    uf, decisions = UnionFind(), {}
    for item in texts:
        if item is None:
            continue
        url, text = item
        norm = "".join(text.split())
        m = MinHash(num_perm=128)
        m.update_batch([norm[i : i + 5].encode() for i in range(max(1, len(norm) - 4))])
        hits = lsh.query(m)
        decisions[url] = uf.record(url, hits)
        if url not in lsh:
            lsh.insert(url, m)
    return {u: uf.find(u) for u in decisions}, decisions


def show(name: str, report: Report) -> None:
    print(f"\n== {name}")
    for line in report.lines():
        print("  " + line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--limit", type=int, default=0, help="only the first N pages")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    lines = raw_lines(args.data / "pages.jsonl.gz")
    labels = read_jsonl(args.data / "labels.jsonl.gz")
    if args.limit:
        lines, labels = lines[: args.limit], labels[: args.limit]
    cfg = config_from_sets(args.set)  # all at once, as neardup dedup applies them
    print(f"{len(lines)} pages; engine {cfg}")
    clusters, decisions, elapsed = run_neardup(lines, cfg)
    mine = score(labels, clusters, decisions)
    show(
        f"neardup ({len(lines) / elapsed:.0f} pages/s, {len(lines) - len(decisions)} rejected)",
        mine,
    )
    if args.no_baselines:
        return
    t0 = time.perf_counter()
    texts = baseline_texts(lines, cfg)
    print(f"\n(trafilatura extraction for the baselines: {time.perf_counter() - t0:.0f} s)")
    results = {
        "plain SimHash (trafilatura+jieba, tf, k=3)": score(labels, *run_simhash(texts)),
        "MinHash-LSH (char 5-grams, threshold 0.5)": score(labels, *run_minhash(texts)),
    }
    for name, rep in results.items():
        show(name, rep)
    print("\n== margins of neardup (pairwise F1, hard-negative merge rate)")
    mine_hn = mine.hard_negative_merged[0] / max(1, mine.hard_negative_merged[1])
    for name, rep in results.items():
        hn = rep.hard_negative_merged[0] / max(1, rep.hard_negative_merged[1])
        print(
            f"  vs {name}: F1 {mine.pairwise.f1 - rep.pairwise.f1:+.4f} "
            f"({mine.pairwise.f1:.4f} vs {rep.pairwise.f1:.4f}); "
            f"hard-negative merges {mine_hn:.2%} vs {hn:.2%}"
        )


if __name__ == "__main__":
    main()
