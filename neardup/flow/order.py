"""The order task: the one step that sees pages in the global key order, over edges only.

Decide tasks send here the pages that matched earlier pages (an ``Edge``: the page's key
and its verified matches, each with the matched page's key) and their marks (``Mark``:
"no more edges below this key from me"). The task releases buffered edges with a key
below every source's frontier, in key order (``(order, page_id)``), runs the engine's
cluster step (``neardup.steps.cluster_step``: bridges, join, contained marks) on each, and
answers with a ``Verdict`` for the page's decide task. Pages without a match never come
here: they join no cluster, so the union-find knows only pages that have edges, either
as the page of an edge or as one of its matches (whose rank the edge carries).

State lives in the task's store so that a restarted task resumes where its last commit
left it: union-find nodes under ``N`` + pid, and the watermark's state (the sources'
marks, the edges held, the greatest key released) under ``E``. Nodes are cached in memory
between commits and written back by ``flush``; the cache is dropped whenever it outgrows
``cache_limit``, which bounds the task's memory whatever its store holds. The store
holds a node for each page that has had an edge or been matched; ``prune`` bounds it
under ``retention_days``. No Kafka here: the runtime feeds records in and sends the
verdicts.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from neardup.cluster import PageKey
from neardup.config import EngineConfig
from neardup.decide import Kind
from neardup.flow.codec import decode, encode
from neardup.flow.expiry import Horizon
from neardup.flow.messages import (
    Edge,
    Mark,
    Verdict,
    WireError,
    partition_of_pid,
)
from neardup.flow.storeformat import decode_stored
from neardup.flow.watermark import Store, Watermark
from neardup.steps import cluster_step

_NODE = struct.Struct(">QqqB")  # parent pid, order, latest order that touched it, flags
_CONTAINED = 1
_NODES, _EDGES = b"N", b"E"
_DAY_MS = 86_400_000
_DECIDED_CONTAINED = Kind.CONTAINED  # (``Kind.CONTAINED`` itself is a slow lookup)


class Node:
    """A page in the union-find: its parent (itself for a root), rank and contained flag."""

    __slots__ = ("contained", "order", "page_id", "parent", "seen")

    def __init__(self, parent: int, order: int, page_id: str, contained: bool, seen: int) -> None:
        self.parent, self.order, self.page_id = parent, order, page_id
        self.contained, self.seen = contained, seen

    def to_bytes(self) -> bytes:
        flags = _CONTAINED if self.contained else 0
        head = _NODE.pack(self.parent, self.order, self.seen, flags)
        return head + self.page_id.encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Node:
        parent, order, seen, flags = _NODE.unpack_from(raw)
        page_id = raw[_NODE.size :].decode("utf-8")
        return cls(parent, order, page_id, bool(flags & _CONTAINED), seen)


def _node_key(pid: int) -> bytes:
    return _NODES + pid.to_bytes(8, "big")


class OrderClusters:
    """``neardup.steps.ClusterView`` over the pages that have edges. A page never seen is
    its own root and not contained, as a page without edges is in ``neardup dedup``."""

    def __init__(self, store: Store, cache_limit: int = 1_000_000) -> None:
        self.store = store
        self.cache_limit = cache_limit
        self._nodes: dict[int, Node] = {}
        #: Pids looked up in the store and not there (cleared with the cache).
        self._absent: set[int] = set()
        self._dirty: set[int] = set()
        #: The cache holds every node of the store (a new store, never dropped since): a
        #: pid not cached is a page never seen, and is not looked up.
        self.complete = False

    def prefetch(self, pids: Iterable[int]) -> None:
        """Load the nodes of ``pids`` not cached yet, in one read."""
        if self.complete:
            return
        want = [p for p in dict.fromkeys(pids) if p not in self._nodes and p not in self._absent]
        if not want:
            return
        for pid, raw in zip(want, self.store.get_many([_node_key(p) for p in want]), strict=True):
            if raw is None:
                self._absent.add(pid)
            else:
                self._nodes[pid] = Node.from_bytes(raw)

    def node(self, pid: int) -> Node | None:
        found = self._nodes.get(pid)
        if found is None and not self.complete and pid not in self._absent:  # (rare)
            self.prefetch([pid])
            found = self._nodes.get(pid)
        return found

    def learn(self, pid: int, order: int, page_id: str, seen: int) -> None:
        """Know ``pid``'s rank (a new node is a root); ``seen``: the order of the edge that
        names it, kept for retention."""
        node = self._nodes.get(pid) or self.node(pid)
        if node is None:
            self._nodes[pid] = Node(pid, order, page_id, False, seen)
            self._absent.discard(pid)
        elif node.seen >= seen:
            return
        else:
            node.seen = seen
        self._dirty.add(pid)

    def learn_edge(self, edge: Edge) -> None:
        """``learn`` the edge's page and each page it matched, ``seen`` at its order."""
        seen, page_id = edge.key
        self.learn(edge.pid, seen, page_id, seen)
        nodes, dirty = self._nodes, self._dirty
        for m in edge.matches:  # ``learn`` again, written out: the order task's hot loop
            pid = m.pid
            node = nodes.get(pid) or self.node(pid)
            if node is None:
                nodes[pid] = Node(pid, m.order, m.page_id, False, seen)
                self._absent.discard(pid)
            elif node.seen >= seen:
                continue
            else:
                node.seen = seen
            dirty.add(pid)

    def find(self, pid: int) -> int:
        nodes = self._nodes
        node = nodes.get(pid) or self.node(pid)
        if node is None or node.parent == pid:  # (a root: most pages)
            return pid
        top = node.parent
        node = nodes.get(top) or self.node(top)
        if node is None or node.parent == top:  # (a root's child: most others)
            return top
        path: list[int] = []
        cur = pid
        while (node := nodes.get(cur) or self.node(cur)) is not None and node.parent != cur:
            path.append(cur)
            cur = node.parent
        for p in path[:-1]:  # path compression
            self._nodes[p].parent = cur
            self._dirty.add(p)
        return cur

    def key(self, pid: int) -> PageKey:
        node = self._nodes.get(pid) or self.node(pid)
        if node is None:
            raise KeyError(f"the order task has no page {pid:016x}")
        return PageKey(pid, node.order, node.page_id)

    def is_contained(self, pid: int) -> bool:
        node = self.node(pid)
        return node is not None and node.contained

    def mark_contained(self, pid: int) -> None:
        node = self.node(pid)
        if node is not None and not node.contained:
            node.contained = True
            self._dirty.add(pid)

    def join(self, me: PageKey, matched: Iterable[int]) -> tuple[PageKey, list[PageKey]]:
        """``neardup.cluster.Clusters.join`` over these nodes: the oldest root wins."""
        find = self.find
        roots = {find(m) for m in matched}
        roots.discard(me.pid)
        if not roots:
            return me, []
        if len(roots) == 1:  # (most pages: their matches are in one cluster)
            key = self.key(roots.pop())
            if _rank(key) < _rank(me):
                self._set_parent(me.pid, key.pid)
                return key, []
            self._set_parent(key.pid, me.pid)
            return me, [key]
        keys = [self.key(r) for r in roots]
        if len(keys) > 1:
            keys.sort(key=_rank)
        winner = keys[0] if _rank(keys[0]) < _rank(me) else me
        merged = [k for k in keys if k.pid != winner.pid]
        for k in merged:
            self._set_parent(k.pid, winner.pid)
        if winner.pid != me.pid:
            self._set_parent(me.pid, winner.pid)
        return winner, merged

    def _set_parent(self, pid: int, parent: int) -> None:
        node = self.node(pid)  # (join's roots and ``me`` are learned before the step)
        if node is None:
            raise KeyError(f"the order task has no page {pid:016x}")
        node.parent = parent
        self._dirty.add(pid)

    def flush(self) -> None:
        """Write the changed nodes to the store; drop the cache if it outgrew its limit."""
        if self._dirty:
            self.store.put_many((_node_key(p), self._nodes[p].to_bytes()) for p in self._dirty)
            self._dirty.clear()
        if len(self._nodes) + len(self._absent) > self.cache_limit:
            self.forget()

    def discard(self, pids: Iterable[int]) -> None:
        """Forget nodes deleted from the store (a complete cache stays complete)."""
        for pid in pids:
            self._nodes.pop(pid, None)
            self._dirty.discard(pid)

    def forget(self) -> None:
        """Drop the cache (written back first by ``flush``): nodes are read again."""
        self._nodes.clear()
        self._absent.clear()
        self.complete = False


class OrderTask:
    """Edges behind the decide tasks' marks (``neardup.flow.watermark``), released in key
    order, each page's verdict made over ``OrderClusters``. ``sources``: the number of
    decide tasks; ``wait``: the watermark's fallback (``order_wait``), in seconds."""

    def __init__(
        self,
        store: Store,
        cfg: EngineConfig,
        sources: int,
        *,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
        cache_limit: int = 1_000_000,
    ) -> None:
        self.store, self.cfg = store, cfg
        self.clusters = OrderClusters(store, cache_limit)
        # the edges held keep their decoded form (small), each decoded once; the store
        # holds their records, decoded again only after a restart
        self.edges = Watermark(store, _EDGES, sources, wait, clock, cached=cache_limit)

    def __len__(self) -> int:
        """Edges held, not released yet."""
        return len(self.edges)

    @property
    def late(self) -> int:
        """Edges released out of order (a source broke its order), in this process."""
        return self.edges.late

    def load(self) -> None:
        """Read the state from the store: at the task's start, and after an aborted step
        (the nodes are read again as they are needed)."""
        self.edges.load()
        self.clusters.forget()
        self.clusters.complete = next(iter(self.store.scan(_NODES)), None) is None

    def on_edge(self, edge: Edge, arrived: float, raw: bytes | None = None) -> None:
        """Hold an edge that reached the order topic at ``arrived`` (Unix seconds);
        ``raw``: its record, if the caller has it (kept as it is until released)."""
        self.edges.add(edge.key, encode(edge) if raw is None else raw, arrived, edge)

    def on_mark(self, mark: Mark) -> None:
        self.edges.on_mark(mark)

    def release(self) -> list[Verdict]:
        """The verdicts of every edge that may be released now, in key order (a late edge
        first, at once)."""
        out = []
        for _, edge, _ in self.edges.release_decoded(decode_stored):
            if not isinstance(edge, Edge):
                raise WireError(f"the order task holds a {type(edge).__name__}, not an edge")
            out.append(self.verdict(edge))
        return out

    def verdict(self, edge: Edge) -> Verdict:
        """The cluster step for one edge page, its predecessors' edges all applied."""
        order, page_id = edge.key
        cl = self.clusters
        if not cl.complete:
            cl.prefetch([edge.pid, *(m.pid for m in edge.matches), *(p for p, _ in edge.covered)])
        cl.learn_edge(edge)
        # the edge's matches go to the cluster step as they are: an ``EdgeMatch`` has what
        # it reads of a ``Match`` (pid, kind, share), best first as the decide task sent them
        me = PageKey(edge.pid, order, page_id)
        kept, root, merged = cluster_step(me, edge.matches, dict(edge.covered), cl, self.cfg)
        if kept and kept[0].kind == _DECIDED_CONTAINED:
            cl.mark_contained(edge.pid)  # decided contained: what ``_is_contained`` reads
        # a PageKey is the (pid, order, page_id) triple a verdict carries
        return Verdict(edge.key, edge.pid, tuple([m.pid for m in kept]), root, tuple(merged))

    def flush(self) -> None:
        """Write the nodes changed since the last flush, and the edges still held, to the
        store (before a commit)."""
        self.clusters.flush()
        self.edges.flush()

    def prune(self, newest: int) -> int:
        """Delete the nodes no edge has named for ``retention_days`` before the order
        ``newest`` and that no retained node reaches through its parents; returns how
        many. Such a page can no longer be matched (the index has dropped it), and no
        retained page's root is found through it. 0 retention days: nothing is pruned."""
        if not self.cfg.retention_days:
            return 0
        self.flush()
        cutoff = newest - self.cfg.retention_days * _DAY_MS
        old: dict[int, int] = {}  # pid -> parent, of the nodes past the cutoff
        keep_parents: set[int] = set()
        for raw_key, raw in self.store.scan(_NODES):
            pid = int.from_bytes(raw_key[1:], "big")
            node = Node.from_bytes(raw)
            if node.seen < cutoff:
                old[pid] = node.parent
            elif node.parent != pid:
                keep_parents.add(node.parent)
        reach: set[int] = set()
        while keep_parents:  # the old nodes on the retained nodes' parent chains
            pid = keep_parents.pop()
            if pid in old and pid not in reach:
                reach.add(pid)
                keep_parents.add(old[pid])
        gone = old.keys() - reach
        self.store.delete_many(_node_key(p) for p in gone)
        self.clusters.discard(gone)
        return len(gone)


def _rank(k: PageKey) -> tuple[int, str]:
    return (k.order, k.page_id)


class _Record(Protocol):
    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp(self) -> int: ...


class _Out(Protocol):
    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None: ...


class OrderStep:
    """The order task as the runtime's step (``neardup.kafka.delivery.Step``): the order
    topic's records in, each verdict out to ``pages_topic``, in its page's partition of
    ``partitions``. The runtime makes a new step after an aborted commit; the task is
    then read again from the store (``OrderTask.load``)."""

    def __init__(
        self,
        cfg: EngineConfig,
        sources: int,
        pages_topic: str,
        partitions: int,
        *,
        wait: float = math.inf,
        clock: Callable[[], float] = time.time,
        cache_limit: int = 1_000_000,
        on_bad: Callable[[_Record, WireError, _Out], None] | None = None,
    ) -> None:
        """``on_bad``: what to do with a record no version reads (None: the step fails)."""
        self.on_bad = on_bad
        self.cfg, self.sources, self.wait, self.clock = cfg, sources, wait, clock
        self.pages_topic, self.partitions, self.cache_limit = pages_topic, partitions, cache_limit
        self.task: OrderTask | None = None
        #: Verdicts sent by this step object.
        self.sent = 0
        #: The order up to which nodes were last pruned (``OrderTask.prune``).
        self.pruned = -math.inf
        #: Tells the decide tasks how far the watermark is, for their retention.
        self.horizon = Horizon(cfg.retention_days, partitions)

    def _task(self, kv: Store) -> OrderTask:
        if self.task is None or self.task.store is not kv:
            self.task = OrderTask(
                kv, self.cfg, self.sources, wait=self.wait, clock=self.clock,
                cache_limit=self.cache_limit,
            )  # fmt: skip
            self.task.load()
        return self.task

    def on_records(self, records: Sequence[_Record], kv: Store, out: _Out) -> None:
        task = self._task(kv)
        for r in records:
            if r.value is None:
                continue
            try:
                msg = decode(r.value)
                if not isinstance(msg, Edge | Mark):
                    raise WireError(f"the order topic holds a {type(msg).__name__}")
            except WireError as exc:  # a bug upstream, or a mixed deployment
                if self.on_bad is None:
                    raise
                self.on_bad(r, exc, out)
                continue
            if isinstance(msg, Edge):
                task.on_edge(msg, r.timestamp / 1000, r.value)
            else:
                task.on_mark(msg)
        self._send(task, out)

    def on_tick(self, now: float, kv: Store, out: _Out, caught_up: bool) -> None:
        self._send(self._task(kv), out)  # an edge may be released by the wait alone

    def _send(self, task: OrderTask, out: _Out) -> None:
        for v in task.release():
            part = partition_of_pid(v.pid, self.partitions)  # keyed: a lost one names its page
            out.send(self.pages_topic, part, v.key[1].encode(), encode(v))
            self.sent += 1
        for p, raw in self.horizon.marks(task.edges.w):
            out.send(self.pages_topic, p, None, raw)
        task.flush()
        released = task.edges.released
        # a scan of every node: once a day of the stream, in the step that crosses it
        if self.cfg.retention_days and released and released[0] - self.pruned >= _DAY_MS:
            task.prune(released[0])
            self.pruned = released[0]
