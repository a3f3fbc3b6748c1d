"""The hosts task: a host's pages, in key order, through its template filter.

Hosts task h reads partition h of the hosts topic: the analysed pages of the hosts that
``partition_of_host`` puts there (``PageIn``), from every analyse task, with each analyse
task's marks. It holds the pages behind its watermark (``neardup.flow.watermark``) and
takes them in key order, so that each host's template counts see its pages in the order
``neardup dedup`` does. For each page:

* a page id the host has seen (``TemplateFilter.seen``) is a repeat: nothing is counted
  and nothing probed; the decide task answers it with the first decision;
* otherwise the host step (``neardup.steps.host_step``) counts it and drops its host's
  template text; then one ``Probe`` goes to each probes partition that owns some of the
  page's buckets (``KVIndex.keys``), except for a template-only page, which is neither
  looked up nor added;
* and the page goes to its decide task (``ToDecide``: what the decision reads, from which
  it takes the record later pages verify against, and how many answers to expect).

``tick``, at the end of every step the runtime commits, marks every probes and pages
partition: nothing more from this task below its frontier.

A page id first seen under another host (or past the host's window) is counted again here,
probed and added to its buckets, and decided by its decide task, which holds its record
already, with the first decision: as ``neardup dedup`` does it.

The task's state is the template filter's, bounded as ``neardup dedup`` bounds it, not by
``retention_days``: ``template_window`` pages a host (page ids seen included) and the
hosts seen within ``template_idle_days`` (``neardup.template``); and the pages behind its
watermark.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from neardup.analysis import Analysed, for_decision
from neardup.config import EngineConfig
from neardup.flow.codec import decode, encode
from neardup.flow.messages import (
    PAGES,
    PROBES,
    Mark,
    Out,
    PageIn,
    Probe,
    ToDecide,
    WireError,
    partition_of_bucket,
    partition_of_pid,
)
from neardup.flow.storeformat import decode_stored
from neardup.flow.watermark import ScanKV, Watermark
from neardup.index import KVIndex, make_entry
from neardup.steps import host_step
from neardup.store import BufferedKV
from neardup.template import TemplateFilter

#: Where the pages waiting for the watermark are kept in the task's store (the template
#: counts' keys start with a letter).
PREFIX = b"\x01h"


def bucket_keys(index: KVIndex, a: Analysed) -> list[bytes]:
    """The page's bucket and posting keys, as the engine looks them up (none repeated)."""
    sim, postings = index.keys(a.fps)
    return list(dict.fromkeys(sim + postings))


class HostsTask:
    """Partition ``partition`` of the hosts topic, with its state in ``store``."""

    def __init__(
        self,
        store: ScanKV,
        cfg: EngineConfig,
        partition: int,
        partitions: int,
        *,
        sources: int | None = None,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
        skew: float = 0.0,
    ) -> None:
        """``partitions``: of the probes and pages topics. ``sources``: the analyse tasks
        that mark this partition, one per raw partition (default: ``partitions``).
        ``wait``: ``order_wait``; ``skew``: ``raw_skew``, seconds
        (``neardup.flow.watermark``)."""
        self.cfg = cfg
        self.partition, self.partitions = partition, partitions
        self.clock = clock
        self.kv = BufferedKV(store)
        self.templates = TemplateFilter(self.kv, cfg)
        self.index = KVIndex(self.kv, cfg)  # its keys only: the buckets are elsewhere
        n_sources = partitions if sources is None else sources
        self.watermark = Watermark(store, PREFIX, n_sources, wait, clock, skew=skew)
        #: pages, repeats, template_only, template_dropped, probes, late (this process)
        self.counts: Counter[str] = Counter()
        self._last_mark: Mark | None = None
        self.load()

    def load(self) -> None:
        """Read the state from the store: at the start, and after an aborted step."""
        self.kv.rollback()
        self.watermark.load()
        self._last_mark = None

    def step(self, raw: bytes, arrived: float = -math.inf) -> list[Out]:
        """Take one record of the task's hosts partition, which reached it at ``arrived``
        (its timestamp, Unix seconds); the records to send."""
        msg = decode(raw)
        if isinstance(msg, Mark):
            self.watermark.on_mark(msg)
        elif isinstance(msg, PageIn):
            if not self.watermark.add(msg.key, raw, arrived, msg):
                self.counts["late"] += 1
        else:
            raise WireError(f"a {type(msg).__name__} does not belong on a hosts partition")
        return self.release()

    def release(self) -> list[Out]:
        """The records of every page the watermark lets go now, in key order."""
        out: list[Out] = []
        for _, msg, _ in self.watermark.release_decoded(decode_stored):
            assert isinstance(msg, PageIn)  # (only pages are held)
            self._page(msg, out)
        self.watermark.flush()  # what is still held, into the store before the commit
        return out

    def tick(self, drained: bool = False, as_of: float | None = None) -> list[Out]:
        """What the step ends with: the pages the watermark lets go now (a wait may be
        over), then this task's mark to every probes and pages partition.

        ``drained``: the task had read all of its partition at ``as_of`` (Unix seconds,
        taken before the read that showed it; None: now, on the task's clock). With
        nothing held back, the mark says so, made at that time. A mark that says nothing
        new is not sent again, but a drained one is: its time vouches for the pages that
        reached the downstream partitions before it."""
        out = self.release()
        drained_at = None
        upstream = self.watermark.drained_at()
        if drained and not len(self.watermark) and upstream is not None:
            # vouch for no more than the sources did: a page written upstream after the
            # oldest of their drained marks may still be on its way here
            drained_at = min(self.clock() if as_of is None else as_of, upstream)
        mark = Mark(self.partition, self.watermark.frontier(), drained_at)
        if mark == self._last_mark:  # the same mark again says nothing: no record, no commit
            return out
        self._last_mark = mark
        raw = encode(mark)
        for topic in (PROBES, PAGES):
            out += [Out(topic, p, b"", raw) for p in range(self.partitions)]
        return out

    def _page(self, msg: PageIn, out: list[Out]) -> None:
        a = msg.analysed
        part = partition_of_pid(a.pid, self.partitions)
        name = a.page.page_id.encode("utf-8")
        self.counts["pages"] += 1
        if self.templates.seen(a.host, a.pid, a.order):
            self.counts["repeats"] += 1
            todo = ToDecide(msg.key, for_decision(a), 0, True)
            out.append(Out(PAGES, part, name, encode(todo)))
            return
        a, dropped = host_step(a, self.templates, self.cfg)
        self.kv.commit()
        self.counts["template_dropped"] += dropped
        probes: dict[int, list[bytes]] = {}
        if a.template_only:
            self.counts["template_only"] += 1
        else:
            for k in bucket_keys(self.index, a):
                probes.setdefault(partition_of_bucket(k, self.partitions), []).append(k)
        todo = ToDecide(msg.key, for_decision(a), len(probes), False)
        out.append(Out(PAGES, part, name, encode(todo)))
        if probes:
            entry = np.asarray(make_entry(a.pid, a.fps, a.order)).tobytes()
            for b, keys in sorted(probes.items()):
                probe = Probe(msg.key, a.pid, part, tuple(keys), entry)
                out.append(Out(PROBES, b, name, encode(probe)))
            self.counts["probes"] += len(probes)
