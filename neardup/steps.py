"""The three stateful steps of a decision, shared by ``neardup dedup`` and the Kafka stages.

* ``host_step``: the host's template filter (per host, in the pages' order);
* ``page_matches``: candidates from the index's answer, verified against their sketches
  (per page, pure once the buckets and sketches are read);
* ``cluster_step``: which matches may join clusters, and the join (one order over pages
  that have matches).

``neardup.engine.Engine`` runs them one after the other over one store; the Kafka topology
runs each where its state lives (``neardup.flow``). Both call these functions, so that
they decide alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from neardup.analysis import Analysed, page_pid, without_template, without_template_blocks
from neardup.cluster import Clusters, PageKey
from neardup.config import EngineConfig
from neardup.decide import Candidate, Kind, Match, candidates, matches
from neardup.index import Lookup
from neardup.template import TemplateFilter


def host_step(a: Analysed, templates: TemplateFilter, cfg: EngineConfig) -> tuple[Analysed, int]:
    """The page without its host's template blocks and sentences; counts the page (and
    remembers its id) in its host's template statistics. Returns the page and how many of
    the host's template strings and blocks it carried."""
    template, _ = templates.filter(
        a.host,
        a.fps.strings,
        a.prose_strings,
        blocks=[k for k in a.line_keys if k],
        also_blocks=[k for k in (*a.alt_keys, *a.prose_keys) if k],
        pid=a.pid,
        order=a.order,
    )
    a = without_template_blocks(a, template, cfg)
    return without_template(a, template, cfg), len(template)


@dataclass(frozen=True, slots=True)
class PageMatches:
    """What a page's lookup found and verified, before the clusters are asked."""

    candidates: dict[int, Candidate]
    #: The verified matches, best first.
    verified: list[Match]
    #: For every candidate compared, the share of this page's 5-grams found in it.
    covered: dict[int, float]


def page_candidates(a: Analysed, found: Lookup, cfg: EngineConfig) -> dict[int, Candidate]:
    """The earlier pages worth verifying (none for a template-only page)."""
    return {} if a.template_only else candidates(a.fps, found, cfg, a.pid)


def page_matches(
    a: Analysed,
    cands: dict[int, Candidate],
    sketches: Mapping[int, tuple[int, bytes]],
    cfg: EngineConfig,
) -> PageMatches:
    """The candidates verified against their sketches (shingle count, sketch by pid; a
    candidate without one was dropped by retention)."""
    covered: dict[int, float] = {}
    verified = matches(a.fps, cands, dict(sketches), cfg, covered)
    return PageMatches(cands, verified, covered)


class ClusterView(Protocol):
    """What the cluster step reads and writes: a union-find with the pages' ranks and
    contained flags."""

    def find(self, pid: int) -> int: ...

    def key(self, pid: int) -> PageKey: ...

    def is_contained(self, pid: int) -> bool: ...

    def mark_contained(self, pid: int) -> None: ...

    def join(self, page: PageKey, matched: list[int]) -> tuple[PageKey, list[PageKey]]: ...


class ClusterMatch(Protocol):
    """What the cluster step reads of a match: ``neardup.decide.Match``, or the order
    task's ``EdgeMatch`` as decoded (its kind a ``Kind``'s string)."""

    @property
    def pid(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def share(self) -> float: ...


M = TypeVar("M", bound=ClusterMatch)
# a member read through ``Kind`` takes ten times a module constant's time (the cluster
# step compares every match's kind)
_CONTAINED, _CONTAINS = Kind.CONTAINED, Kind.CONTAINS


class ClusterResult(NamedTuple, Generic[M]):
    #: The matches that joined clusters, best first (the decision's is the first).
    kept: list[M]
    root: PageKey
    #: Roots merged into ``root``, oldest first, not counting the page itself.
    merged: list[PageKey]


def cluster_step(
    me: PageKey,
    verified: Sequence[M],
    covered: Mapping[int, float],
    view: ClusterView,
    cfg: EngineConfig,
) -> ClusterResult[M]:
    """Keep the matches that may join clusters (``without_bridges``) and join them.
    ``verified``: best first, as ``neardup.decide.matches`` gives them."""
    kept = without_bridges(verified, covered, view, cfg)
    root, merged = view.join(me, [m.pid for m in kept])
    return ClusterResult(kept, root, merged)


def without_bridges(
    found: Sequence[M], covered: Mapping[int, float], view: ClusterView, cfg: EngineConfig
) -> list[M]:
    """The matches that may join clusters, in ``found``'s order (best first): containment
    must not bridge unrelated clusters through text they share (a boilerplate block on
    pages of one site, or of sites that share a publisher), which chains every page that
    carries it.

    * A page contained in pages of several clusters, and a duplicate of none, is text
      they have in common: it joins its best match only and merges nothing.
    * A page whose only matches in a cluster are pages it contains that are already
      contained in another page, each a small part of it (under ``excerpt_share``),
      is a third page around the same shared text: it joins nothing there, unless it
      shares with another page of that cluster clearly more than the contained page
      explains (``excerpt_margin``). That is a full copy of a story whose excerpt
      came first, and full copies edited apart need not match each other.

    Marks the pages this page contains as contained (``ClusterView.mark_contained``).
    """
    if not found:
        return []
    roots = [view.find(m.pid) for m in found]
    if len(found) > 1 and len(set(roots)) > 1 and all(m.kind == _CONTAINED for m in found):
        return [found[0]]
    contains = [m for m in found if m.kind == _CONTAINS]
    if not contains:  # (most pages) no bridge, and nothing to mark
        return list(found)
    by_root: dict[int, list[M]] = {}
    for m, root in zip(found, roots, strict=True):
        by_root.setdefault(root, []).append(m)
    dropped = {
        root
        for root, group in by_root.items()
        if all(_is_bridge(m, view, cfg) for m in group)
        and not _beyond_excerpt(root, group, covered, view, cfg)
    }
    kept = [m for m, root in zip(found, roots, strict=True) if root not in dropped]
    if dropped:
        contains = [m for m in kept if m.kind == _CONTAINS]
    for m in contains:
        view.mark_contained(m.pid)
    return kept


def _beyond_excerpt(
    root: int,
    group: list[M],
    covered: Mapping[int, float],
    view: ClusterView,
    cfg: EngineConfig,
) -> bool:
    """Whether this page shares with a page of ``root``'s cluster, other than the
    contained pages in ``group``, more of its text than those pages make up."""
    mine = {m.pid for m in group}
    need = max(m.share for m in group) + cfg.excerpt_margin
    return any(
        share >= need and pid not in mine and view.find(pid) == root
        for pid, share in covered.items()
    )


def _is_bridge(m: ClusterMatch, view: ClusterView, cfg: EngineConfig) -> bool:
    """Whether ``m`` is a small page this page contains, contained in another page."""
    small = m.share < cfg.excerpt_share
    return m.kind == _CONTAINS and small and view.is_contained(m.pid)


def conflicts_with(decision: Mapping[str, Any], a: Analysed) -> bool:
    """Whether ``a`` carries other content than the page its id was decided as: its
    primary fingerprint differs from the stored decision's (the fingerprint covers the
    whole main text, template sentences included, so the same page always agrees)."""
    return decision.get("fingerprint") != f"{a.fps.fp1:016x}"


def decision_message(
    a: Analysed,
    best: Match | None,
    *,
    duplicate_of: str | None,
    duplicate_of_url: str | None,
    cluster_id: str,
    engine_info: dict[str, str],
    decided_at: str,
) -> dict[str, Any]:
    """The decision as published (schemas/decision.schema.json)."""
    return {
        "page_id": a.page.page_id,
        "url": a.page.url,
        "decision": str(best.kind if best else Kind.UNIQUE),
        "duplicate_of": duplicate_of,
        "duplicate_of_url": duplicate_of_url,
        "cluster_id": cluster_id,
        "distance": best.distance if best else None,
        "similarity": round(best.similarity, 4) if best else None,
        "fingerprint": f"{a.extracted_fp or a.fps.fp1:016x}",
        "title": a.title,
        "text_chars": a.text_chars,
        "charset": {"name": a.charset, "layer": a.layer},
        "decided_at": decided_at,
        "engine": engine_info,
    }


def stored_decision(clusters: Clusters, rec: Mapping[str, object]) -> dict[str, Any]:
    """The decision kept in a page record, in the published form: one stored without
    ``duplicate_of_url`` (written before decisions carried it) gets the URL from the
    matched page's record, so that a page seen again is answered in the current schema
    and state written then is still read."""
    decision: dict[str, Any] = dict(rec["decision"])  # type: ignore[call-overload]
    if "duplicate_of_url" in decision:
        return decision
    dup = decision.get("duplicate_of")
    other = clusters.page(page_pid(str(dup))) if dup is not None else None
    url = str(other["url"]) if other is not None else None
    out: dict[str, Any] = {}
    for key, value in decision.items():
        out[key] = value
        if key == "duplicate_of":
            out["duplicate_of_url"] = url
    return out
