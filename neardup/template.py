"""Learned template filter: period strings frequent among a host's earlier pages are template.

Counts are kept per host in two generations of ``template_window`` pages each; when a
third generation starts the oldest is deleted, so the state per host is bounded by about
2 * template_window * (strings per page) small keys, and nothing is held in memory.

The number of hosts is bounded too, by ``template_hosts``. Hosts enter a queue when they
are first seen, and again when their place in it is more than half the queue old; each
page pops at most two places off the front once the queue is longer than
``template_hosts``, and a host whose latest place is popped loses its counts. A host seen
at least once every ``template_hosts // 2`` queue entries (at most one a page) keeps them.
Everything is driven by the pages in the order they are decided, never by the clock, so
every worker that replays the same pages keeps the same hosts.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from neardup.config import EngineConfig
from neardup.fingerprint import hash64
from neardup.store import BufferedKV

_COUNT = struct.Struct("<I")
#: A host's pages seen, then its latest place in the host queue. State written before the
#: queue existed holds the pages alone, and such a host enters the queue when next seen.
_HOST = struct.Struct("<QQ")
_PAGES = struct.Struct("<Q")
#: The host queue's front and end: places [front, end) are in the queue. Written when
#: either moves: a page of a host new to the queue, or one that pops places.
_QUEUE_ENDS = b"F"
_ENDS = struct.Struct("<QQ")
_QUEUE = b"Q"  # + place (8 bytes, big-endian) -> host key
_POPS_A_PAGE = 2


def _host_record(raw: bytes | None) -> tuple[int, int | None]:
    """Pages seen and the host's place in the queue (None: not in it)."""
    if not raw:
        return 0, None
    if len(raw) == _PAGES.size:
        return _PAGES.unpack(raw)[0], None
    seen, place = _HOST.unpack(raw)
    return seen, place


class TemplateFilter:
    def __init__(self, kv: BufferedKV, cfg: EngineConfig) -> None:
        self.kv = kv
        self.cfg = cfg
        #: Hosts whose counts the host bound dropped, in this process (steps committed).
        self.hosts_evicted = 0

    @staticmethod
    def _host_key(host: str) -> bytes:
        return hash64(host).to_bytes(8, "big")

    def filter(
        self,
        host: str,
        strings: Sequence[int],
        also: Sequence[int] = (),
        blocks: Sequence[int] = (),
        also_blocks: Sequence[int] = (),
    ) -> tuple[set[int], int]:
        """Which of ``strings`` and ``blocks`` are template text for ``host``; then count
        this page in, with ``also`` and ``also_blocks`` (what the page carries outside its
        main text).

        ``strings`` are period strings, template when on ``template_min_df`` earlier pages;
        ``blocks`` are whole lines (``neardup.engine.block_key``), template from
        ``template_block_min_df`` and ``template_block_frac`` of the host's pages: a line
        of twenty characters or more repeated word for word on most of a host's pages is
        its template, and must be known before the eighth page, because until then it
        merges every page that carries it. Returns the template strings and blocks and how
        many pages of the host were seen before.
        """
        hk = self._host_key(host)
        raw_host, raw_ends = self.kv.get_many([b"H" + hk, _QUEUE_ENDS])
        seen, place = _host_record(raw_host)
        window = self.cfg.template_window
        gen = seen // window
        distinct = sorted(set(strings).union(also, blocks, also_blocks))
        cur = [b"T" + hk + gen.to_bytes(4, "big") + s.to_bytes(8, "big") for s in distinct]
        prev = (
            [b"T" + hk + (gen - 1).to_bytes(4, "big") + s.to_bytes(8, "big") for s in distinct]
            if gen
            else []
        )
        values = self.kv.get_many(cur + prev)
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
        ends = front, end = _ENDS.unpack(raw_ends) if raw_ends else (0, 0)
        if place is None or place < end - self.cfg.template_hosts // 2:
            writes.append((_QUEUE + end.to_bytes(8, "big"), hk))
            place, end = end, end + 1
        writes.append((b"H" + hk, _HOST.pack(seen + 1, place)))
        self.kv.put_many(writes)
        if (seen + 1) % window == 0 and gen >= 1:
            # generation gen + 1 starts with the next page; gen - 1 leaves the window
            self.kv.delete_prefix(b"T" + hk + (gen - 1).to_bytes(4, "big"))
        front = self._pop(front, end)
        if (front, end) != ends:
            self.kv.put_many([(_QUEUE_ENDS, _ENDS.pack(front, end))])
        return template, seen

    def _pop(self, front: int, end: int) -> int:
        """Pops up to ``_POPS_A_PAGE`` places off the front of a queue longer than
        ``template_hosts``, dropping the counts of a host whose latest place is popped
        (never the page's own host: its place is at least ``end - template_hosts // 2``).
        Returns the new front."""
        dropped = 0
        for _ in range(_POPS_A_PAGE):
            if end - front <= self.cfg.template_hosts:
                break
            key = _QUEUE + front.to_bytes(8, "big")
            (hk,) = self.kv.get_many([key])
            if hk is not None:
                (raw_host,) = self.kv.get_many([b"H" + hk])
                if _host_record(raw_host)[1] == front:
                    self.kv.delete_prefix(b"T" + hk)
                    self.kv.delete_many([b"H" + hk])
                    dropped += 1
            self.kv.delete_many([key])
            front += 1
        if dropped:
            self.kv.on_commit(lambda: self._count_dropped(dropped))
        return front

    def _count_dropped(self, n: int) -> None:
        self.hosts_evicted += n
