"""Scoring of final clusters and decisions against story labels.

Shared by ``bench/quality.py`` and the gold-set quality gate in the tests. The scoring
follows the dev set's README: pairwise clustering P/R/F1, decision P/R/F1, recall by
transformation, and the hard-negative merge rate.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import Any


@dataclass(frozen=True, slots=True)
class PRF:
    precision: float
    recall: float
    f1: float

    @staticmethod
    def of(tp: int, predicted: int, actual: int) -> PRF:
        p = tp / predicted if predicted else 1.0
        r = tp / actual if actual else 1.0
        return PRF(p, r, 2 * p * r / (p + r) if p + r else 0.0)

    def __str__(self) -> str:
        return f"P={self.precision:.4f} R={self.recall:.4f} F1={self.f1:.4f}"


def pairwise(clusters: Mapping[str, str], stories: Mapping[str, str]) -> PRF:
    """Pairwise P/R/F1 of ``clusters`` (item -> cluster) against ``stories`` (item -> story).

    Items without a cluster count as singletons.
    """
    items = list(stories)
    cl = {i: clusters.get(i, f"\x00single:{i}") for i in items}
    predicted = sum(comb(n, 2) for n in Counter(cl.values()).values())
    actual = sum(comb(n, 2) for n in Counter(stories[i] for i in items).values())
    both = Counter((cl[i], stories[i]) for i in items)
    tp = sum(comb(n, 2) for n in both.values())
    return PRF.of(tp, predicted, actual)


@dataclass(frozen=True, slots=True)
class Report:
    pairwise: PRF
    decisions: PRF
    recall_by_transform: dict[str, tuple[int, int]]  # kind -> (found, total)
    hard_negative_merged: tuple[int, int]  # (merged, total)
    duplicate_of_right: tuple[int, int]  # (names a page of the same story, named)
    largest_cluster: tuple[int, int] = (0, 0)  # (pages, distinct stories among them)

    def lines(self) -> list[str]:
        out = [f"pairwise  {self.pairwise}", f"decisions {self.decisions}"]
        merged, total = self.hard_negative_merged
        out.append(f"hard negatives merged: {merged}/{total} = {merged / max(total, 1):.2%}")
        right, named = self.duplicate_of_right
        out.append(f"duplicate_of names the same story: {right}/{named}")
        size, kinds = self.largest_cluster
        out.append(f"largest cluster: {size} pages of {kinds} stories")
        for kind, (found, total) in sorted(self.recall_by_transform.items()):
            out.append(f"  recall[{kind:<14}] {found:4d}/{total:<4d} = {found / total:.3f}")
        return out


def score(
    labels: Sequence[Mapping[str, Any]],
    clusters: Mapping[str, str],
    decisions: Mapping[str, Mapping[str, Any]],
    key: str = "url",
) -> Report:
    """Score final ``clusters`` and ``decisions`` (both by ``key``) against ``labels``.

    A decision's ``duplicate_of`` (a page id) is mapped back to ``key`` through the
    decisions themselves.
    """
    stories = {lab[key]: lab["story"] for lab in labels}
    transforms = {lab[key]: list(lab.get("transforms", [])) for lab in labels}
    key_of_id = {str(d.get("page_id")): item for item, d in decisions.items()}
    first_of: dict[str, str] = {}
    for lab in labels:
        if lab.get("first"):
            first_of[lab["story"]] = lab[key]
    cl = {i: clusters.get(i, f"\x00single:{i}") for i in stories}

    tp = pred = actual = 0
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    right = named = 0
    for lab in labels:
        item = lab[key]
        truly = not lab.get("first")
        dec = decisions.get(item)
        said = dec is not None and dec.get("decision") != "unique"
        tp += truly and said
        pred += said
        actual += truly
        if dec is not None and dec.get("duplicate_of") is not None:
            named += 1
            right += stories.get(key_of_id.get(dec["duplicate_of"], "")) == lab["story"]
        if truly:
            first = first_of.get(lab["story"])
            found = first is not None and cl[item] == cl[first]
            first_transforms = transforms.get(first, []) if first is not None else []
            for kind in {*lab.get("transforms", []), *first_transforms} or {"none"}:
                by_kind[kind][0] += found
                by_kind[kind][1] += 1
    members: dict[str, set[str]] = defaultdict(set)
    for item, c in cl.items():
        members[c].add(stories[item])
    negatives = [lab for lab in labels if lab.get("kind") in ("hard_negative", "short")]
    merged = sum(len(members[cl[lab[key]]]) > 1 for lab in negatives)
    return Report(
        pairwise=pairwise(clusters, stories),
        decisions=PRF.of(tp, pred, actual),
        recall_by_transform={k: (v[0], v[1]) for k, v in by_kind.items()},
        hard_negative_merged=(merged, len(negatives)),
        duplicate_of_right=(right, named),
        largest_cluster=max(
            ((n, len(members[c])) for c, n in Counter(cl.values()).items()), default=(0, 0)
        ),
    )
