"""Learned template filter: period strings frequent among a host's earlier pages are template.

Counts are kept per host in two generations of ``template_window`` pages each; when a
third generation starts the oldest is deleted, so the state per host is bounded by about
2 * template_window * (strings per page) small keys, and nothing is held in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from worker.config import EngineConfig
from worker.fingerprint import hash64
from worker.store import KV

_COUNT = struct.Struct("<I")
_PAGES = struct.Struct("<Q")


class TemplateFilter:
    def __init__(self, kv: KV, cfg: EngineConfig) -> None:
        self.kv = kv
        self.cfg = cfg

    @staticmethod
    def _host_key(host: str) -> bytes:
        return hash64(host).to_bytes(8, "big")

    def filter(
        self, host: str, strings: Sequence[int], also: Sequence[int] = ()
    ) -> tuple[set[int], int]:
        """Which of ``strings`` are template text for ``host``; then count this page in,
        with ``also`` (strings the page carries outside its main text).

        Returns the template strings and how many pages of the host were seen before.
        """
        hk = self._host_key(host)
        (raw_pages,) = self.kv.get_many([b"H" + hk])
        seen = _PAGES.unpack(raw_pages)[0] if raw_pages else 0
        window = self.cfg.template_window
        gen = seen // window
        distinct = sorted(set(strings).union(also))
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
        mine = set(strings)
        template = {s for s, c in zip(distinct, counts, strict=True) if c >= need and s in mine}

        cur_counts = [_COUNT.unpack(v)[0] if v else 0 for v in values[: len(cur)]]
        writes = [(k, _COUNT.pack(c + 1)) for k, c in zip(cur, cur_counts, strict=True)]
        writes.append((b"H" + hk, _PAGES.pack(seen + 1)))
        self.kv.put_many(writes)
        if (seen + 1) % window == 0 and gen >= 1:
            # generation gen + 1 starts with the next page; gen - 1 leaves the window
            self.kv.delete_prefix(b"T" + hk + (gen - 1).to_bytes(4, "big"))
        return template, seen
