"""The decision rule: a pure function of a page's fingerprints and what the index found.

Candidates come from the two SimHash indexes (the dual-threshold rule: D1 <= k1, or
k1 < D1 <= k2 and D2 <= k1), from the period-string index (CCS >= ccs_min) and, for short
pages, from their smallest 5-gram hashes (``neardup.index``). Each is then verified on
character 5-grams, estimated from bottom-k sketches, or exactly when both pages are short
enough to keep their whole sets (``exact_shingles``):

* duplicate: resemblance J >= jaccard_min, or J >= jaccard_simhash for a SimHash candidate;
* otherwise, when the smaller page's 5-grams are >= containment_min inside the other,
  and CCS >= ccs_contain (unless a page has no period string, when CCS says nothing;
  or when the page's numbers are in the other: ``neardup.facts``): contained (this page
  is the smaller), contains (the earlier page is), or duplicate when the two are of
  similar size.

The verification is what keeps formulaic texts apart (different events told in the same
stock phrases share most sentence endings, so CCS alone merges them).

Every verified candidate is an edge for the clusters; the page named in the decision is a
SimHash duplicate first (smallest D1), then the largest similarity, then the earliest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from neardup.config import EngineConfig
from neardup.facts import Agreement, compare, split_facts
from neardup.fingerprint import Fingerprints
from neardup.index import Lookup
from neardup.sketch import resemblance


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
    #: The smaller page's distinct 5-grams over the larger's: an excerpt is a good part
    #: of its full text, a shared block a small part of the pages around it.
    share: float = 1.0

    def sort_key(self) -> tuple[bool, int, float, int, int]:
        simhash_dup = self.by_simhash and self.kind is Kind.DUPLICATE
        return (not simhash_dup, self.distance, -self.similarity, self.order, self.pid)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An earlier page worth verifying, with what the index knows of it."""

    pid: int
    d1: int  # Hamming distance of the primary fingerprints
    d2: int  # ... of the secondary fingerprints
    ccs: float  # shared period strings / the smaller page's strings
    order: int
    by_simhash: bool  # passes the dual-threshold SimHash rule
    #: The fewer period strings of the two pages: with none, CCS says nothing.
    strings: int = 1


def candidates(
    fps: Fingerprints, found: Lookup, cfg: EngineConfig, self_pid: int
) -> dict[int, Candidate]:
    """Earlier pages worth verifying: SimHash neighbours and period-string matches."""
    n_self = len(fps.strings)
    ccs_of = {
        int(e["pid"]): float(shared) / max(1, min(n_self, int(e["n"])))
        for e, shared in zip(found.shared, found.shared_counts, strict=True)
    }
    close = {int(pid) for pid in found.close["pid"]}
    out: dict[int, Candidate] = {}
    tagged = [(e, True) for e in found.near] + [(e, False) for e in (*found.shared, *found.close)]
    for e, by_simhash in tagged:
        pid = int(e["pid"])
        if pid == self_pid or pid in out:
            continue
        ccs = ccs_of.get(pid, 0.0)
        if by_simhash or ccs >= cfg.ccs_min or pid in close:
            d1 = (int(e["fp1"]) ^ fps.fp1).bit_count()
            d2 = (int(e["fp2"]) ^ fps.fp2).bit_count()
            fewer = min(n_self, int(e["n"]))
            out[pid] = Candidate(pid, d1, d2, ccs, int(e["order"]), by_simhash, fewer)
    return out


def matches(
    fps: Fingerprints,
    cands: dict[int, Candidate],
    sketches: dict[int, tuple[int, bytes]],
    cfg: EngineConfig,
    covered: dict[int, float] | None = None,
) -> list[Match]:
    """The verified candidates, as matches, best first. ``covered``, when given, gets for
    every candidate compared the share of this page's 5-grams found in it."""
    out: list[Match] = []
    for pid, cand in cands.items():
        d1, order, by_simhash = cand.d1, cand.order, cand.by_simhash
        if pid not in sketches:
            continue  # dropped by retention between the lookup and now
        n_other, stored = sketches[pid]
        sketch, their_facts = split_facts(stored)
        jac, cont = resemblance(fps.sketch, fps.shingles, sketch, n_other, cfg.sketch_size)
        share = min(fps.shingles, n_other) / max(1, fps.shingles, n_other)
        if covered is not None:
            covered[pid] = cont * min(fps.shingles, n_other) / max(1, fps.shingles)
        facts = compare(fps.facts, their_facts)
        if jac < cfg.jaccard_sure and facts.differ(cfg.facts_differ, cfg.facts_differ_share):
            continue
        cut = cfg.jaccard_simhash if by_simhash else cfg.jaccard_min
        if jac >= cut or (jac >= cfg.jaccard_facts and facts.agree(cfg.facts_agree)):
            out.append(Match(pid, Kind.DUPLICATE, d1, jac, order, by_simhash, share))
        else:
            if fps.shingles <= cfg.contain_ratio * n_other:
                kind = Kind.CONTAINED
            elif n_other <= cfg.contain_ratio * fps.shingles:
                kind = Kind.CONTAINS
            else:
                kind = Kind.DUPLICATE
            part = kind is not Kind.DUPLICATE
            if _contained(
                cont, cand, facts, cfg, smaller_is_mine=fps.shingles <= n_other, part=part
            ):
                out.append(Match(pid, kind, d1, cont, order, by_simhash, share))
    return sorted(out, key=Match.sort_key)


def _contained(
    cont: float,
    cand: Candidate,
    facts: Agreement,
    cfg: EngineConfig,
    *,
    smaller_is_mine: bool,
    part: bool,
) -> bool:
    """Whether the smaller page is inside the other: by its 5-grams, with its period strings
    in the other but for ``ccs_slack`` of them, or with its numbers in the other instead;
    or a little less by its 5-grams, with all the strings asked, when its numbers are in
    the other (an excerpt lightly edited; ``Agreement.agree``: ``part`` unless the two are
    of a size). A page without period strings is judged on its 5-grams alone."""
    if cont >= cfg.containment_min:
        if not cand.strings or cand.ccs + cfg.ccs_slack / cand.strings >= cfg.ccs_contain:
            return True
        # An edit near a sentence end changes its period string; the page's numbers,
        # found in the other page, vouch for it instead.
        return facts.agree(cfg.facts_agree, smaller_is_mine, part=part)
    return (
        cont >= cfg.containment_facts
        and (cand.ccs >= cfg.ccs_contain or not cand.strings)
        and facts.agree(cfg.facts_agree, smaller_is_mine, part=part)
    )
