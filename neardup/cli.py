"""The ``neardup`` command: the engine over files, with embedded RocksDB state, no Kafka."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import IO, Any

from neardup.about import VersionAction
from neardup.config import EXTRACTORS, EngineConfig
from neardup.records import Extracted, Rejected
from neardup.store import RocksKV, StateError, open_state

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3


def config_from_sets(pairs: Sequence[str], extractor: str | None = None) -> EngineConfig:
    """The engine settings with every `--set NAME=VALUE` applied at once (so that the checks
    across parameters see them together), or SystemExit with the problem."""
    cfg = EngineConfig()
    changes: dict[str, Any] = {}
    known = {f.name: f for f in fields(EngineConfig)}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in known:
            raise SystemExit(
                f"neardup: --set takes NAME=VALUE with NAME one of: {', '.join(known)}"
            )
        kind = type(getattr(cfg, name))
        try:
            changes[name] = kind(value)
        except ValueError:
            raise SystemExit(
                f"neardup: bad engine setting: {name} takes {kind.__name__}, not {value!r}"
            ) from None
    if extractor:
        changes["extractor"] = extractor
    try:
        return cfg.with_overrides(**changes)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"neardup: bad engine setting: {exc}") from exc


class OutputError(Exception):
    """An output file cannot be opened or written (a missing directory, a full disk)."""

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc}")
        self.broken_pipe = path == "-" and isinstance(exc, BrokenPipeError)


class _Out:
    """One output file of JSON lines; an OSError on it becomes an ``OutputError``."""

    def __init__(self, path: str, fh: IO[str]) -> None:
        self.path, self.fh = path, fh

    def write(self, obj: dict[str, Any]) -> None:
        try:
            self.fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise OutputError(self.path, exc) from exc


@contextlib.contextmanager
def _open_out(path: str | None) -> Iterator[_Out | None]:
    if path is None:
        yield None
        return
    if path == "-":
        yield _Out(path, sys.stdout)
        try:
            sys.stdout.flush()
        except OSError as exc:
            raise OutputError(path, exc) from exc
        return
    opener = gzip.open if path.endswith(".gz") else open
    try:
        fh = opener(path, "wt", encoding="utf-8")
    except OSError as exc:
        raise OutputError(path, exc) from exc
    try:
        yield _Out(path, fh)
    finally:
        try:
            fh.close()  # the last buffered lines are written here
        except OSError as exc:
            raise OutputError(path, exc) from exc


def _write(out: _Out | None, obj: dict[str, Any]) -> None:
    if out is not None:
        out.write(obj)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_dedup(args: argparse.Namespace) -> int:
    from neardup import progress
    from neardup.decide import Kind
    from neardup.engine import STAGES, Engine
    from neardup.progress import Bar
    from neardup.reading import Reading
    from neardup.resume import Resume
    from neardup.sources import iter_pages

    cfg = config_from_sets(args.set, args.extractor)
    kv = open_state(args.state, cfg, args.cache_mb)
    engine = Engine(kv, cfg)
    seen: dict[str, str] = {}  # page id -> URL, for --clusters
    reading = Reading()
    bar = Bar(args.pages, reading, show=not args.quiet)
    resume: Resume | None = None

    def tick() -> None:
        bar.tick(engine.stats.pages + (resume.skipped if resume else 0))

    if args.state is not None:
        resume = Resume(engine, seen, tick)
    pages = iter_pages(args.pages, cfg.max_bytes, skip=resume, reading=reading)
    t0 = time.perf_counter()
    try:
        with (
            _open_out(args.out) as out,
            _open_out(args.merges) as merges,
            _open_out(args.rejects) as rejects,
            _open_out(args.clusters) as clusters,  # opened now: a bad path fails first
        ):
            for result in engine.process_many(pages):
                if isinstance(result, Rejected):
                    _write(rejects, result.to_json())
                else:
                    _write(out, result.decision)
                    seen[result.decision["page_id"]] = result.decision["url"]
                    for merge in result.merges:
                        _write(merges, merge.to_json())
                tick()
            bar.close()
            elapsed = time.perf_counter() - t0
            if clusters is not None:
                for page_id, url in seen.items():
                    cluster = engine.cluster_of(page_id)
                    clusters.write({"page_id": page_id, "url": url, "cluster_id": cluster})
    finally:  # also on an interrupt or an output error: the state closes whole
        bar.close()
        engine.close()
    st = engine.stats
    stats = progress.dedup_stats(
        seconds=elapsed,
        decisions=st.decisions,
        kinds=[str(k) for k in Kind],
        skipped=resume.skipped if resume else 0,
        repeated=st.repeated,
        conflicts=st.conflicts,
        merges=st.merges,
        rejects=st.rejects,
        index_capped=engine.index.capped,
        template_hosts_evicted=engine.templates.hosts_evicted,
        stage_seconds={s: st.seconds[s] for s in STAGES},
    )
    _report(args, stats, progress.dedup_text(stats, args.rejects))
    return EXIT_REJECTED if stats["rejected"] else EXIT_OK


def _report(args: argparse.Namespace, stats: dict[str, Any], text: list[str]) -> None:
    from neardup import progress

    try:
        progress.report(stats, text, args.rejects, quiet=args.quiet, stats_path=args.stats)
    except OSError as exc:
        raise OutputError(args.stats, exc) from exc


def cmd_extract(args: argparse.Namespace) -> int:
    from collections import Counter

    from neardup import progress
    from neardup.engine import extract_page
    from neardup.progress import Bar
    from neardup.reading import Reading
    from neardup.sandbox import Sandbox
    from neardup.sources import iter_pages

    cfg = config_from_sets(args.set, args.extractor)
    reading = Reading()
    items = iter_pages(args.pages, cfg.max_bytes, reading=reading)
    bar = Bar(args.pages, reading, show=not args.quiet)
    rejects_by: Counter[str] = Counter()
    extracted = 0
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.callback(bar.close)
        if cfg.extract_timeout_s > 0:
            # the engine's sandbox, with its limits: a hostile page is rejected (timeout,
            # too_large) instead of stalling the run or taking it down
            results: Iterator[tuple[object, Extracted | Rejected]] = stack.enter_context(
                Sandbox(cfg)
            ).extracted(items)
        else:
            results = ((i, i if isinstance(i, Rejected) else extract_page(i, cfg)) for i in items)
        out = stack.enter_context(_open_out(args.out))
        rejects = stack.enter_context(_open_out(args.rejects))
        for _, result in results:
            if isinstance(result, Rejected):
                rejects_by[str(result.reason)] += 1
                _write(rejects, result.to_json())
            else:
                extracted += 1
                page = result.page
                head = {"page_id": page.page_id, "url": page.url, "title": result.title}
                _write(out, {**head, "text": result.text})
            bar.tick(extracted + rejects_by.total())
    elapsed = time.perf_counter() - t0
    stats = progress.extract_stats(seconds=elapsed, extracted=extracted, rejects=rejects_by)
    _report(args, stats, progress.extract_text(stats, args.rejects))
    return EXIT_REJECTED if stats["rejected"] else EXIT_OK


def _add_set(parser: argparse.ArgumentParser, example: str) -> None:
    defaults = EngineConfig()
    names = ", ".join(f"{f.name} ({getattr(defaults, f.name)})" for f in fields(EngineConfig))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"an engine parameter, repeatable, e.g. --set {example}; NAME (default) is one "
        f"of: {names}. docs/settings.md says what each does",
    )


def _add_extractor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--extractor",
        choices=sorted(EXTRACTORS),
        help=f"main-text extractor (default: {EngineConfig().extractor}; fast is another name for "
        "density; trafilatura is the slow reference). The same as --set extractor=NAME",
    )


DEDUP_STATS = (
    "command ('dedup'), pages (read), seconds, pages_per_second, decided, decisions (count "
    "by kind), skipped (decided by an earlier run with --state), repeated (ids that came "
    "again in this run), conflicts (of those, with other content), merges, rejected, "
    "rejects (count by reason), index_capped, template_hosts_evicted, stage_share"
)
EXTRACT_STATS = (
    "command ('extract'), pages, seconds, pages_per_second, extracted, rejected, rejects "
    "(count by reason)"
)


def _add_report(parser: argparse.ArgumentParser, keys: str) -> None:
    parser.add_argument(
        "--stats",
        metavar="FILE",
        help=f"also write the summary to FILE as one JSON object ('-' for standard output), "
        f"with the keys: {keys}",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar and no summary on standard error (the line saying how many "
        "pages were rejected, and hints about the input, are still printed)",
    )


def build_parser() -> argparse.ArgumentParser:
    exits = (
        "Exit status: 0 all pages decided; 3 some pages rejected (see --rejects); "
        "1 a fatal error such as state made with other parameters; 2 a usage error; "
        "130 interrupted (the lines written are whole, and --state can be continued from)."
    )
    parser = argparse.ArgumentParser(
        prog="neardup",
        description="Find near-duplicate Chinese web pages in crawled page files.",
        epilog=exits,
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pages_help = (
        "input files, in order: raw-page JSONL (plain or gzip) or WARC (plain or gzip); "
        "'-' reads JSONL from standard input. A JSONL line is one JSON object with url, "
        "fetched_at (RFC 3339), content_type (the HTTP header, '' if unknown: required with "
        "html as with body_b64), and the body as html (text) or body_b64 (bytes); page_id "
        "and site are optional"
    )
    d = sub.add_parser(
        "dedup",
        help="decide every page against all earlier pages",
        description="Decide each page (unique, duplicate, contained, contains) against every "
        "earlier page, and maintain clusters of near-duplicates.",
        epilog=exits,
    )
    d.add_argument("pages", nargs="+", metavar="PAGES", help=pages_help)
    d.add_argument(
        "--out",
        required=True,
        help="decisions, one JSON line per accepted page "
        "in input order ('-' for standard output, .gz to compress)",
    )
    d.add_argument(
        "--clusters",
        help="write the final page_id/url -> cluster_id mapping of the pages of this run's "
        "input (skipped ones included)",
    )
    d.add_argument("--merges", help="write cluster-merge events")
    d.add_argument("--rejects", help="write rejected pages with their reasons")
    d.add_argument(
        "--state",
        help="RocksDB state directory; a later run with the same directory continues "
        "against this run's pages (default: in memory). A page whose id an earlier run with "
        "this directory decided is skipped: not analysed again, nothing written to --out "
        "for it, and counted as skipped in the summary",
    )
    d.add_argument(
        "--cache-mb",
        type=_positive_int,
        default=RocksKV.CACHE_MB,
        metavar="MB",
        help="RocksDB block cache of --state, in MiB: the index blocks read most recently "
        "stay in this process's memory (default: %(default)s)",
    )
    _add_extractor(d)
    _add_set(d, "k1=3")
    _add_report(d, DEDUP_STATS)
    d.set_defaults(func=cmd_dedup)

    e = sub.add_parser(
        "extract",
        help="write the title and main text of each page",
        description="Decode and extract each page; write {page_id, url, title, text} lines. "
        "Each page is extracted in the sandbox, under the engine's time and memory limits "
        "(extract_timeout_s, extract_max_mb).",
        epilog="Exit status: 0 all pages extracted; 3 some pages rejected (see --rejects); "
        "1 a fatal error; 2 a usage error; 130 interrupted (the lines written are whole).",
    )
    e.add_argument("pages", nargs="+", metavar="PAGES", help=pages_help)
    e.add_argument("--out", required=True, help="output JSONL ('-' for standard output)")
    e.add_argument("--rejects", help="write rejected pages with their reasons")
    _add_extractor(e)
    _add_set(e, "extract_timeout_s=2")
    _add_report(e, EXTRACT_STATS)
    e.set_defaults(func=cmd_extract)

    from neardup import query, report  # here: they import this module

    query.add_parsers(sub)
    report.add_parsers(sub)
    return parser


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one file that writing would overwrite (a device such as
    /dev/null, or a pipe, is no such file)."""
    try:
        return os.path.samefile(a, b) and os.path.isfile(a)
    except OSError:  # one does not exist (yet): compare the names
        return os.path.realpath(a) == os.path.realpath(b)


def _check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors found before any output file is opened, and so emptied: a typo must
    not cost the inputs or an earlier run's results."""
    from neardup.sources import STDIN

    inputs = [p for p in getattr(args, "pages", ()) if p != STDIN]
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        parser.error(f"no such input file: {', '.join(missing)}")
    for p in inputs:
        if os.path.isdir(p):
            parser.error(f"{p} is a directory: give the page files in it, e.g. {p}/*.jsonl.gz")
    outputs = [
        p for name in ("out", "clusters", "merges", "rejects", "stats")
        if (p := getattr(args, name, None)) is not None and p != "-"
    ]  # fmt: skip
    for i, out in enumerate(outputs):
        if any(_same_file(out, p) for p in inputs):
            parser.error(f"{out} is both an input and an output")
        if any(_same_file(out, other) for other in outputs[:i]):
            parser.error(f"{out} is given for two outputs")
    if getattr(args, "stats", None) == "-" and "-" in (args.out, getattr(args, "rejects", None)):
        parser.error("--stats - and another output both on standard output would mix them")
    state = getattr(args, "state", None)
    if state is not None:
        for path in (*outputs, *inputs):
            if _within(path, state):
                parser.error(f"{path} is the --state directory {state}, or inside it")


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or a path inside it (links followed)."""
    inner, outer = os.path.realpath(path), os.path.realpath(directory)
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_paths(parser, args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except OutputError as exc:
        if exc.broken_pipe:  # the reader went away (``| head``): nothing more to say
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FATAL
        print(f"neardup: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except StateError as exc:  # a state directory that cannot be opened or read
        print(f"neardup: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except KeyboardInterrupt:
        print(
            "neardup: interrupted; the decisions, merges and rejects written are whole lines "
            "(--clusters is written only at the end), and --state is closed intact",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    return code


if __name__ == "__main__":
    sys.exit(main())
