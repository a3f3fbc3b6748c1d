"""``neardup report``: what a ``--state`` directory holds, as one self-contained HTML page.

``summarise`` reads the state (one scan of the pages, one of the cluster parents) into a
``Summary``; ``neardup.report_html`` renders it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from neardup.cli import EXIT_OK, OutputError, _positive_int

if TYPE_CHECKING:
    from neardup.lookup import Cluster, StateReader

#: The decision kinds, in the order the report shows them.
KINDS = ("unique", "duplicate", "contained", "contains")
#: Cluster sizes as the chart groups them: (smallest, largest or None for no bound, label).
SIZE_BINS: tuple[tuple[int, int | None, str], ...] = (
    (1, 1, "1"),
    (2, 2, "2"),
    (3, 3, "3"),
    (4, 4, "4"),
    (5, 5, "5"),
    (6, 10, "6–10"),
    (11, 20, "11–20"),
    (21, 50, "21–50"),
    (51, 100, "51–100"),
    (101, None, "101+"),
)
HOSTS, LARGEST = 25, 10


def host_of(url: str) -> str:
    """The host a URL names, lower case, without ``www.``; ``(no host)`` when it has none."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:  # a broken IPv6 literal, say
        host = ""
    return host.removeprefix("www.") or "(no host)"


@dataclass
class HostRow:
    """One host's pages by decision kind."""

    host: str
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def pages(self) -> int:
        return sum(self.kinds.values())


@dataclass
class Summary:
    """What the report shows, read from one state."""

    state: str
    pages: int
    kinds: Counter[str]
    #: The hosts with most pages, most first; the rest summed in ``other_hosts``.
    hosts: list[HostRow]
    other_hosts: HostRow
    #: Hosts in all (listed or not).
    host_count: int
    #: Cluster size to the number of clusters of that size (pages that matched nothing
    #: are clusters of 1).
    sizes: Counter[int]
    largest: list[Cluster]
    #: The engine parameters and versions that decided the pages, with their page counts.
    engines: Counter[str]

    @property
    def clusters(self) -> int:
        return sum(self.sizes.values())

    def binned_sizes(self) -> list[tuple[str, int, int]]:
        """(label, clusters, pages in them) for each bin of ``SIZE_BINS`` up to the last
        one with any cluster."""
        rows = []
        for low, high, label in SIZE_BINS:
            inside = [
                (s, n) for s, n in self.sizes.items() if low <= s and (high is None or s <= high)
            ]
            rows.append((label, sum(n for _, n in inside), sum(s * n for s, n in inside)))
        while rows and rows[-1][1] == 0:
            rows.pop()
        return rows


def summarise(reader: StateReader, hosts: int = HOSTS, largest: int = LARGEST) -> Summary:
    """The summary of the state behind ``reader``."""
    kinds: Counter[str] = Counter()
    by_host: dict[str, HostRow] = {}
    engines: Counter[str] = Counter()
    pages = 0
    for page in reader.pages():
        pages += 1
        kinds[page.kind] += 1
        host = host_of(page.url)
        row = by_host.get(host)
        if row is None:
            row = by_host[host] = HostRow(host)
        row.kinds[page.kind] += 1
        engine = page.decision.get("engine")
        if isinstance(engine, dict):
            engines[f"{engine.get('version')} {engine.get('params')}"] += 1
    groups = reader.groups()
    sizes = Counter(len(pids) for pids in groups.values())
    in_groups = sum(s * n for s, n in sizes.items())
    if pages > in_groups:
        sizes[1] = pages - in_groups
    ranked = sorted(by_host.values(), key=lambda r: (-r.pages, r.host))
    other = HostRow(f"{max(len(ranked) - hosts, 0)} other hosts")
    for row in ranked[hosts:]:
        other.kinds.update(row.kinds)
    top = sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))[:largest]
    return Summary(
        state=reader_path(reader),
        pages=pages,
        kinds=kinds,
        hosts=ranked[:hosts],
        other_hosts=other,
        host_count=len(ranked),
        sizes=sizes,
        largest=[reader.cluster(root, pids) for root, pids in top],
        engines=engines,
    )


def reader_path(reader: StateReader) -> str:
    return str(getattr(reader.kv, "path", "memory"))


def write_atomically(path: str, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a reader never sees half a report)."""
    if path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:
            raise OutputError(path, exc) from exc
        return
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=folder)
    except OSError as exc:
        raise OutputError(path, exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise OutputError(path, exc) from exc


def cmd_report(args: argparse.Namespace) -> int:
    from neardup.query import reading
    from neardup.report_html import render

    with reading(args.state) as reader:
        summary = summarise(reader, args.hosts, args.largest)
    write_atomically(args.out, render(summary, members=args.members))
    if not args.quiet:
        print(
            f"neardup: report of {summary.pages} pages, {summary.clusters} clusters, "
            f"{summary.host_count} hosts written to {args.out}",
            file=sys.stderr,
        )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``report`` command, on the command line's subparsers."""
    from neardup.query import add_state

    r = sub.add_parser(
        "report",
        help="write an HTML report of the state: decisions, hosts, clusters",
        description="Write one self-contained HTML file (no scripts, nothing fetched): the "
        "decisions by kind and by host, the cluster-size distribution as a chart, and the "
        "largest clusters with their members' titles and URLs.",
        epilog="Exit status: 0 written; 1 a state that cannot be read or an output error; "
        "2 a usage error.",
    )
    add_state(r)
    r.add_argument("--out", required=True, metavar="FILE.html", help="the report ('-': stdout)")
    r.add_argument(
        "--hosts",
        type=_positive_int,
        default=HOSTS,
        metavar="N",
        help="hosts listed, most pages first; the rest are summed (default: %(default)s)",
    )
    r.add_argument(
        "--largest",
        type=_positive_int,
        default=LARGEST,
        metavar="N",
        help="largest clusters shown with their members (default: %(default)s)",
    )
    r.add_argument(
        "--members",
        type=_positive_int,
        default=12,
        metavar="N",
        help="members listed for each of those clusters (default: %(default)s)",
    )
    r.add_argument("-q", "--quiet", action="store_true", help="no summary on standard error")
    r.set_defaults(func=cmd_report)
