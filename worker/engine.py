"""The engine: one raw page in, one decision (plus cluster merges) or one rejection out.

The stages are plain modules (decode, extract, normalise, fingerprint, template, index,
decide, cluster); this file only wires them and counts. The command line calls ``Engine``;
the Kafka worker calls the same pieces: ``analyse`` (pure, the expensive part), then the
template filter, index, decide and cluster stages on partitioned state.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from worker import __version__
from worker.cluster import Clusters, PageKey
from worker.config import EngineConfig
from worker.decide import Kind, Match, candidates, matches
from worker.decode import decode
from worker.extract import extract
from worker.fingerprint import (
    Fingerprints,
    fingerprint,
    hash64,
)
from worker.index import KVIndex, make_entry
from worker.normalise import normalise
from worker.records import RawPage, Reason, Rejected, utc_now
from worker.store import KV, BufferedKV
from worker.template import TemplateFilter

log = logging.getLogger(__name__)

#: A page whose non-template sentences hold at most this share of its 5-grams, and no
#: period string, is template-only.
TEMPLATE_ONLY_SHARE = 0.2
STAGES = ("decode", "extract", "normalise", "template", "fingerprint", "index", "cluster")


def page_pid(page_id: str) -> int:
    """The 64-bit id under which the index and the clusters know a page."""
    return hash64(page_id)


def page_order(fetched_at: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time (naive times are UTC)."""
    ts = dt.datetime.fromisoformat(fetched_at.strip().replace("Z", "+00:00"))
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return int(ts.timestamp() * 1000)


def page_host(page: RawPage) -> str:
    """The template filter's scope: the ``site`` field, else the URL's host."""
    return page.site or (urlsplit(page.url).hostname or "").removeprefix("www.")


@dataclass(frozen=True, slots=True)
class Analysed:
    """A page ready to decide: its fingerprints and what the decision reports."""

    page: RawPage
    pid: int
    order: int
    host: str
    title: str
    text_chars: int
    fps: Fingerprints
    charset: str
    layer: str
    #: Every period string of the page is template text of its host and template
    #: sentences carry most of its 5-grams: nothing is left to compare, so the page is
    #: decided unique and kept out of the index (it must not join unrelated pages).
    template_only: bool = False


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
    returned unchanged and nothing is written.
    """

    decision: dict[str, Any]
    merges: tuple[Merge, ...] = ()
    repeated: bool = False


@dataclass
class Stats:
    """Counts and time per stage; the Prometheus metrics and the benchmark read these."""

    pages: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    merges: int = 0
    repeated: int = 0
    template_dropped: int = 0
    template_only: int = 0

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0


def analyse(page: RawPage, cfg: EngineConfig, stats: Stats | None = None) -> Analysed | Rejected:
    """Decode, extract, normalise and fingerprint one page. Pure: no state is read, so this,
    the expensive part, runs anywhere (any worker, any partition)."""
    st = stats or Stats()
    try:
        order = page_order(page.fetched_at)
    except ValueError as exc:
        return Rejected(Reason.SCHEMA, f"fetched_at: {exc}", page.page_id, page.url)
    with st.timed("decode"):
        decoded = decode(page)
    if isinstance(decoded, Rejected):
        return decoded
    with st.timed("extract"):
        extracted = extract(decoded, cfg.extractor)
    if isinstance(extracted, Rejected):
        return extracted
    with st.timed("normalise"):
        text = normalise(extracted.text)
    if len(text) < cfg.min_text_chars:
        return Rejected(
            Reason.NO_TEXT,
            f"main text has {len(text)} characters, fewer than {cfg.min_text_chars}",
            page.page_id,
            page.url,
        )
    with st.timed("fingerprint"):
        fps = fingerprint(text, cfg)
    if fps.words < 2:
        return Rejected(Reason.NO_TEXT, "fewer than two words of main text", page.page_id, page.url)
    return Analysed(
        page,
        page_pid(page.page_id),
        order,
        page_host(page),
        extracted.title.strip(),
        len(text.replace("\n", "")),
        fps,
        decoded.charset,
        decoded.layer,
    )


def without_template(a: Analysed, template: set[int], cfg: EngineConfig) -> Analysed:
    """The page with its template sentences dropped from the containment features (period
    strings) and from the verification sketch. SimHash keeps the whole text."""
    if not template:
        return a
    fps = a.fps.without(template, cfg.sketch_size)
    only = not fps.strings and fps.shingles <= TEMPLATE_ONLY_SHARE * a.fps.shingles
    return replace(a, fps=fps, template_only=only)


def decision_message(
    a: Analysed,
    best: Match | None,
    *,
    duplicate_of: str | None,
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
        "cluster_id": cluster_id,
        "distance": best.distance if best else None,
        "similarity": round(best.similarity, 4) if best else None,
        "fingerprint": f"{a.fps.fp1:016x}",
        "title": a.title,
        "text_chars": a.text_chars,
        "decided_at": decided_at,
        "engine": engine_info,
    }


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

    def decide_analysed(self, a: Analysed) -> Outcome:
        """The stateful stages for a page from the pure ``analyse``: the host's template
        filter, then ``decide``. A page id decided before returns its stored decision and
        counts nothing, so a redelivered page leaves the state as it was."""
        rec = self.clusters.page(a.pid)
        if rec is not None:
            self.stats.repeated += 1
            return Outcome(dict(rec["decision"]), (), True)  # type: ignore[call-overload]
        with self.stats.timed("template"):
            template, _ = self.templates.filter(a.host, a.fps.strings)
        self.stats.template_dropped += len(template)
        return self.decide(without_template(a, template, self.cfg))

    def decide(self, a: Analysed) -> Outcome:
        """Decide an analysed page; writes the index and clusters in one batch."""
        rec = self.clusters.page(a.pid)
        if rec is not None:
            self.stats.repeated += 1
            return Outcome(dict(rec["decision"]), (), True)  # type: ignore[call-overload]
        with self.stats.timed("index"):
            found = self.index.lookup(a.fps, a.order)
            cands = {} if a.template_only else candidates(a.fps, found, self.cfg, a.pid)
            sketches = self.index.sketches(list(cands))
            found_matches = matches(a.fps, cands, sketches, self.cfg)
        with self.stats.timed("cluster"):
            page_id = a.page.page_id
            record: dict[str, Any] = {"page_id": page_id, "url": a.page.url, "order": a.order}
            self._put_record(a.pid, record)
            me = PageKey(a.pid, a.order, page_id)
            root, merged = self.clusters.join(me, [m.pid for m in found_matches])
            best = found_matches[0] if found_matches else None
            other = self.clusters.page(best.pid) if best else None
            now = utc_now()
            decision = decision_message(
                a,
                best,
                duplicate_of=str(other["page_id"]) if other else None,
                cluster_id=root.page_id,
                engine_info=self.engine_info,
                decided_at=now,
            )
            record["decision"] = decision
            self._put_record(a.pid, record)
        if a.template_only:
            self.stats.template_only += 1
        else:
            with self.stats.timed("index"):
                self.index.add(found, make_entry(a.pid, a.fps, a.order), a.fps)
        merges = tuple(Merge(k.page_id, root.page_id, page_id, now) for k in merged)
        return Outcome(decision, merges)

    def _put_record(self, pid: int, record: dict[str, Any]) -> None:
        import json

        self.kv.put_many(
            [(b"M" + pid.to_bytes(8, "big"), json.dumps(record, ensure_ascii=False).encode())]
        )

    def process(self, page: RawPage | Rejected) -> Outcome | Rejected:
        """One page to one outcome. Never raises: a failure becomes ``Rejected(internal)``."""
        self.stats.pages += 1
        if isinstance(page, Rejected):
            self.stats.rejects[str(page.reason)] += 1
            return page
        try:
            analysed = analyse(page, self.cfg, self.stats)
            if isinstance(analysed, Rejected):
                self.stats.rejects[str(analysed.reason)] += 1
                return analysed
            outcome = self.decide_analysed(analysed)
            self.kv.commit()
        except Exception as exc:  # a bug, not bad input: logged once, page dead-lettered
            self.kv.rollback()
            log.exception("engine failed on page %s (%s)", page.page_id, page.url)
            self.stats.rejects[str(Reason.INTERNAL)] += 1
            return Rejected(
                Reason.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], page.page_id, page.url
            )
        if outcome.repeated:
            return outcome
        self.stats.decisions[outcome.decision["decision"]] += 1
        self.stats.merges += len(outcome.merges)
        return outcome

    def cluster_of(self, page_id: str) -> str:
        return self.clusters.cluster_of(page_pid(page_id))

    def close(self) -> None:
        self.kv.close()
