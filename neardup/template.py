"""Learned template filter: period strings frequent among a host's earlier pages are template.

Counts are kept per host in two generations of ``template_window`` pages each; when a
third generation starts the oldest is deleted, so the state per host is bounded by about
2 * template_window * (strings per page) small keys, and nothing is held in memory.

A host whose previous page is more than ``template_idle_days`` older (in fetch time) than
its next one starts afresh: its counts are dropped. The rule reads the host's own pages
only, never other hosts', so a worker that holds some hosts decides what one that holds
all of them decides. The counts of hosts idle that long are deleted by ``sweep``, driven by
the pages' fetch days: that bounds the number of hosts kept, and changes no decision,
since such a host would start afresh anyway.

A page's id is remembered with the host's counts: a page id the host's window has seen is
a repeat there (``seen``), counted once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from neardup.config import EngineConfig
from neardup.simhash import hash64
from neardup.store import BufferedKV

_COUNT = struct.Struct("<I")
#: A host's pages seen and the fetch day of its latest page.
_HOST = struct.Struct("<QI")
#: Hosts by the fetch day of their latest page: ``_DAY`` + day -> host keys (8 bytes each),
#: appended to; a host moved to a later day stays listed under the earlier one too, and
#: ``sweep`` checks its record.
_DAY = b"D"
#: The next day ``sweep`` will look at.
_NEXT_SWEEP = b"N"
_DAY_MS = 86_400_000
#: Marks a page id among a generation's counts (period strings and blocks are 8 bytes).
_PAGE_TAG = b"p"


def fetch_day(order: int) -> int:
    """The day (since the epoch, UTC) of a page's fetch time in milliseconds."""
    return max(0, order // _DAY_MS)


class TemplateFilter:
    def __init__(self, kv: BufferedKV, cfg: EngineConfig) -> None:
        self.kv = kv
        self.cfg = cfg
        #: Hosts whose counts were dropped for idleness, in this process (steps committed).
        self.hosts_evicted = 0

    @staticmethod
    def _host_key(host: str) -> bytes:
        return hash64(host).to_bytes(8, "big")

    def _generations(self, hk: bytes) -> tuple[int, int]:
        """The host's pages seen (0 after an idle reset is due is not applied here) and
        its latest fetch day."""
        (raw,) = self.kv.get_many([b"H" + hk])
        if not raw:
            return 0, -1
        seen, day = _HOST.unpack(raw)
        return seen, day

    def seen(self, host: str, pid: int, order: int) -> bool:
        """Whether the host's counts have seen page ``pid`` (in the current or previous
        generation, and the host not idle since)."""
        hk = self._host_key(host)
        seen, day = self._generations(hk)
        if seen == 0 or fetch_day(order) - day > self.cfg.template_idle_days:
            return False
        gen = seen // self.cfg.template_window
        tag = _PAGE_TAG + pid.to_bytes(8, "big")
        keys = [b"T" + hk + g.to_bytes(4, "big") + tag for g in (gen, gen - 1) if g >= 0]
        return any(v is not None for v in self.kv.get_many(keys))

    def filter(
        self,
        host: str,
        strings: Sequence[int],
        also: Sequence[int] = (),
        blocks: Sequence[int] = (),
        also_blocks: Sequence[int] = (),
        *,
        pid: int | None = None,
        order: int = 0,
    ) -> tuple[set[int], int]:
        """Which of ``strings`` and ``blocks`` are template text for ``host``; then count
        this page in, with ``also`` and ``also_blocks`` (what the page carries outside its
        main text), and remember ``pid`` (``seen``).

        ``strings`` are period strings, template when on ``template_min_df`` earlier pages;
        ``blocks`` are whole lines (``neardup.engine.block_key``), template from
        ``template_block_min_df`` and ``template_block_frac`` of the host's pages: a line
        of twenty characters or more repeated word for word on most of a host's pages is
        its template, and must be known before the eighth page, because until then it
        merges every page that carries it. ``order`` is the page's fetch time (ms): a host
        idle for more than ``template_idle_days`` before it starts afresh. Returns the
        template strings and blocks and how many pages of the host were seen before.
        """
        hk = self._host_key(host)
        seen, last_day = self._generations(hk)
        day = fetch_day(order)
        if seen and day - last_day > self.cfg.template_idle_days:
            self.kv.delete_prefix(b"T" + hk)
            seen = 0
        window = self.cfg.template_window
        gen = seen // window
        distinct = sorted(set(strings).union(also, blocks, also_blocks))
        cur = [b"T" + hk + gen.to_bytes(4, "big") + s.to_bytes(8, "big") for s in distinct]
        prev = (
            [b"T" + hk + (gen - 1).to_bytes(4, "big") + s.to_bytes(8, "big") for s in distinct]
            if gen
            else []
        )
        values = self.kv.get_many(cur + prev) if seen else [None] * (len(cur) + len(prev))
        counts = [_COUNT.unpack(v)[0] if v else 0 for v in values[: len(cur)]]
        if prev:
            for i, v in enumerate(values[len(cur) :]):
                if v:
                    counts[i] += _COUNT.unpack(v)[0]
        in_window = seen if gen == 0 else window + seen % window
        need = max(self.cfg.template_min_df, self.cfg.template_frac * in_window)
        need_block = max(self.cfg.template_block_min_df, self.cfg.template_block_frac * in_window)
        mine, my_blocks = set(strings), set(blocks)
        template = {
            s
            for s, c in zip(distinct, counts, strict=True)
            if (c >= need and s in mine) or (c >= need_block and s in my_blocks)
        }

        cur_counts = [_COUNT.unpack(v)[0] if v else 0 for v in values[: len(cur)]]
        writes = [(k, _COUNT.pack(c + 1)) for k, c in zip(cur, cur_counts, strict=True)]
        if pid is not None:
            writes.append(
                (b"T" + hk + gen.to_bytes(4, "big") + _PAGE_TAG + pid.to_bytes(8, "big"), b"")
            )
        writes.append((b"H" + hk, _HOST.pack(seen + 1, max(day, last_day))))
        if day > last_day:
            self._list_on_day(hk, day)
        self.kv.put_many(writes)
        if (seen + 1) % window == 0 and gen >= 1:
            # generation gen + 1 starts with the next page; gen - 1 leaves the window
            self.kv.delete_prefix(b"T" + hk + (gen - 1).to_bytes(4, "big"))
        self.sweep(day)
        return template, seen

    def _list_on_day(self, hk: bytes, day: int) -> None:
        key = _DAY + day.to_bytes(4, "big")
        (raw,) = self.kv.get_many([key])
        self.kv.put_many([(key, (raw or b"") + hk)])

    def sweep(self, day: int) -> None:
        """Drop the counts of hosts whose latest page is more than ``template_idle_days``
        before ``day``: one listed day at a time, each day once."""
        (raw,) = self.kv.get_many([_NEXT_SWEEP])
        start = int.from_bytes(raw, "big") if raw else None
        last = day - self.cfg.template_idle_days - 1
        if start is None:
            # the first page: nothing older is listed
            self.kv.put_many([(_NEXT_SWEEP, max(0, last + 1).to_bytes(4, "big"))])
            return
        if start > last:
            return
        dropped = 0
        for d in range(start, last + 1):
            key = _DAY + d.to_bytes(4, "big")
            (listed,) = self.kv.get_many([key])
            for i in range(0, len(listed or b""), 8):
                hk = (listed or b"")[i : i + 8]
                _, host_day = self._generations(hk)
                if 0 <= host_day <= last:
                    self.kv.delete_prefix(b"T" + hk)
                    self.kv.delete_many([b"H" + hk])
                    dropped += 1
            if listed is not None:
                self.kv.delete_many([key])
        self.kv.put_many([(_NEXT_SWEEP, (last + 1).to_bytes(4, "big"))])
        if dropped:
            self.kv.on_commit(lambda: self._count_dropped(dropped))

    def _count_dropped(self, n: int) -> None:
        self.hosts_evicted += n
