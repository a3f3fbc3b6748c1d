"""The engine: one raw page in, one decision (plus cluster merges) or one rejection out.

The stages are plain modules (decode, extract, normalise, fingerprint, template, index,
decide, cluster); this file only wires them and counts. ``analyse`` (``neardup.analysis``)
is pure, the expensive part; the three stateful steps (``neardup.steps``) run here one
after the other over one store, as the Kafka topology runs them where their state lives.
``Engine.process`` runs ``analyse`` in ``neardup.sandbox``, bounded in time and memory,
unless the config's ``extract_timeout_s`` is 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from neardup import __version__
from neardup.analysis import (
    MAX_PROSE_STRINGS,
    STAGES,
    SWITCH_MAX_CHARS,
    TEMPLATE_ONLY_SHARE,
    Analysed,
    Stats,
    analyse,
    block_key,
    extract_page,
    for_decision,
    internal_rejection,
    page_host,
    page_order,
    page_pid,
    prose_strings,
    refuse_unencodable,
    without_template,
    without_template_blocks,
)
from neardup.cluster import Clusters, PageKey
from neardup.config import EngineConfig
from neardup.index import KVIndex, make_entry
from neardup.records import RawPage, Reason, Rejected, utc_now
from neardup.steps import (
    cluster_step,
    conflicts_with,
    decision_message,
    host_step,
    page_candidates,
    page_matches,
    stored_decision,
)
from neardup.store import KV, BufferedKV
from neardup.template import TemplateFilter

__all__ = [
    "MAX_PROSE_STRINGS",
    "STAGES",
    "SWITCH_MAX_CHARS",
    "TEMPLATE_ONLY_SHARE",
    "Analysed",
    "Engine",
    "Merge",
    "Outcome",
    "Stats",
    "analyse",
    "block_key",
    "conflicts_with",
    "decision_message",
    "extract_page",
    "for_decision",
    "internal_rejection",
    "page_host",
    "page_order",
    "page_pid",
    "prose_strings",
    "refuse_unencodable",
    "stored_decision",
    "without_template",
    "without_template_blocks",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Merge:
    from_cluster: str
    into_cluster: str
    page_id: str
    at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "from_cluster": self.from_cluster,
            "into_cluster": self.into_cluster,
            "page_id": self.page_id,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision (as its JSON message) and the cluster merges it caused.

    ``repeated`` is true when the page id was decided before: the stored decision is
    returned unchanged and nothing is written. A page id names one page: the first content
    decided under it wins, so a redelivered message can never change a decision (nor the
    index, which holds one entry per id). ``conflict`` is true when the repeated id came
    with other content (its main text fingerprints differently): still the stored
    decision, but counted (``Stats.conflicts``) and logged, because the crawler gave two
    pages one id. An id whose first message was rejected is decided when it comes again.
    """

    decision: dict[str, Any]
    merges: tuple[Merge, ...] = ()
    repeated: bool = False
    conflict: bool = False


class Engine:
    """Decides pages one by one against everything decided before, in ``kv``."""

    def __init__(self, kv: KV, cfg: EngineConfig | None = None) -> None:
        self.cfg = cfg or EngineConfig()
        self.kv = BufferedKV(kv)
        self.index = KVIndex(self.kv, self.cfg)
        self.templates = TemplateFilter(self.kv, self.cfg)
        self.clusters = Clusters(self.kv)
        self.stats = Stats()
        self.engine_info = {"version": __version__, "params": str(self.cfg)}
        # Imported here: neardup.sandbox runs this module's ``analyse`` in its child.
        from neardup.sandbox import Sandbox

        #: Bounds analysis in time and memory; None analyses in this process, unbounded.
        self.sandbox = Sandbox(self.cfg) if self.cfg.extract_timeout_s > 0 else None

    def decide_analysed(self, a: Analysed) -> Outcome:
        """The stateful steps for a page from the pure ``analyse``: the host's template
        filter, then ``decide``.

        A page id its host has seen (within its template window) is a repeat there: the
        stored decision is returned and nothing is counted, so a redelivered page leaves
        the state as it was. A page id decided before under another host (or beyond the
        host's window) is counted in its host's template statistics and added to the
        index (keeping its first sketch), and still answered with the stored decision:
        the Kafka topology counts template text per host, where no other host's pages
        are known, and ``neardup dedup`` decides what it decides."""
        if self.templates.seen(a.host, a.pid, a.order):
            rec = self.clusters.page(a.pid)
            if rec is not None:
                return self._repeated(a, rec)
        filtered = self.filter_template(a)
        rec = self.clusters.page(a.pid)
        if rec is None:
            return self._decide_new(filtered)
        if not filtered.template_only:
            with self.stats.timed("index"):
                found = self.index.lookup(filtered.fps, filtered.order)
                entry = make_entry(a.pid, filtered.fps, filtered.order)
                self.index.add(found, entry, filtered.fps, sketch=False)
        return self._repeated(a, rec)

    def filter_template(self, a: Analysed) -> Analysed:
        """The page without its host's template sentences; counts the page in its host's
        template statistics."""
        with self.stats.timed("template"):
            a, dropped = host_step(a, self.templates, self.cfg)
        self.stats.template_dropped += dropped
        return a

    def decide(self, a: Analysed) -> Outcome:
        """Decide an analysed page (its template filter already applied); writes the
        index and clusters in one batch. A page id decided before returns its stored
        decision."""
        rec = self.clusters.page(a.pid)
        if rec is not None:
            return self._repeated(a, rec)
        return self._decide_new(a)

    def _decide_new(self, a: Analysed) -> Outcome:
        """``decide`` for a page id not decided before (the caller has looked)."""
        with self.stats.timed("index"):
            found = self.index.lookup(a.fps, a.order)
            cands = page_candidates(a, found, self.cfg)
            sketches = self.index.sketches(list(cands))
            pm = page_matches(a, cands, sketches, self.cfg)
        with self.stats.timed("cluster"):
            page_id = a.page.page_id
            me = PageKey(a.pid, a.order, page_id)
            result = cluster_step(me, pm.verified, pm.covered, self.clusters, self.cfg)
            best = result.kept[0] if result.kept else None
            other = self.clusters.page(best.pid) if best else None
            now = utc_now()
            decision = decision_message(
                a,
                best,
                duplicate_of=str(other["page_id"]) if other else None,
                duplicate_of_url=str(other["url"]) if other else None,
                cluster_id=result.root.page_id,
                engine_info=self.engine_info,
                decided_at=now,
            )
            record: dict[str, Any] = {"page_id": page_id, "url": a.page.url, "order": a.order}
            record["decision"] = decision
            self._put_record(a.pid, record)
        if a.template_only:
            self.stats.template_only += 1
        else:
            with self.stats.timed("index"):
                self.index.add(found, make_entry(a.pid, a.fps, a.order), a.fps)
        merges = tuple(Merge(k.page_id, result.root.page_id, page_id, now) for k in result.merged)
        return Outcome(decision, merges)

    def _repeated(self, a: Analysed, rec: dict[str, object]) -> Outcome:
        """The stored decision for a page id decided before, flagged if the content differs."""
        decision = stored_decision(self.clusters, rec)
        self.stats.repeated += 1
        conflict = conflicts_with(decision, a)
        if conflict:
            self.stats.conflicts += 1
            log.warning(
                "page id %s came again with other content (fingerprint %016x, decided as %s)"
                "; the first decision stands",
                a.page.page_id,
                a.fps.fp1,
                decision.get("fingerprint"),
            )
        return Outcome(decision, (), True, conflict)

    def _put_record(self, pid: int, record: dict[str, Any]) -> None:
        self.kv.put_many([(b"M" + pid.to_bytes(8, "big"), orjson.dumps(record))])

    def process(self, page: RawPage | Rejected) -> Outcome | Rejected:
        """One page to one outcome. Never raises: a failure becomes ``Rejected(internal)``."""
        if isinstance(page, Rejected) or self.sandbox is None:
            return self._finish(page, None)
        try:
            analysed = self.sandbox.analyse(page, self.stats)
        except Exception as exc:  # a bug, not bad input: logged once, page dead-lettered
            analysed = internal_rejection(page, exc)
        return self._finish(page, analysed)

    def process_many(self, pages: Iterable[RawPage | Rejected]) -> Iterator[Outcome | Rejected]:
        """``process`` for each item, in order. With the sandbox, its worker analyses the
        next pages while this process decides one (``Sandbox.stream``)."""
        if self.sandbox is None:
            yield from map(self.process, pages)
            return
        for page, analysed in self.sandbox.stream(pages, self.stats):
            yield self._finish(page, analysed)

    def _finish(
        self, page: RawPage | Rejected, analysed: Analysed | Rejected | None
    ) -> Outcome | Rejected:
        """The rest of ``process`` once ``page`` is analysed (None: analyse it here)."""
        self.stats.pages += 1
        if isinstance(page, Rejected):
            self.stats.rejects[str(page.reason)] += 1
            return page
        try:
            if analysed is None:
                analysed = analyse(page, self.cfg, self.stats)
            if isinstance(analysed, Rejected):
                self.stats.rejects[str(analysed.reason)] += 1
                return analysed
            outcome = self.decide_analysed(analysed)
            self.kv.commit()
        except Exception as exc:  # a bug, not bad input: logged once, page dead-lettered
            self.kv.rollback()
            rejected = internal_rejection(page, exc)
            self.stats.rejects[str(Reason.INTERNAL)] += 1
            return rejected
        if outcome.repeated:
            return outcome
        self.stats.decisions[outcome.decision["decision"]] += 1
        self.stats.merges += len(outcome.merges)
        return outcome

    def cluster_of(self, page_id: str) -> str:
        return self.clusters.cluster_of(page_pid(page_id))

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.kv.close()
