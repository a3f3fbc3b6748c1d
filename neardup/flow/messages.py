"""The partitioned topology's messages, one a Kafka record, and where each one goes.

How a message is written as a record is in ``neardup.flow.codec``.

Keys are ``(order, page_id)``: the one order in which the stages must see the pages.

Messages are named tuples: immutable like frozen dataclasses, and made several times a
page (the order task decodes an edge and its matches for each page that has one), where
a frozen dataclass's constructor costs about ten times a named tuple's.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from neardup.analysis import Analysed

Key = tuple[int, str]  # (order, page_id)


class WireError(ValueError):
    """A record this version cannot read: a bug, or a mixed deployment."""


class Mark(NamedTuple):
    """``source`` will send no more data with a key below ``frontier`` (None: it has sent
    nothing yet); ``drained_at``: when the mark was made, if the source had read all of
    its input then (Unix seconds), else None."""

    source: int
    frontier: Key | None
    drained_at: float | None


class PageIn(NamedTuple):
    """An analysed page, analyse -> hosts."""

    key: Key
    analysed: Analysed


class Probe(NamedTuple):
    """Page ``key``'s buckets in one probes partition: answer what ``keys`` hold from
    earlier pages, then add ``entry`` (``neardup.index.make_entry``'s bytes)."""

    key: Key
    pid: int
    page_partition: int
    keys: tuple[bytes, ...]
    entry: bytes


class Answer(NamedTuple):
    """What ``keys`` held before page ``key`` (None: nothing)."""

    key: Key
    pid: int
    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]


class PageRecord(NamedTuple):
    """What later pages read of a page: to verify against it and to name it."""

    page_id: str
    url: str
    order: int
    shingles: int
    sketch: bytes


class ToDecide(NamedTuple):
    """A page for decision (``for_decision`` of the host step's page), the number of
    answers to expect, and whether its hosts task had seen it before. Its record is
    ``neardup.flow.pending.page_record`` of ``analysed``: the sketch is most of both, so
    it travels once."""

    key: Key
    analysed: Analysed
    probes: int
    repeat: bool


class SketchAsk(NamedTuple):
    """Send page ``asker`` the records of ``pids``."""

    asker: Key
    asker_pid: int
    pids: tuple[int, ...]


class SketchReply(NamedTuple):
    """Records of the pids asked for that are kept (pid, record)."""

    asker: Key
    asker_pid: int
    records: tuple[tuple[int, PageRecord], ...]


class EdgeMatch(NamedTuple):
    """A ``neardup.decide.Match``, with the matched page's page id."""

    pid: int
    order: int
    page_id: str
    kind: str
    distance: int
    similarity: float
    share: float
    by_simhash: bool


class Edge(NamedTuple):
    """Page ``key``'s verified matches, best first, and the shares it has with pages
    (``matches``' ``covered``)."""

    key: Key
    pid: int
    matches: tuple[EdgeMatch, ...]
    covered: tuple[tuple[int, float], ...]


class Verdict(NamedTuple):
    """The cluster step's answer for page ``key``: the pids of the matches kept (best
    first), the cluster's root and the roots merged into it, as (pid, order, page_id)."""

    key: Key
    pid: int
    kept: tuple[int, ...]
    root: tuple[int, int, str]
    merged: tuple[tuple[int, int, str], ...]


Msg = Mark | PageIn | Probe | Answer | ToDecide | SketchAsk | SketchReply | Edge | Verdict


# -- where messages go ------------------------------------------------------------------

#: Logical topics of the tasks' outputs (the runtime names them ``<app>-...``).
HOSTS, PROBES, PAGES, ORDER = "hosts", "probes", "pages", "order"


class Out(NamedTuple):
    """A record to send: a logical topic, its partition (None: by key), key and value."""

    topic: str
    partition: int | None
    key: bytes
    value: bytes


def partition_of_pid(pid: int, n: int) -> int:
    """The pages partition of page ``pid`` (a 64-bit hash already: spread evenly)."""
    return pid % n


def partition_of_host(host: str, n: int) -> int:
    """The hosts partition of ``host`` (a stable hash, not Python's)."""
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % n


def partition_of_bucket(key: bytes, n: int) -> int:
    """The probes partition that owns bucket ``key`` (a stable hash, not Python's)."""
    return zlib.crc32(key) % n
