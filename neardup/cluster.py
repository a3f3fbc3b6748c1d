"""Clusters: connected components of duplicate and containment edges, as a persistent
union-find over a KV. A cluster is named by its earliest page (by fetch time, then page id);
when a page joins clusters, the younger clusters are merged into the oldest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import orjson

from neardup.store import KV


class PageKey(NamedTuple):
    """A page as the clusters know it: its 64-bit id, order and page id (a named tuple:
    the order task makes one for each page and each root it reaches, and sends it as
    this triple)."""

    pid: int
    order: int
    page_id: str

    @property
    def rank(self) -> tuple[int, str]:
        return (self.order, self.page_id)


def _pid_bytes(pid: int) -> bytes:
    return pid.to_bytes(8, "big")


class Clusters:
    """Union-find with path compression; parents under ``U``, page records under ``M``."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    def page(self, pid: int) -> dict[str, object] | None:
        (raw,) = self.kv.get_many([b"M" + _pid_bytes(pid)])
        return None if raw is None else dict(orjson.loads(raw))

    def key(self, pid: int) -> PageKey:
        """The page's rank, from its record."""
        rec = self.page(pid)
        if rec is None:
            raise KeyError(f"no page record for pid {pid:016x}")
        return PageKey(pid, int(str(rec["order"])), str(rec["page_id"]))

    def find(self, pid: int) -> int:
        path = []
        cur = pid
        while True:
            (raw,) = self.kv.get_many([b"U" + _pid_bytes(cur)])
            if raw is None:
                break
            path.append(cur)
            cur = int.from_bytes(raw, "big")
        if len(path) > 1:
            root = _pid_bytes(cur)
            self.kv.put_many((b"U" + _pid_bytes(p), root) for p in path[:-1])
        return cur

    def join(self, page: PageKey, matched: Iterable[int]) -> tuple[PageKey, list[PageKey]]:
        """Add ``page`` with edges to ``matched`` pages (other pages, whose records are
        stored; ``page``'s own record is not read).

        Returns the root of the resulting cluster and the roots merged into it, oldest
        first, not counting ``page`` itself.
        """
        roots = {self.find(m) for m in matched}
        roots.discard(page.pid)
        keys = sorted((self.key(r) for r in roots), key=lambda k: k.rank)
        winner = min([page, *keys], key=lambda k: k.rank)
        merged = [k for k in keys if k.pid != winner.pid]
        link = _pid_bytes(winner.pid)
        writes = [(b"U" + _pid_bytes(k.pid), link) for k in merged]
        if winner.pid != page.pid:
            writes.append((b"U" + _pid_bytes(page.pid), link))
        self.kv.put_many(writes)
        return winner, merged

    def is_contained(self, pid: int) -> bool:
        """Whether the page was decided contained, or was found contained in a later page."""
        rec = self.page(pid) or {}
        decision = rec.get("decision")
        kind = decision.get("decision") if isinstance(decision, dict) else None
        return bool(rec.get("contained")) or kind == "contained"

    def mark_contained(self, pid: int) -> None:
        rec = self.page(pid)
        if rec is not None and not rec.get("contained"):
            rec["contained"] = True
            self.kv.put_many([(b"M" + _pid_bytes(pid), orjson.dumps(rec))])

    def cluster_of(self, pid: int) -> str:
        return self.key(self.find(pid)).page_id
