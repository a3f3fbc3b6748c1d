"""Dedup quality on labelled streams, against two baselines run on the same pages.

    .venv/bin/python bench/quality.py [--stream dev|heldout|both] [--data DIR] [--limit N]
        [--dump DIR]   (every page's candidates, for bench/pairs.py: missed and false matches)

Streams: ``dev`` is the labelled dev stream under DIR (../shared/data/neardup-dev);
``heldout`` is built at run time by ``bench.streams`` from that stream's article texts on
site templates unlike the dev ones (``--seed``; nothing is written to disk).

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
from bench.pairdump import PairDump, write_jsonl
from neardup.cli import config_from_sets
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.decode import decode
from neardup.engine import Engine
from neardup.evaluate import Report, score
from neardup.extract import extract
from neardup.records import Rejected
from neardup.simhash import simhash
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
    lines: list[bytes], cfg: EngineConfig, dump: Path | None = None
) -> tuple[dict[str, str], dict[str, Any], float]:
    engine = Engine(MemoryKV(), cfg)
    if dump is not None:
        with PairDump(engine, dump):
            return _run(engine, lines)
    return _run(engine, lines)


def _run(engine: Engine, lines: list[bytes]) -> tuple[dict[str, str], dict[str, Any], float]:
    cfg = engine.cfg
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
        # words: jieba's tokens with a letter or digit (its punctuation tokens would give
        # every page the same heavy features and chain unrelated pages)
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


LENGTH_BUCKETS = ((0, "<300"), (300, "300-600"), (600, "600-1500"), (1500, ">1500"))
LEGACY_CHARSETS = frozenset({"gb18030", "gb2312", "gbk", "big5", "big5-hkscs"})


def _bucket(chars: int) -> str:
    return [name for low, name in LENGTH_BUCKETS if chars >= low][-1]


def breakdown(labels: list[dict[str, Any]], clusters: dict[str, str]) -> list[str]:
    """Recall by text length and by charset, and merges of hard negatives and short items
    apart: beside ``Report.lines``, which counts those two together."""
    cl = {lab["url"]: clusters.get(lab["url"], f"\x00single:{lab['url']}") for lab in labels}
    first = {lab["story"]: lab for lab in labels if lab.get("first")}
    found: dict[str, list[int]] = {}
    for lab in labels:
        head = first.get(lab["story"])
        if lab.get("first") or head is None:
            continue
        hit = cl[lab["url"]] == cl[head["url"]]
        keys = [f"length {_bucket(int(lab.get('text_chars', 0)))}"]
        legacy = {lab.get("charset"), head.get("charset")} & LEGACY_CHARSETS
        keys.append("charset " + ("legacy, either" if legacy else "utf-8, both"))
        for key in keys:
            found.setdefault(key, [0, 0])
            found[key][0] += hit
            found[key][1] += 1
    stories: dict[str, set[str]] = {}
    for lab in labels:
        stories.setdefault(cl[lab["url"]], set()).add(lab["story"])
    out = []
    for key in [f"length {name}" for _, name in LENGTH_BUCKETS] + sorted(
        k for k in found if k.startswith("charset")
    ):
        if key in found:
            got, total = found[key]
            out.append(f"  recall[{key:<22}] {got:4d}/{total:<4d} = {got / total:.3f}")
    for kind in ("hard_negative", "short"):
        items = [lab for lab in labels if lab.get("kind") == kind]
        merged = sum(len(stories[cl[lab["url"]]]) > 1 for lab in items)
        out.append(f"{kind} merged: {merged}/{len(items)} = {merged / max(1, len(items)):.2%}")
    return out


def show(name: str, report: Report, labels: list[dict[str, Any]], clusters: dict[str, str]) -> None:
    print(f"\n== {name}")
    for line in [*report.lines(), *breakdown(labels, clusters)]:
        print("  " + line)


def run_stream(
    name: str,
    lines: list[bytes],
    labels: list[dict[str, Any]],
    cfg: EngineConfig,
    baselines: bool,
    *,
    dump: Path | None = None,
) -> None:
    print(
        f"\n######## {name} stream: {len(lines)} pages, {len({lab['story'] for lab in labels})} "
        "stories"
    )
    clusters, decisions, elapsed = run_neardup(
        lines, cfg, dump / f"{name}.jsonl.gz" if dump else None
    )
    mine = score(labels, clusters, decisions)
    show(
        f"neardup ({len(lines) / elapsed:.0f} pages/s, {len(lines) - len(decisions)} rejected)",
        mine,
        labels,
        clusters,
    )
    if not baselines:
        return
    t0 = time.perf_counter()
    texts = baseline_texts(lines, cfg)
    print(f"\n(trafilatura extraction for the baselines: {time.perf_counter() - t0:.0f} s)")
    results = {
        "plain SimHash (trafilatura+jieba, tf, k=3)": run_simhash(texts),
        "MinHash-LSH (char 5-grams, threshold 0.5)": run_minhash(texts),
    }
    reports = {}
    for title, (base_clusters, base_decisions) in results.items():
        reports[title] = score(labels, base_clusters, base_decisions)
        show(title, reports[title], labels, base_clusters)
    print(f"\n== {name}: margins of neardup (pairwise F1, hard-negative merge rate)")
    mine_hn = mine.hard_negative_merged[0] / max(1, mine.hard_negative_merged[1])
    for title, rep in reports.items():
        hn = rep.hard_negative_merged[0] / max(1, rep.hard_negative_merged[1])
        print(
            f"  vs {title}: F1 {mine.pairwise.f1 - rep.pairwise.f1:+.4f} "
            f"({mine.pairwise.f1:.4f} vs {rep.pairwise.f1:.4f}); "
            f"hard-negative merges {mine_hn:.2%} vs {hn:.2%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stream", choices=("dev", "heldout", "both"), default="both")
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev", help="the dev stream")
    ap.add_argument("--seed", type=int, default=39, help="of the held-out stream")
    ap.add_argument("--limit", type=int, default=0, help="only the first N pages of each")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument(
        "--dump",
        type=Path,
        metavar="DIR",
        help="write every page's candidates (J, containment, CCS, shares) and text to "
        "DIR/<stream>.jsonl.gz, with the labels, for bench/pairs.py (third-party text: "
        "keep DIR out of the repository)",
    )
    args = ap.parse_args()
    if not (args.data / "pages.jsonl.gz").is_file():
        ap.error(f"no dev stream at {args.data} (pages.jsonl.gz, labels.jsonl.gz)")
    cfg = config_from_sets(args.set)  # all at once, as neardup dedup applies them
    print(f"engine {cfg}")
    streams: dict[str, tuple[list[bytes], list[dict[str, Any]]]] = {}
    if args.stream in ("dev", "both"):
        streams["dev"] = (
            raw_lines(args.data / "pages.jsonl.gz"),
            read_jsonl(args.data / "labels.jsonl.gz"),
        )
    if args.stream in ("heldout", "both"):
        from bench.streams.heldout import build

        t0 = time.perf_counter()
        held = build(args.data, args.seed)
        print(f"held-out stream (seed {args.seed}) built in {time.perf_counter() - t0:.0f} s")
        streams["heldout"] = (held.lines, held.labels)
    for name, (lines, labels) in streams.items():
        cut = args.limit or len(lines)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            write_jsonl(args.dump / f"{name}.labels.jsonl.gz", labels[:cut])
        run_stream(name, lines[:cut], labels[:cut], cfg, not args.no_baselines, dump=args.dump)


if __name__ == "__main__":
    main()
