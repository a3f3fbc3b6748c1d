"""Every page's candidates as the engine saw them, for studying missed and false matches.

``bench/quality.py --dump DIR`` runs the engine inside ``PairDump``: for each page it
writes the page's text and every earlier page its index lookup found (SimHash neighbours,
period-string and smallest-hash matches, whether or not ``candidates`` kept them), each
with its distances, CCS, 5-gram resemblance and containment. ``bench/pairs.py`` reads it
with the labels. Each candidate row says whether the engine verified it (``matched``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import neardup.engine
from neardup.analysis import Analysed
from neardup.config import EngineConfig
from neardup.decide import Candidate
from neardup.engine import Engine
from neardup.facts import compare, split_facts
from neardup.index import Lookup
from neardup.sketch import resemblance
from neardup.steps import PageMatches


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


class PairDump:
    """Wraps ``neardup.engine.page_candidates`` while in use; writes the rows on exit."""

    def __init__(self, engine: Engine, path: Path) -> None:
        self.engine, self.path = engine, path
        self.rows: list[dict[str, Any]] = []
        self.original = neardup.engine.page_candidates
        self.original_matches = neardup.engine.page_matches

    def __enter__(self) -> PairDump:
        neardup.engine.page_candidates = self._candidates
        neardup.engine.page_matches = self._matches
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        neardup.engine.page_candidates = self.original
        neardup.engine.page_matches = self.original_matches
        write_jsonl(self.path, self.rows)

    def _matches(
        self,
        a: Analysed,
        cands: dict[int, Candidate],
        sketches: Mapping[int, tuple[int, bytes]],
        cfg: EngineConfig,
    ) -> PageMatches:
        found = self.original_matches(a, cands, sketches, cfg)
        verified = {m.pid for m in found.verified}
        if self.rows and self.rows[-1]["pid"] == a.pid:
            for row in self.rows[-1]["cands"]:
                row["matched"] = row["pid"] in verified
        return found

    def _candidates(self, a: Analysed, found: Lookup, cfg: EngineConfig) -> dict[int, Candidate]:
        cands = self.original(a, found, cfg)
        n_self = len(a.fps.strings)
        shared = {
            int(e["pid"]): int(k) for e, k in zip(found.shared, found.shared_counts, strict=True)
        }
        near = {int(e["pid"]) for e in found.near}
        close = {int(pid) for pid in found.close["pid"]}
        entries = {int(e["pid"]): e for e in (*found.near, *found.shared, *found.close)}
        entries.pop(a.pid, None)
        sketches = self.engine.index.sketches(list(entries))
        rows = []
        for pid, e in entries.items():
            if pid not in sketches:
                continue
            n_other, stored = sketches[pid]
            sketch, facts = split_facts(stored)
            jac, cont = resemblance(a.fps.sketch, a.fps.shingles, sketch, n_other, cfg.sketch_size)
            agreement = compare(a.fps.facts, facts)
            rows.append(
                {
                    "pid": pid,
                    "d1": (int(e["fp1"]) ^ a.fps.fp1).bit_count(),
                    "d2": (int(e["fp2"]) ^ a.fps.fp2).bit_count(),
                    "ccs": shared.get(pid, 0) / max(1, min(n_self, int(e["n"]))),
                    "fewer": min(n_self, int(e["n"])),
                    "near": pid in near,
                    "close": pid in close,
                    "kept": pid in cands,
                    "jac": round(jac, 4),
                    "cont": round(cont, 4),
                    "n_other": n_other,
                    "facts": [agreement.shared, agreement.only_mine, agreement.only_theirs],
                }
            )
        self.rows.append(
            {
                "url": a.page.url,
                "pid": a.pid,
                "text": a.text,
                "shingles": a.fps.shingles,
                "strings": n_self,
                "template_only": a.template_only,
                "cands": rows,
            }
        )
        return cands
