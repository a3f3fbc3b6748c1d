"""Reading a ``--state`` directory: pages, their decisions, and clusters with their members.

The engine keeps a record per page under ``M`` + pid (page id, URL, fetch order, and the
decision, which holds the title) and, for each page that is not its cluster's root, a
parent under ``U`` + pid (``neardup.cluster``). A union-find knows a page's root but not a
root's pages, so the members of clusters are found by one scan of the parents, resolved
in memory; only pages in clusters of two or more have parents, and only their records are
then read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from neardup.cluster import Clusters
from neardup.contract import derive_page_id
from neardup.engine import page_pid, stored_decision
from neardup.store import KV

PAGE, PARENT = b"M", b"U"
#: Records read per ``get_many`` when the members of clusters are fetched.
BATCH = 1024


class ScanKV(KV, Protocol):
    """A store that also lists its items under a prefix, in key order."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Page:
    """A decided page as the state holds it; ``decision`` in the published form."""

    pid: int
    page_id: str
    url: str
    order: int
    decision: Mapping[str, Any]

    @property
    def title(self) -> str:
        return str(self.decision.get("title") or "")

    @property
    def kind(self) -> str:
        return str(self.decision.get("decision", ""))

    @property
    def fetched_at(self) -> str:
        """The fetch time the page was ordered by, RFC 3339 in UTC."""
        when = dt.datetime.fromtimestamp(self.order / 1000, dt.UTC)
        return when.isoformat(timespec="seconds").replace("+00:00", "Z")

    def brief(self) -> dict[str, Any]:
        """What a listing of a cluster's members says of the page."""
        return {
            "page_id": self.page_id,
            "url": self.url,
            "title": self.title,
            "decision": self.kind,
            "fetched_at": self.fetched_at,
        }


@dataclass(frozen=True, slots=True)
class Cluster:
    """A cluster, named by its earliest page; members in fetch order, that page first."""

    cluster_id: str
    members: tuple[Page, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "size": self.size,
            "members": [p.brief() for p in self.members],
        }


def _pid(key: bytes) -> int:
    return int.from_bytes(key[1:9], "big")


class StateReader:
    """Answers from a state: a page by id or URL, its cluster, and every cluster."""

    def __init__(self, kv: ScanKV) -> None:
        self.kv = kv
        self._clusters = Clusters(kv)
        self._roots: dict[int, int] | None = None
        self._groups: dict[int, list[int]] | None = None

    def _page(self, pid: int, raw: bytes) -> Page:
        rec = orjson.loads(raw)
        return Page(
            pid,
            str(rec["page_id"]),
            str(rec["url"]),
            int(rec["order"]),
            stored_decision(self._clusters, rec),
        )

    def page(self, pid: int) -> Page | None:
        (raw,) = self.kv.get_many([PAGE + pid.to_bytes(8, "big")])
        return None if raw is None else self._page(pid, raw)

    def _fetched(self, groups: list[tuple[int, list[int]]]) -> Iterator[Cluster]:
        """``groups`` (root, member pids) as clusters, their records read together."""
        pages = self.pages_of(p for _, pids in groups for p in pids)
        for root, pids in groups:
            yield self._named(root, pids, pages)

    def pages_of(self, pids: Iterable[int]) -> dict[int, Page]:
        """The records of ``pids`` that exist, read in batches."""
        wanted = sorted(pids)  # in key order: neighbouring reads share blocks
        out: dict[int, Page] = {}
        for i in range(0, len(wanted), BATCH):
            chunk = wanted[i : i + BATCH]
            keys = [PAGE + p.to_bytes(8, "big") for p in chunk]
            for pid, raw in zip(chunk, self.kv.get_many(keys), strict=True):
                if raw is not None:
                    out[pid] = self._page(pid, raw)
        return out

    def pages(self) -> Iterator[Page]:
        """Every decided page, in pid order (one scan)."""
        for key, raw in self.kv.scan(PAGE):
            yield self._page(_pid(key), raw)

    def find(self, queries: Iterable[str]) -> dict[str, Page | None]:
        """Each query (a page id, or a URL) to its page, None if the state has none.

        A query is first read as a page id, then as a URL whose page id was derived from
        it (``contract.derive_page_id``); a URL still not found is looked for among every
        page's URL in one scan, for pages whose messages carried their own page id."""
        found: dict[str, Page | None] = {}
        for q in queries:
            page = self.page(page_pid(q))
            if page is None or page.page_id != q:
                page = self.page(page_pid(derive_page_id(q)))
                page = page if page is not None and page.url == q else None
            found[q] = page
        missing = {q for q, p in found.items() if p is None and "://" in q}
        if missing:
            for page in self.pages():
                if page.url in missing:
                    found[page.url] = page
                    missing.discard(page.url)
                    if not missing:
                        break
        return found

    def roots(self) -> dict[int, int]:
        """Every page that is not its cluster's root, to its root (read once)."""
        if self._roots is None:
            parent = {_pid(k): int.from_bytes(v, "big") for k, v in self.kv.scan(PARENT)}
            root: dict[int, int] = {}
            for start in parent:
                path = []
                cur = start
                while cur in parent and cur not in root:
                    path.append(cur)
                    cur = parent[cur]
                top = root.get(cur, cur)
                for p in path:
                    root[p] = top
            self._roots = root
        return self._roots

    def root_of(self, pid: int) -> int:
        return self.roots().get(pid, pid)

    def groups(self) -> dict[int, list[int]]:
        """The clusters of two or more pages: root to every member's pid, root first."""
        if self._groups is None:
            groups: dict[int, list[int]] = {}
            for pid, root in self.roots().items():
                groups.setdefault(root, [root]).append(pid)
            self._groups = groups
        return self._groups

    def cluster(self, root: int, member_pids: Iterable[int] | None = None) -> Cluster:
        """The cluster rooted at ``root`` with its members' records."""
        pids = list(member_pids) if member_pids is not None else self.groups().get(root, [root])
        return self._named(root, pids, self.pages_of(pids))

    @staticmethod
    def _named(root: int, pids: list[int], pages: Mapping[int, Page]) -> Cluster:
        members = sorted((pages[p] for p in pids if p in pages), key=lambda p: (p.order, p.page_id))
        head = pages.get(root)
        return Cluster(head.page_id if head else f"{root:016x}", tuple(members))

    def clusters(self, min_size: int = 2) -> Iterator[Cluster]:
        """Every cluster of at least ``min_size`` pages, largest first; with ``min_size``
        1, the pages that matched nothing follow as clusters of one. The members' records
        are read for about ``BATCH`` pages at a time, as the clusters are taken."""
        groups = sorted(self.groups().items(), key=lambda g: (-len(g[1]), g[0]))
        pending: list[tuple[int, list[int]]] = []
        count = 0
        for root, pids in groups:
            if len(pids) < min_size:
                break
            pending.append((root, pids))
            count += len(pids)
            if count >= BATCH:
                yield from self._fetched(pending)
                pending, count = [], 0
        yield from self._fetched(pending)
        if min_size <= 1:
            roots = self.roots()
            in_groups = {r for r, _ in groups}
            for page in self.pages():
                if page.pid not in roots and page.pid not in in_groups:
                    yield Cluster(page.page_id, (page,))
