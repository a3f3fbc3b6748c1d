"""The decision rule: a pure function of a page's fingerprints and what the index found.

Candidates come from the two SimHash indexes (the dual-threshold rule: D1 <= k1, or
k1 < D1 <= k2 and D2 <= k1) and from the period-string index (CCS >= ccs_min). Each is then
verified on character 5-grams, estimated from bottom-k sketches:

* duplicate: resemblance J >= jaccard_min, or J >= jaccard_simhash for a SimHash candidate;
* otherwise, when the smaller page's 5-grams are >= containment_min inside the other:
  contained (this page is the smaller), contains (the earlier page is), or duplicate
  when the two are of similar size.

The verification is what keeps formulaic texts apart (different events told in the same
stock phrases share most sentence endings, so CCS alone merges them).

Every verified candidate is an edge for the clusters; the page named in the decision is a
SimHash duplicate first (smallest D1), then the largest similarity, then the earliest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from worker.config import EngineConfig
from worker.fingerprint import Fingerprints, resemblance
from worker.index import Lookup


class Kind(StrEnum):
    UNIQUE = "unique"
    DUPLICATE = "duplicate"
    CONTAINED = "contained"
    CONTAINS = "contains"


@dataclass(frozen=True, slots=True)
class Match:
    pid: int
    kind: Kind
    distance: int  # Hamming distance of the primary fingerprints
    similarity: float  # 5-gram resemblance for duplicates, containment for containment
    order: int
    by_simhash: bool  # found by the SimHash rule, else by period strings

    def sort_key(self) -> tuple[bool, int, float, int, int]:
        simhash_dup = self.by_simhash and self.kind is Kind.DUPLICATE
        return (not simhash_dup, self.distance, -self.similarity, self.order, self.pid)


def candidates(
    fps: Fingerprints, found: Lookup, cfg: EngineConfig, self_pid: int
) -> dict[int, tuple[int, int, bool]]:
    """Earlier pages worth verifying: pid -> (D1, order, found by SimHash)."""
    out: dict[int, tuple[int, int, bool]] = {}
    for e in found.near:
        pid = int(e["pid"])
        if pid != self_pid:
            out[pid] = ((int(e["fp1"]) ^ fps.fp1).bit_count(), int(e["order"]), True)
    n_self = len(fps.strings)
    for e, shared in zip(found.shared, found.shared_counts, strict=True):
        pid = int(e["pid"])
        if pid == self_pid or pid in out or n_self == 0:
            continue
        if float(shared) / max(1, min(n_self, int(e["n"]))) >= cfg.ccs_min:
            out[pid] = ((int(e["fp1"]) ^ fps.fp1).bit_count(), int(e["order"]), False)
    return out


def matches(
    fps: Fingerprints,
    cands: dict[int, tuple[int, int, bool]],
    sketches: dict[int, tuple[int, bytes]],
    cfg: EngineConfig,
) -> list[Match]:
    """The verified candidates, as matches, best first."""
    out: list[Match] = []
    for pid, (d1, order, by_simhash) in cands.items():
        if pid not in sketches:
            continue  # dropped by retention between the lookup and now
        n_other, sketch = sketches[pid]
        jac, cont = resemblance(fps.sketch, fps.shingles, sketch, n_other, cfg.sketch_size)
        if jac >= (cfg.jaccard_simhash if by_simhash else cfg.jaccard_min):
            out.append(Match(pid, Kind.DUPLICATE, d1, jac, order, by_simhash))
        elif cont >= cfg.containment_min:
            if fps.shingles <= cfg.contain_ratio * n_other:
                kind = Kind.CONTAINED
            elif n_other <= cfg.contain_ratio * fps.shingles:
                kind = Kind.CONTAINS
            else:
                kind = Kind.DUPLICATE
            out.append(Match(pid, kind, d1, cont, order, by_simhash))
    return sorted(out, key=Match.sort_key)
