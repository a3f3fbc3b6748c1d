"""``neardup query`` and ``neardup clusters``: what a page is a duplicate of, and every
cluster, read from a ``--state`` directory (``neardup.lookup``)."""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from neardup.cli import EXIT_OK, OutputError, _open_out, _positive_int
from neardup.store import RocksKV

if TYPE_CHECKING:
    from neardup.lookup import Cluster, Page, StateReader

#: Some page asked for is not in the state.
EXIT_NOT_FOUND = 4
#: Members of a cluster that ``query`` prints, unless ``--members`` says otherwise.
MEMBERS = 20
# What a terminal would act on rather than show: control and format characters, line and
# paragraph separators, surrogates, private and unassigned code points.
_UNSHOWN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
#: How a decision relates the page to the page it matched.
_RELATION = {
    "duplicate": "a duplicate of",
    "contained": "contained in",
    "contains": "contains",
}


def shown(text: str, width: int | None = None) -> str:
    """``text`` safe to print on a terminal (page-supplied strings are hostile: an escape
    sequence in a title must not reach it), cut to ``width`` characters."""
    out = "".join(
        c if unicodedata.category(c) not in _UNSHOWN else f"\\u{ord(c):04x}" for c in text
    )
    if width is not None and len(out) > width:
        out = out[: width - 1] + "…"
    return out


@contextmanager
def reading(path: str, cache_mb: int = RocksKV.CACHE_MB) -> Iterator[StateReader]:
    """The state at ``path`` opened read-only, and closed after; StateError says why it
    cannot be read (the command line's ``main`` reports it)."""
    from neardup.lookup import StateReader
    from neardup.store import open_to_read

    reader = StateReader(open_to_read(path, cache_mb))
    try:
        yield reader
    finally:
        reader.kv.close()


def answer(reader: StateReader, page: Page) -> dict[str, Any]:
    """The machine-readable answer for one page: its decision and its whole cluster."""
    cluster = reader.cluster(reader.root_of(page.pid))
    return {
        "found": True,
        "page": page.brief(),
        "decision": dict(page.decision),
        "cluster": cluster.to_json(),
    }


def describe(page: Page, cluster: Cluster, members: int) -> list[str]:
    """The readable answer for one page, as lines."""
    d = page.decision
    lines = [
        shown(page.url),
        f"  page id   {shown(page.page_id)}, fetched {page.fetched_at}",
        f"  title     {shown(page.title)}",
    ]
    if d.get("duplicate_of") is None:
        lines.append(f"  decision  {page.kind}: no earlier page matched")
    else:
        of = d.get("duplicate_of_url") or "(URL not in the state)"
        lines.append(f"  decision  {_RELATION.get(page.kind, page.kind)} {shown(str(of))}")
        lines.append(
            f"            page {shown(str(d['duplicate_of']))}; distance {d.get('distance')}, "
            f"similarity {d.get('similarity')}"
        )
    pages = "page" if cluster.size == 1 else "pages"
    lines.append(f"  cluster   {shown(cluster.cluster_id)}, {cluster.size} {pages}:")
    for m in cluster.members[:members]:
        mark = "*" if m.pid == page.pid else " "
        lines.append(
            f"   {mark} {m.kind:<9} {m.fetched_at}  {shown(m.url, 70)}  {shown(m.title, 40)}"
        )
    if cluster.size > members:
        lines.append(
            f"     ... and {cluster.size - members} more (--members {cluster.size} or --json "
            "lists all)"
        )
    return lines


def _say(text: str) -> None:
    """``text`` on standard output; an OSError there (a reader gone, ``| head``) becomes
    the command line's ``OutputError``."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as exc:
        raise OutputError("-", exc) from exc


def cmd_query(args: argparse.Namespace) -> int:
    missing = 0
    with reading(args.state) as reader:
        found = reader.find(args.queries)
        answered = 0
        for q in args.queries:
            page = found[q]
            if page is None:
                missing += 1
                print(
                    f"neardup: '{shown(q)}' is no page id or URL of a page in the state at "
                    f"{args.state}",
                    file=sys.stderr,
                )
                if args.json:
                    _say(json.dumps({"query": q, "found": False}, ensure_ascii=False))
                continue
            if args.json:
                _say(json.dumps({"query": q, **answer(reader, page)}, ensure_ascii=False))
            else:
                cluster = reader.cluster(reader.root_of(page.pid))
                _say(("\n" if answered else "") + "\n".join(describe(page, cluster, args.members)))
            answered += 1
    return EXIT_NOT_FOUND if missing else EXIT_OK


def cmd_clusters(args: argparse.Namespace) -> int:
    clusters = pages = 0
    with reading(args.state) as reader, _open_out(args.out) as out:
        assert out is not None  # --out is required
        for cluster in reader.clusters(args.min_size):
            out.write(cluster.to_json())
            clusters += 1
            pages += cluster.size
    if not args.quiet:
        print(
            f"neardup: {clusters} clusters of {args.min_size} or more pages, {pages} pages in them",
            file=sys.stderr,
        )
    return EXIT_OK


def add_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        required=True,
        metavar="DIR",
        help="the RocksDB state directory of earlier `neardup dedup --state DIR` runs; read "
        "only (it may be read while a run writes it: a read sees the state as it was when "
        "opened)",
    )


def add_parsers(sub: Any) -> None:
    """The ``query`` and ``clusters`` commands, on the command line's subparsers."""
    q = sub.add_parser(
        "query",
        help="what a page is a duplicate of, and its cluster",
        description="For each page, given by URL or page id: its decision, the URL it "
        "duplicates, its cluster and the cluster's members with URLs and titles.",
        epilog="Exit status: 0 every page found; 4 some page not in the state; 1 a state "
        "that cannot be read; 2 a usage error.",
    )
    q.add_argument(
        "queries",
        nargs="+",
        metavar="URL|PAGE_ID",
        help="a page's URL or page id (a page id is the message's page_id, or 16 hex "
        "digits of SHA-1 of its URL)",
    )
    add_state(q)
    q.add_argument("--json", action="store_true", help="one JSON object a page instead")
    q.add_argument(
        "--members",
        type=_positive_int,
        default=MEMBERS,
        metavar="N",
        help="members of a cluster to list (default: %(default)s; --json lists all)",
    )
    q.set_defaults(func=cmd_query)

    c = sub.add_parser(
        "clusters",
        help="write every cluster in the state with its members",
        description="Write one JSON line a cluster of the whole state (every run with this "
        "--state, not only the last): {cluster_id, size, members: [{page_id, url, title, "
        "decision, fetched_at}]}, largest first, members in fetch order.",
        epilog="Exit status: 0 written; 1 a state that cannot be read or an output error; "
        "2 a usage error.",
    )
    add_state(c)
    c.add_argument("--out", required=True, help="output JSONL ('-' for standard output, .gz)")
    c.add_argument(
        "--min-size",
        type=_positive_int,
        default=2,
        metavar="N",
        help="leave out clusters of fewer pages (default: %(default)s; 1 also lists each "
        "page that matched nothing as a cluster of one)",
    )
    c.add_argument("-q", "--quiet", action="store_true", help="no summary on standard error")
    c.set_defaults(func=cmd_clusters)
