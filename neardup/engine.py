"""The engine: one raw page in, one decision (plus cluster merges) or one rejection out.

The stages are plain modules (decode, extract, normalise, fingerprint, template, index,
decide, cluster); this file only wires them and counts. The command line calls ``Engine``;
the Kafka worker calls the same pieces: ``analyse`` (pure, the expensive part), then the
template filter, index, decide and cluster stages on partitioned state. ``Engine.process``
runs ``analyse`` in ``neardup.sandbox``, bounded in time and memory, unless the config's
``extract_timeout_s`` is 0.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import orjson

from neardup import __version__
from neardup.cluster import Clusters, PageKey
from neardup.config import EngineConfig
from neardup.decide import Kind, Match, candidates, matches
from neardup.decode import decode
from neardup.extract import extract
from neardup.fingerprint import (
    Fingerprints,
    fingerprint,
    hash64,
    period_hashes,
)
from neardup.index import KVIndex, make_entry
from neardup.normalise import normalise_many
from neardup.records import Extracted, RawPage, Reason, Rejected, utc_now
from neardup.store import KV, BufferedKV
from neardup.template import TemplateFilter

log = logging.getLogger(__name__)

#: A page whose non-template sentences hold at most this share of its 5-grams, and no
#: period string, is template-only.
TEMPLATE_ONLY_SHARE = 0.2
#: The template filter counts at most this many of a page's prose strings (the lowest
#: hashes): a page with thousands of comments must not write thousands of counts.
MAX_PROSE_STRINGS = 256
#: A main-text line this long or longer counts in the host's template statistics as a
#: block (``block_key``); shorter lines are bylines and labels, left to ``strip_noise``.
BLOCK_MIN_CHARS = 20
#: A page whose main text is at most this long carries it (and the runner-up block) to the
#: template stage, which fingerprints what is left once the host's template lines are
#: dropped. A template block that wins the main text is at most a few hundred characters;
#: a longer main text has its article in it, and the period-string filter suffices.
SWITCH_MAX_CHARS = 3000
STAGES = ("decode", "extract", "normalise", "template", "fingerprint", "index", "cluster")


def page_pid(page_id: str) -> int:
    """The 64-bit id under which the index and the clusters know a page."""
    return hash64(page_id)


# RFC 3339 allows a leap second and a lower-case "z"; fromisoformat takes neither.
_LEAP_SECOND = re.compile(r"(?<=[Tt ]\d{2}:\d{2}:)60")


def page_order(fetched_at: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time (naive times are UTC). A leap
    second (``23:59:60``) counts as the first moment of the next minute."""
    text, leap = _LEAP_SECOND.subn("59", fetched_at.strip())
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    ts = dt.datetime.fromisoformat(text)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return int(ts.timestamp() * 1000) + 1000 * leap


def page_host(page: RawPage) -> str:
    """The template filter's scope: the ``site`` field, else the URL's host. Raises
    ``ValueError`` for a URL whose host cannot be read (``http://[::1/``)."""
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
    #: Period strings of the prose anywhere on the page (``Extracted.prose``): the
    #: template filter counts them with the main text's, so that a template's leftover
    #: paragraph is learned as template also from the pages whose main text left it out.
    prose_strings: tuple[int, ...] = ()
    #: Block keys (``block_key``) of each main-text line (0: too short to count), of each
    #: line of the runner-up block, and of the page's prose. The template filter counts
    #: them per host: a line on many of a host's pages is template, however its sentences
    #: end, and a main text made of such lines gives way to the runner-up block.
    line_keys: tuple[int, ...] = ()
    alt_keys: tuple[int, ...] = ()
    prose_keys: tuple[int, ...] = ()
    #: The normalised main text and runner-up block, for a main text of at most
    #: ``SWITCH_MAX_CHARS`` (else empty): what the template stage fingerprints again.
    text: str = ""
    alt_text: str = ""
    #: The primary fingerprint of the main text as extracted, when the template stage
    #: fingerprinted other text (0: ``fps.fp1`` is it). Decisions report it, so that a
    #: page seen again is known by what it carries (``conflicts_with``).
    extracted_fp: int = 0


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


@dataclass
class Stats:
    """Counts and time per stage; the Prometheus metrics and the benchmark read these."""

    pages: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    merges: int = 0
    repeated: int = 0
    #: Repeated page ids whose content differs from what was decided under them.
    conflicts: int = 0
    template_dropped: int = 0
    template_only: int = 0

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0


def _over(body: str | bytes, limit: int) -> bool:
    """Whether the body is over ``limit`` bytes (a text body counted in UTF-8)."""
    if isinstance(body, bytes) or len(body) > limit:
        return len(body) > limit
    # 1 to 4 bytes a character: only a text near the limit is worth encoding
    return 4 * len(body) > limit and len(body.encode("utf-8", "surrogatepass")) > limit


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_unencodable(page: RawPage) -> Rejected | None:
    """A rejection if a field holds a lone surrogate (a code point, no character).

    parse_raw never makes such a page (its JSON parser refuses them), but a RawPage built
    by other code may: no UTF-8 record can carry one, and mmh3 crashes the process on one
    (hashing the page id, or the host). The body is decode's business: it replaces them.
    """
    fields = (page.page_id, page.url, page.fetched_at, page.content_type, page.site or "")
    if all(f.isascii() for f in fields) or not any(map(_LONE_SURROGATE.search, fields)):
        return None
    return Rejected(
        Reason.SCHEMA,
        "a field holds a lone surrogate, which is no character",
        _LONE_SURROGATE.sub("\ufffd", page.page_id),
        _LONE_SURROGATE.sub("\ufffd", page.url),
    )


# One early return per stage's rejection: a pipeline reads better flat than nested.
def analyse(  # noqa: PLR0911
    page: RawPage, cfg: EngineConfig, stats: Stats | None = None, utf8: bytes | None = None
) -> Analysed | Rejected:
    """Decode, extract, normalise and fingerprint one page. Pure: no state is read, so this,
    the expensive part, runs anywhere (any worker, any partition). ``utf8``: see
    ``decode``."""
    st = stats or Stats()
    refused = refuse_unencodable(page)
    if refused is not None:
        return refused
    try:
        order = page_order(page.fetched_at)
    except ValueError as exc:
        return Rejected(Reason.SCHEMA, f"fetched_at: {exc}", page.page_id, page.url)
    try:
        host = page_host(page)
    except ValueError as exc:
        return Rejected(Reason.SCHEMA, f"url: {exc}", page.page_id, page.url)
    # parse_raw enforces the cap already; a page from any other source must not skip it
    if _over(page.body, cfg.max_bytes):
        detail = f"body is over {cfg.max_bytes} bytes"
        return Rejected(Reason.TOO_LARGE, detail, page.page_id, page.url)
    with st.timed("decode"):
        decoded = decode(page, utf8)
    if isinstance(decoded, Rejected):
        return decoded
    with st.timed("extract"):
        extracted = extract(decoded, cfg.extractor)
    if isinstance(extracted, Rejected):
        return extracted
    with st.timed("normalise"):  # the prose too (for the template filter, below)
        text, prose_text, alt_text = normalise_many(
            [extracted.text, "\n".join(extracted.prose), "\n".join(extracted.alternative)]
        )
    if len(text) < cfg.min_text_chars:
        return Rejected(
            Reason.NO_TEXT,
            f"main text has {len(text)} characters, fewer than {cfg.min_text_chars}",
            page.page_id,
            page.url,
        )
    if len(text) > cfg.max_text_chars:
        detail = f"main text has {len(text)} characters, more than {cfg.max_text_chars}"
        return Rejected(Reason.TOO_LARGE, detail, page.page_id, page.url)
    with st.timed("fingerprint"):
        fps = fingerprint(text, cfg)
    if fps.words < 2:
        return Rejected(Reason.NO_TEXT, "fewer than two words of main text", page.page_id, page.url)
    with st.timed("template"):
        prose = prose_strings(prose_text, cfg)
        line_keys = tuple(map(block_key, text.split("\n")))
        alt_keys = tuple(map(block_key, alt_text.split("\n"))) if alt_text else ()
        prose_keys = {k for k in map(block_key, prose_text.split("\n")) if k}
        switchable = len(text) <= SWITCH_MAX_CHARS
    return Analysed(
        page,
        page_pid(page.page_id),
        order,
        host,
        extracted.title.strip(),
        len(text.replace("\n", "")),
        fps,
        decoded.charset,
        decoded.layer,
        prose_strings=prose,
        line_keys=line_keys,
        alt_keys=alt_keys,
        prose_keys=tuple(sorted(prose_keys)[:MAX_PROSE_STRINGS]),
        text=text if switchable else "",
        alt_text=alt_text if switchable else "",
    )


def extract_page(
    page: RawPage, cfg: EngineConfig, stats: Stats | None = None, utf8: bytes | None = None
) -> Extracted | Rejected:
    """Decode and extract one page: ``analyse``'s first stages, for ``neardup extract``."""
    st = stats or Stats()
    with st.timed("decode"):
        decoded = decode(page, utf8)
    if isinstance(decoded, Rejected):
        return decoded
    with st.timed("extract"):
        return extract(decoded, cfg.extractor)


def internal_rejection(page: RawPage, exc: Exception) -> Rejected:
    """A page dead-lettered for a bug (an exception), logged with its traceback once."""
    log.exception("engine failed on page %s (%s)", page.page_id, page.url)
    detail = f"{type(exc).__name__}: {exc}"[:500]
    return Rejected(Reason.INTERNAL, detail, page.page_id, page.url)


def prose_strings(prose: str, cfg: EngineConfig) -> tuple[int, ...]:
    """Hashed period strings of a page's prose, normalised (``normalise``) like its main
    text."""
    return tuple(period_hashes(prose, cfg.period_len)[:MAX_PROSE_STRINGS])


def block_key(line: str) -> int:
    """A main-text or prose line's key in the host's template counts; 0 for a short line.
    Whitespace is left out; the prefix keeps block keys apart from period-string hashes."""
    squeezed = "".join(line.split())
    if len(squeezed) < BLOCK_MIN_CHARS:
        return 0
    return hash64("\x00block\x00" + squeezed)


def without_template_blocks(a: Analysed, template: set[int], cfg: EngineConfig) -> Analysed:
    """The page with its main-text lines that are template blocks of its host dropped,
    fingerprinted again: when nothing worth comparing is left, the runner-up block less
    its own template lines; when that is empty too, the page is template-only. A page
    that carries no text (a long main text) or no template line is returned as it is."""
    if not a.text or not any(k in template for k in a.line_keys if k):
        return a
    kept = [x for x, k in zip(a.text.split("\n"), a.line_keys, strict=True) if k not in template]
    if sum(map(len, kept)) < cfg.min_text_chars and a.alt_text:
        alt = a.alt_text.split("\n")
        kept = [x for x, k in zip(alt, a.alt_keys, strict=True) if k not in template]
    chars = sum(map(len, kept))
    fps = fingerprint("\n".join(kept), cfg) if chars >= cfg.min_text_chars else None
    if fps is None or fps.words < 2:
        return replace(a, template_only=True)
    return replace(a, fps=fps, text_chars=chars, extracted_fp=a.extracted_fp or a.fps.fp1)


def conflicts_with(decision: Mapping[str, Any], a: Analysed) -> bool:
    """Whether ``a`` carries other content than the page its id was decided as: its
    primary fingerprint differs from the stored decision's (the fingerprint covers the
    whole main text, template sentences included, so the same page always agrees)."""
    return decision.get("fingerprint") != f"{a.fps.fp1:016x}"


def without_template(a: Analysed, template: set[int], cfg: EngineConfig) -> Analysed:
    """The page with its template sentences dropped from the containment features (period
    strings) and from the verification sketch. SimHash keeps the whole text."""
    if not template:
        return a
    fps = a.fps.without(template, cfg.sketch_size, cfg.exact_shingles)
    only = not fps.strings and fps.shingles <= TEMPLATE_ONLY_SHARE * a.fps.shingles
    return replace(a, fps=fps, template_only=only or a.template_only)


def for_decision(a: Analysed) -> Analysed:
    """``a`` without what only the template filter reads: the per-piece data of its
    fingerprints and the prose's period strings. What the stages after the filter keep of
    a page (the worker's pages in flight are stored so): the decision reads neither."""
    fps = a.fps
    if not (
        fps.piece_strings or fps.shingle_hashes or fps.piece_chars or a.prose_strings
        or a.line_keys or a.alt_keys or a.prose_keys or a.text or a.alt_text
    ):  # fmt: skip
        return a
    slim = replace(fps, piece_strings=b"", shingle_hashes=b"", piece_chars=b"")
    return replace(
        a, fps=slim, prose_strings=(), line_keys=(), alt_keys=(), prose_keys=(), text="",
        alt_text="",
    )  # fmt: skip


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
        """The stateful stages for a page from the pure ``analyse``: the host's template
        filter, then ``decide``. A page id decided before returns its stored decision and
        counts nothing, so a redelivered page leaves the state as it was."""
        rec = self.clusters.page(a.pid)
        if rec is not None:
            return self._repeated(a, rec)
        return self._decide_new(self.filter_template(a))

    def filter_template(self, a: Analysed) -> Analysed:
        """The page without its host's template sentences; counts the page in its host's
        template statistics."""
        with self.stats.timed("template"):
            template, _ = self.templates.filter(
                a.host,
                a.fps.strings,
                a.prose_strings,
                blocks=[k for k in a.line_keys if k],
                also_blocks=[k for k in (*a.alt_keys, *a.prose_keys) if k],
            )
            a = without_template_blocks(a, template, self.cfg)
        self.stats.template_dropped += len(template)
        return without_template(a, template, self.cfg)

    def decide(self, a: Analysed) -> Outcome:
        """Decide an analysed page; writes the index and clusters in one batch. A page id
        decided before returns its stored decision."""
        rec = self.clusters.page(a.pid)
        if rec is not None:
            return self._repeated(a, rec)
        return self._decide_new(a)

    def _decide_new(self, a: Analysed) -> Outcome:
        """``decide`` for a page id not decided before (the caller has looked)."""
        with self.stats.timed("index"):
            found = self.index.lookup(a.fps, a.order)
            cands = {} if a.template_only else candidates(a.fps, found, self.cfg, a.pid)
            sketches = self.index.sketches(list(cands))
            covered: dict[int, float] = {}
            verified = matches(a.fps, cands, sketches, self.cfg, covered)
            found_matches = self._without_bridges(verified, covered)
        with self.stats.timed("cluster"):
            page_id = a.page.page_id
            record: dict[str, Any] = {"page_id": page_id, "url": a.page.url, "order": a.order}
            me = PageKey(a.pid, a.order, page_id)
            root, merged = self.clusters.join(me, [m.pid for m in found_matches])
            best = found_matches[0] if found_matches else None
            other = self.clusters.page(best.pid) if best else None
            now = utc_now()
            decision = decision_message(
                a,
                best,
                duplicate_of=str(other["page_id"]) if other else None,
                duplicate_of_url=str(other["url"]) if other else None,
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

    def _without_bridges(self, found: list[Match], covered: Mapping[int, float]) -> list[Match]:
        """The matches that may join clusters: containment must not bridge unrelated
        clusters through text they share (a boilerplate block on pages of one site, or of
        sites that share a publisher), which chains every page that carries it.

        * A page contained in pages of several clusters, and a duplicate of none, is text
          they have in common: it joins its best match only and merges nothing.
        * A page whose only matches in a cluster are pages it contains that are already
          contained in another page, each a small part of it (under ``excerpt_share``),
          is a third page around the same shared text: it joins nothing there, unless it
          shares with another page of that cluster clearly more than the contained page
          explains (``excerpt_margin``). That is a full copy of a story whose excerpt
          came first, and full copies edited apart need not match each other.
        """
        if not found:
            return found
        roots = {m.pid: self.clusters.find(m.pid) for m in found}
        if len(set(roots.values())) > 1 and all(m.kind is Kind.CONTAINED for m in found):
            return found[:1]
        by_root: dict[int, list[Match]] = {}
        for m in found:
            by_root.setdefault(roots[m.pid], []).append(m)
        kept: list[Match] = []
        for root, group in by_root.items():
            if not all(self._is_bridge(m) for m in group) or self._beyond_excerpt(
                root, group, covered
            ):
                kept.extend(group)
        kept.sort(key=Match.sort_key)
        for m in kept:
            if m.kind is Kind.CONTAINS:
                self._mark_contained(m.pid)
        return kept

    def _beyond_excerpt(self, root: int, group: list[Match], covered: Mapping[int, float]) -> bool:
        """Whether this page shares with a page of ``root``'s cluster, other than the
        contained pages in ``group``, more of its text than those pages make up."""
        mine = {m.pid for m in group}
        need = max(m.share for m in group) + self.cfg.excerpt_margin
        return any(
            share >= need and pid not in mine and self.clusters.find(pid) == root
            for pid, share in covered.items()
        )

    def _is_bridge(self, m: Match) -> bool:
        """Whether ``m`` is a small page this page contains, contained in another page."""
        small = m.share < self.cfg.excerpt_share
        return m.kind is Kind.CONTAINS and small and self._is_contained(m.pid)

    def _is_contained(self, pid: int) -> bool:
        rec = self.clusters.page(pid) or {}
        decision = rec.get("decision")
        kind = decision.get("decision") if isinstance(decision, dict) else None
        return bool(rec.get("contained")) or kind == str(Kind.CONTAINED)

    def _mark_contained(self, pid: int) -> None:
        rec = self.clusters.page(pid)
        if rec is not None and not rec.get("contained"):
            rec["contained"] = True
            self._put_record(pid, rec)

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
