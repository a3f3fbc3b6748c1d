"""The decide task: pages by pid, from their probe answers to their published decision.

A page reaches decide task p (``partition_of_pid``) from its hosts task as a ``ToDecide``
with the record later pages verify against. Pages wait behind the hosts tasks' marks
(W_p) and are taken in key order, so that of two pages with one id, from two hosts tasks,
the earlier is the first; its record is kept from then on. The buckets answer a page's
probes (one ``Answer`` a probes partition, in any order, even before the page). With
every answer in, the task builds the engine's ``Lookup`` from them, asks the candidates'
decide tasks for their records (``SketchAsk``; a record not there yet comes: it was
committed before the probe that found it) and verifies the candidates. A page that
matches nothing is decided at once: unique, its own cluster, as the cluster step would
decide it. A page that matches goes to the order task as an ``Edge`` and is decided on
its ``Verdict`` (the matches kept, the cluster's root, the roots merged). A page id
decided before gets its first decision, once that is made.

On every ``tick`` the task marks the order task: no edge will come from here below
K_p = min(W_p, the least key whose matches are not computed). Pages that wait for a
verdict hold nothing back, or the two tasks would wait on each other.

Each change of state is written to the task's store as it is made (an answer or a sketch
reply once, under a key of its own); ``DecideTask(store)`` over the last commit resumes
where that commit left off.

Retention of the records, and pages given up because a record for them could not be
read: ``neardup.flow.upkeep``.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable

import orjson

from neardup import __version__
from neardup.config import EngineConfig
from neardup.decide import Match
from neardup.engine import Merge
from neardup.flow.codec import decode, encode
from neardup.flow.expiry import ORDER_SOURCE
from neardup.flow.messages import (
    ORDER,
    PAGES,
    Answer,
    Edge,
    Key,
    Mark,
    Out,
    SketchAsk,
    SketchReply,
    ToDecide,
    Verdict,
    WireError,
    partition_of_pid,
)
from neardup.flow.pending import (
    ANSWER,
    HEARD,
    REPLY,
    Pending,
    Sources,
    Stored,
    edge_match,
    heard_key,
    heard_keys,
    load_heard,
    match_of,
    name_of,
    page_record,
)
from neardup.flow.storeformat import decode_stored
from neardup.flow.upkeep import (
    ASK,
    HELD,
    LOST_ORDER,
    MARK,
    PROGRESS,
    RECORD,
    REPEAT,
    TODO,
    Upkeep,
)
from neardup.flow.watermark import Store, Watermark, key_bytes, key_from_bytes
from neardup.index import KVIndex, Lookup
from neardup.records import utc_now
from neardup.steps import conflicts_with, decision_message, page_candidates, page_matches
from neardup.store import MemoryKV

log = logging.getLogger(__name__)

#: The topics users read (``neardup.flow.messages`` names the internal ones).
DECISIONS, MERGES = "decisions", "merges"

_U32 = struct.Struct("<I")


class DecideTask(Upkeep):
    """Decide task ``partition`` of ``partitions`` (as many hosts tasks mark it)."""

    def __init__(
        self,
        store: Store,
        cfg: EngineConfig,
        partition: int,
        partitions: int,
        *,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``wait``: ``order_wait`` of the watermark the pages wait behind
        (``neardup.flow.watermark``)."""
        self.store, self.cfg = store, cfg
        self.partition, self.partitions = partition, partitions
        self.engine_info = {"version": __version__, "params": str(cfg)}
        self.index = KVIndex(MemoryKV(), cfg)  # the keys of a page, and lookups from answers
        #: decisions by kind, merges, edges, repeated, conflicts (this process)
        self.counts: Counter[str] = Counter()
        self.sources = Sources(partitions)
        self.watermark = Watermark(store, HELD, partitions, wait, clock)
        self.pages: dict[Key, Pending] = {}
        self.repeats: dict[int, list[ToDecide]] = {}
        self.asks: dict[Key, SketchAsk] = {}
        #: Pids asked for whose records have not come, and who asked.
        self.missing: dict[int, set[Key]] = {}
        self._last_mark: Mark | None = None
        self.load()

    def step(self, raw: bytes, arrived: float = -math.inf) -> list[Out]:
        """Take one record of the task's pages partition (``arrived``: its timestamp, which
        the decision does not read); the records to send."""
        msg = decode(raw)
        out: list[Out] = []
        if isinstance(msg, ToDecide):
            if not self.watermark.add(msg.key, raw, arrived, msg):
                self.counts["late"] += 1
        elif isinstance(msg, Answer):
            self._on_answer(msg, raw, out)
        elif isinstance(msg, SketchAsk):
            self._serve(msg, out)
        elif isinstance(msg, SketchReply):
            self._on_reply(msg, raw, out)
        elif isinstance(msg, Verdict):
            self._on_verdict(msg, out)
        elif isinstance(msg, Mark) and msg.source == ORDER_SOURCE:
            if msg.frontier is not None:
                self.on_horizon(msg.frontier[0])
        elif isinstance(msg, Mark):
            self.sources.on_mark(msg)
            self.watermark.on_mark(msg)
            self.store.put_many([(MARK + _U32.pack(msg.source), encode(msg))])
        else:
            raise WireError(f"a {type(msg).__name__} does not belong on a pages partition")
        self._release(out)
        return out

    def _release(self, out: list[Out]) -> None:
        """Take the pages the watermark lets go: in key order, so that of two pages with
        one id (from two hosts tasks, which keep no order between them) the earlier is
        the first, as in ``neardup dedup``."""
        for _, m, raw in self.watermark.release_decoded(decode_stored, payloads=True):
            assert isinstance(m, ToDecide) and raw is not None  # (only pages are held)
            self._on_page(m, raw, out)
        self.watermark.flush()  # what is still held, into the store before the commit

    def tick(self, idle: bool = False) -> list[Out]:
        """What a step ends with: the pages a wait over lets go, then the task's mark for
        the order task. ``idle``: the task has read all of its input (drained, then, if
        every source is and no page here is held or open)."""
        out: list[Out] = []
        self._release(out)
        drained = None
        if idle and not len(self.watermark) and not any(p.open for p in self.pages.values()):
            drained = self.sources.drained_at()
        self.sweep()
        mark = Mark(self.partition, self.frontier(), drained)
        if mark != self._last_mark:  # the same mark again says nothing: no record, no commit
            self._last_mark = mark
            out.append(Out(ORDER, 0, b"", encode(mark)))
        return out

    def frontier(self) -> Key | None:
        """K_p: no edge below it will come from this task (None: W_p is not known)."""
        w = self.watermark.w
        low = min((k for k, p in self.pages.items() if p.open), default=None)
        return w if w is None or low is None else min(w, low)

    # -- pages and answers -------------------------------------------------------------------

    def _on_page(self, m: ToDecide, raw: bytes, out: list[Out]) -> None:
        pid = m.analysed.pid
        stored = self._record(pid)
        if pid in self.lost:
            if stored is None:  # (the pages that find it read its record)
                self._put_record(pid, Stored(page_record(m.analysed), b""), out)
            page = self.pages.setdefault(m.key, Pending())
            page.todo = m
            self.give_up(m.key, page, "its id was given up before", out)
            return
        if stored is None:
            self._note(pid, m.key[0])
            self._put_record(pid, Stored(page_record(m.analysed), b""), out)
            page = self.pages.setdefault(m.key, Pending())
            page.todo = m
            self.store.put_many([(TODO + key_bytes(m.key), raw)])
            self._advance(m.key, page, out)
            return
        # a page id with a record: its first content wins, its first decision is sent
        self.counts["repeated"] += 1
        stored = self._touch(pid, stored, m.key[0])
        if m.probes:  # (its hosts task took it for a new page: see ``Pending.drop``)
            mine = self.pages.setdefault(m.key, Pending())
            if mine.todo is None:  # the answers here are its own
                mine.drop = m.probes - len(mine.answers)
                self._forget(m.key, mine)
            else:  # the first page has the same key: their answers differ by count only
                mine.drop += m.probes
            self._save(m.key, mine)
        if stored.decision:
            self._repeat(m, stored.decision, out)
        else:  # the first page of the id is not decided yet
            waiting = self.repeats.setdefault(pid, [])
            at = REPEAT + pid.to_bytes(8, "big") + len(waiting).to_bytes(4, "big")
            waiting.append(m)
            self.store.put_many([(at, raw)])

    def _repeat(self, m: ToDecide, decision: bytes, out: list[Out]) -> None:
        first = orjson.loads(decision)
        if conflicts_with(first, m.analysed):
            self.counts["conflicts"] += 1
            log.warning(
                "page id %s came again with other content (fingerprint %016x, decided as %s)"
                "; the first decision stands",
                m.key[1],
                m.analysed.fps.fp1,
                first.get("fingerprint"),
            )
        out.append(Out(DECISIONS, None, m.key[1].encode(), decision))

    def _on_answer(self, m: Answer, raw: bytes, out: list[Out]) -> None:
        if m.key[0] == LOST_ORDER:
            self.on_lost(m.key[1], out)
            return
        if m.pid in self.lost:  # (its page was given up)
            return
        page = self.pages.setdefault(m.key, Pending())
        if page.drop:
            page.drop -= 1
        else:
            self.store.put_many([(heard_key(m.key, ANSWER, len(page.answers)), raw)])
            page.answers.append(m)
        self._save(m.key, page)
        self._advance(m.key, page, out)

    def _save(self, key: Key, page: Pending) -> None:
        """Write what ``page`` holds but its answers and replies (each written as it
        comes: ``heard_key``), or delete it when it holds nothing."""
        if page.todo is None and not page.drop and not page.answers:
            del self.pages[key]
            self.store.delete_many([PROGRESS + key_bytes(key)])
        else:
            self.store.put_many([(PROGRESS + key_bytes(key), page.pack())])

    def _forget(self, key: Key, page: Pending) -> None:
        """Drop the answers and replies ``page`` holds."""
        self.store.delete_many(heard_keys(key, page))
        page.answers, page.replies = [], []

    def _lookup(self, page: Pending) -> Lookup:
        """The engine's lookup, over the buckets' values as the answers gave them."""
        assert page.todo is not None
        a = page.todo.analysed
        got = {k: v for ans in page.answers for k, v in zip(ans.keys, ans.values, strict=True)}
        sim, postings = self.index.keys(a.fps)
        if any(k not in got for k in sim + postings):
            raise ValueError(f"page {page.todo.key}: its answers miss some of its buckets")
        return self.index.found(a.fps, a.order, [got[k] for k in sim + postings])

    def _advance(self, key: Key, page: Pending, out: list[Out]) -> None:
        """Ask for the candidates' records once every answer is in."""
        todo = page.todo
        if todo is None or page.asked is not None or len(page.answers) < todo.probes:
            return
        a = todo.analysed
        # (no probes: a template-only page, neither looked up nor added, as in the engine)
        cands = page_candidates(a, self._lookup(page), self.cfg) if todo.probes else {}
        if not cands:
            self._decide(key, page, None, (), out)
            return
        by_part: dict[int, list[int]] = {}
        for pid in cands:
            by_part.setdefault(partition_of_pid(pid, self.partitions), []).append(pid)
        page.asked = len(by_part)
        self._save(key, page)
        for part, pids in sorted(by_part.items()):
            ask = SketchAsk(key, a.pid, tuple(pids))
            if part == self.partition:
                self._serve(ask, out)
            else:
                out.append(Out(PAGES, part, key[1].encode(), encode(ask)))

    # -- records and matches -----------------------------------------------------------------

    def _serve(self, ask: SketchAsk, out: list[Out]) -> None:
        """Reply to ``ask`` if every record it names is here, else once they are."""
        got = dict(zip(ask.pids, self._records(ask.pids), strict=True))
        # (a page given up may have no record: it never comes)
        wanted = [p for p, s in got.items() if s is None and p not in self.lost]
        if wanted and self._expired(ask):
            self.counts["expired_asks"] += 1
            log.warning(
                "page %s asked for %d records this task has forgotten (retention_days: it "
                "is that far behind); decided without them",
                ask.asker,
                len(wanted),
            )
        elif wanted:
            self.asks[ask.asker] = ask
            for pid in wanted:
                self.missing.setdefault(pid, set()).add(ask.asker)
            self.store.put_many([(ASK + key_bytes(ask.asker), encode(ask))])
            return
        records = tuple((pid, s.record) for pid, s in got.items() if s is not None)
        reply = SketchReply(ask.asker, ask.asker_pid, records)
        home = partition_of_pid(ask.asker_pid, self.partitions)
        if home == self.partition:
            self._on_reply(reply, None, out)
        else:
            out.append(Out(PAGES, home, ask.asker[1].encode(), encode(reply)))

    def _on_reply(self, m: SketchReply, raw: bytes | None, out: list[Out]) -> None:
        page = self.pages.get(m.asker)
        if page is None or page.todo is None or page.asked is None:
            if m.asker_pid in self.lost:  # (its page was given up)
                return
            raise WireError(f"a sketch reply for page {m.asker}, which asked for none")
        if len(page.replies) + 1 < page.asked:
            at = heard_key(m.asker, REPLY, len(page.replies))
            self.store.put_many([(at, encode(m) if raw is None else raw)])
            page.replies.append(m)
            return
        a = page.todo.analysed  # (the last reply is used at once: never written)
        records = {pid: r for reply in (*page.replies, m) for pid, r in reply.records}
        sketches = {pid: (r.shingles, r.sketch) for pid, r in records.items()}
        cands = page_candidates(a, self._lookup(page), self.cfg)
        found = page_matches(a, cands, sketches, self.cfg)
        self._forget(m.asker, page)
        if not found.verified:
            self._decide(m.asker, page, None, (), out)
            return
        matches = (edge_match(x, records[x.pid].page_id) for x in found.verified)
        page.edge = Edge(m.asker, a.pid, tuple(matches), tuple(found.covered.items()))
        page.names = {x.pid: name_of(records[x.pid]) for x in found.verified}
        self._save(m.asker, page)
        self.counts["edges"] += 1
        out.append(Out(ORDER, 0, key_bytes(m.asker), encode(page.edge)))

    def _record(self, pid: int) -> Stored | None:
        return self._records([pid])[0]

    def _records(self, pids: Iterable[int]) -> list[Stored | None]:
        raws = self.store.get_many([RECORD + p.to_bytes(8, "big") for p in pids])
        return [None if r is None else Stored.unpack(r) for r in raws]

    def _put_record(self, pid: int, s: Stored, out: list[Out]) -> None:
        """Keep ``pid``'s record; reply to the asks that waited for it alone."""
        self.store.put_many([(RECORD + pid.to_bytes(8, "big"), s.pack())])
        self._retry_asks(pid, out)

    def _retry_asks(self, pid: int, out: list[Out]) -> None:
        """Serve the asks that waited for ``pid``'s record alone."""
        for asker in sorted(self.missing.pop(pid, ())):
            ask = self.asks[asker]
            if not any(asker in self.missing.get(p, ()) for p in ask.pids):
                del self.asks[asker]
                self.store.delete_many([ASK + key_bytes(asker)])
                self._serve(ask, out)

    # -- decisions ---------------------------------------------------------------------------

    def _on_verdict(self, v: Verdict, out: list[Out]) -> None:
        page = self.pages.get(v.key)
        if page is None or page.edge is None:
            if v.pid in self.lost:  # (its page was given up)
                return
            raise WireError(f"a verdict for page {v.key}, which sent no edge")
        best = (
            next(match_of(x) for x in page.edge.matches if x.pid == v.kept[0]) if v.kept else None
        )
        self._decide(v.key, page, best, (v.root[2], *(k[2] for k in v.merged)), out)

    def _decide(
        self, key: Key, page: Pending, best: Match | None, roots: tuple[str, ...], out: list[Out]
    ) -> None:
        """Publish the page's decision and merges (``roots``: the cluster's root, then the
        roots merged into it; none for the page's own cluster); answer the repeats that
        waited for it."""
        assert page.todo is not None
        a = page.todo.analysed
        page_id = a.page.page_id
        cluster_id = roots[0] if roots else page_id
        other = page.names.get(best.pid) if best else None
        now = utc_now()
        decision = decision_message(
            a,
            best,
            duplicate_of=other.page_id if other else None,
            duplicate_of_url=other.url if other else None,
            cluster_id=cluster_id,
            engine_info=self.engine_info,
            decided_at=now,
        )
        raw = orjson.dumps(decision)
        out.append(Out(DECISIONS, None, page_id.encode(), raw))
        for root in roots[1:]:
            merge = orjson.dumps(Merge(root, cluster_id, page_id, now).to_json())
            out.append(Out(MERGES, None, root.encode(), merge))
        self.counts[decision["decision"]] += 1
        self.counts["merges"] += len(roots[1:])
        del self.pages[key]
        self.store.delete_many([TODO + key_bytes(key), PROGRESS + key_bytes(key)])
        self._forget(key, page)
        if page.drop:  # a repeat of the same key has answers still to come
            self.pages[key] = Pending(drop=page.drop)
            self._save(key, self.pages[key])
        stored = self._record(a.pid)
        assert stored is not None
        self._put_record(a.pid, Stored(stored.record, raw, stored.touched), out)
        waiting = self.repeats.pop(a.pid, [])
        at = REPEAT + a.pid.to_bytes(8, "big")
        self.store.delete_many(at + n.to_bytes(4, "big") for n in range(len(waiting)))
        for m in waiting:
            self._repeat(m, raw, out)

    # -- restore -----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the state from the store: at the start, and after an aborted step."""
        self.sources = Sources(self.partitions)
        self._last_mark = None
        self.watermark.load()
        self.load_upkeep()
        self.pages, self.repeats, self.asks, self.missing = {}, {}, {}, {}
        msgs = {
            p: [(k[1:], decode_stored(v)) for k, v in self.store.scan(p)]
            for p in (TODO, REPEAT, ASK, MARK)
        }
        todos = {key_from_bytes(k): m for k, m in msgs[TODO] if isinstance(m, ToDecide)}
        heard = load_heard(self.store.scan(HEARD))
        for k, v in self.store.scan(PROGRESS):
            key = key_from_bytes(k[1:])
            self.pages[key] = Pending.unpack(todos.pop(key, None), v, *heard.get(key, ([], [])))
        for key, todo in todos.items():
            self.pages[key] = Pending(todo)
        for _, m in msgs[REPEAT]:  # (in the order they came: the keys sort so)
            if isinstance(m, ToDecide):
                self.repeats.setdefault(m.analysed.pid, []).append(m)
        for _, ask in msgs[ASK]:
            if isinstance(ask, SketchAsk):
                self.asks[ask.asker] = ask
                for pid, s in zip(ask.pids, self._records(ask.pids), strict=True):
                    if s is None:
                        self.missing.setdefault(pid, set()).add(ask.asker)
        for _, mark in msgs[MARK]:
            if isinstance(mark, Mark):
                self.sources.on_mark(mark)
