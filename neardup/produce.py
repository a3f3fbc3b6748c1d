"""Load raw-page JSONL files into the raw topic, each line sent as it is.

``python -m neardup.produce FILE... [--topic T] [--brokers B]``. Files are JSONL, plain or
gzip (told by the magic bytes); ``-`` is stdin. The worker validates every message, so a
line is never parsed into a page and re-encoded here: its bytes are the message value,
and its ``url``, when the line is a JSON object that has one, is the key. Connection and
security settings come from ``neardup.settings.Settings`` (``NEARDUP_*``); the SASL password
is read from its ``SecretStr`` only to hand it to the client, and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from neardup.contract import max_line_bytes
from neardup.kafka.security import (
    aiokafka_kwargs,
    describe,
    install_log_redaction,
    why_failed,
)
from neardup.settings import Settings, read_settings
from neardup.sources.streams import STREAM_ERRORS, UTF8_BOM, open_input

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_NOT_SENT = 0, 1, 2, 3
STDIN = "-"
_WARC_MAGIC = b"WARC/"
# Key and record headers on top of the value; a URL key is at most a few KiB.
_RECORD_SLACK = 16 * 1024
# How many sends may be in flight before their results are collected (bounds memory).
_WINDOW = 2000


class _Lines(Protocol):
    """What a plain file, a GzipFile and stdin all offer."""

    def readline(self, size: int = -1, /) -> bytes: ...


class InputError(Exception):
    """A file that cannot be used at all (missing, or WARC): a mistake in the command."""


@dataclass(frozen=True, slots=True)
class Line:
    """One non-blank input line: where it came from, its key and its bytes."""

    source: str  # "path:lineno", for messages
    key: bytes | None
    value: bytes


@dataclass(slots=True)
class Tally:
    """What happened to the lines, for the closing report and the exit status."""

    sent: int = 0
    too_large: int = 0
    failed: int = 0
    broken_files: int = 0

    def exit_code(self) -> int:
        if self.failed or self.broken_files:
            return EXIT_FATAL
        return EXIT_NOT_SENT if self.too_large else EXIT_OK


def message_key(value: bytes) -> bytes | None:
    """The line's ``url`` as UTF-8 if the line is a JSON object with a non-empty string url."""
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None
    url = obj.get("url") if isinstance(obj, dict) else None
    if not isinstance(url, str) or not url:
        return None
    try:
        return url.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return None


def check_inputs(paths: Sequence[str]) -> None:
    """Raise ``InputError`` before anything is sent if a path is missing or is a WARC."""
    missing = [p for p in paths if p != STDIN and not os.path.exists(p)]
    if missing:
        raise InputError(f"no such input file: {', '.join(missing)}")
    for path in paths:
        if path != STDIN and _is_warc(path):
            raise InputError(
                f"{path} is a WARC file; this producer sends raw-page JSONL lines unchanged "
                "(see schemas/raw-page.schema.json)"
            )


def _is_warc(path: str) -> bool:
    """Whether a regular file is a WARC (plain or gzip). A pipe is not looked at here: its
    bytes come once, and are told when it is read (``iter_lines``)."""
    if not os.path.isfile(path):
        return False
    try:
        stream, head = open_input(path)
    except STREAM_ERRORS:
        return False  # reported, with its line number, when the file is read
    with stream:
        return head.startswith(_WARC_MAGIC)


def iter_lines(
    paths: Sequence[str],
    max_value_bytes: int,
    on_too_large: Callable[[str], None],
    on_broken: Callable[[str], None],
) -> Iterator[Line]:
    """Every non-blank line of every file, in order, without its line terminator.

    A line longer than ``max_value_bytes`` is read past, never held whole, and reported to
    ``on_too_large``; a gzip stream that breaks is reported to ``on_broken`` and the rest of
    that file is skipped.
    """
    for path in paths:
        if path == STDIN:
            yield from _stream_lines(
                sys.stdin.buffer, "<stdin>", max_value_bytes, on_too_large, on_broken
            )
            continue
        try:  # one open: a pipe or a FIFO gives its bytes once
            stream, head = open_input(path)
        except STREAM_ERRORS as exc:
            on_broken(f"{path}: cannot read: {type(exc).__name__}: {exc}")
            continue
        with stream:
            if head.startswith(_WARC_MAGIC):  # a pipe, which check_inputs does not read
                on_broken(f"{path} is a WARC file; this producer sends raw-page JSONL lines")
                continue
            yield from _stream_lines(stream, path, max_value_bytes, on_too_large, on_broken)


def _stream_lines(
    stream: _Lines,
    name: str,
    limit: int,
    on_too_large: Callable[[str], None],
    on_broken: Callable[[str], None],
) -> Iterator[Line]:
    lineno = 0
    while True:
        lineno += 1
        try:
            raw = stream.readline(limit + 2)  # room for "\r\n" after a line of exactly limit
            value = raw.removesuffix(b"\n").removesuffix(b"\r")
            if len(value) > limit:
                if not raw.endswith(b"\n"):
                    _skip_rest_of_line(stream, limit)
                on_too_large(f"{name}:{lineno}")
                continue
        except STREAM_ERRORS as exc:
            on_broken(
                f"{name}:{lineno}: stream broken, rest of file skipped: {type(exc).__name__}: {exc}"
            )
            return
        if not raw:
            return
        if lineno == 1:  # as the worker's reader does (RFC 8259 lets a parser ignore it)
            value = value.removeprefix(UTF8_BOM)
        if value.strip():
            yield Line(f"{name}:{lineno}", message_key(value), value)


def _skip_rest_of_line(stream: _Lines, chunk: int) -> None:
    while True:
        piece = stream.readline(chunk)
        if not piece or piece.endswith(b"\n"):
            return


def producer_kwargs(settings: Settings, *, max_request_size: int) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer``: idempotent, acks=all, security from
    ``settings`` as every client of the worker has it. The result holds the SASL password
    in clear: never log it."""
    return {
        "bootstrap_servers": settings.brokers,
        "client_id": f"{settings.app_id}-producer",
        "acks": "all",
        "enable_idempotence": True,
        "max_request_size": max_request_size,
        "linger_ms": 5,
        **aiokafka_kwargs(settings),
    }


async def produce(
    lines: Iterator[Line],
    topic: str,
    kwargs: dict[str, Any],
    tally: Tally,
    factory: Callable[..., Any] | None = None,
) -> None:
    """Send every line to ``topic``, waiting for every acknowledgement before returning."""
    producer = (factory or AIOKafkaProducer)(**kwargs)
    try:
        await producer.start()  # inside: a producer that failed to start is closed too
        pending: list[tuple[str, asyncio.Future[Any]]] = []
        for line in lines:
            pending.append((line.source, await producer.send(topic, line.value, key=line.key)))
            if len(pending) >= _WINDOW:
                await _collect(pending, tally)
        await producer.flush()
        await _collect(pending, tally)
    finally:
        await producer.stop()


async def _collect(pending: list[tuple[str, asyncio.Future[Any]]], tally: Tally) -> None:
    results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
    for (source, _), result in zip(pending, results, strict=True):
        if isinstance(result, BaseException):
            tally.failed += 1
            _warn(f"{source}: not delivered: {type(result).__name__}: {result}")
        else:
            tally.sent += 1
    pending.clear()


def _warn(message: str) -> None:
    print(f"neardup-produce: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m neardup.produce",
        description="Send raw-page JSONL lines (plain or gzip), unchanged, to the raw topic.",
        epilog="Connection and security come from NEARDUP_* (neardup/settings.py). Exit status: "
        "0 all sent, 1 delivery or read failure, 2 usage, 3 some lines too large to send.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="JSONL file, .gz or plain; - is stdin")
    p.add_argument("--topic", help="topic to send to (default: NEARDUP_TOPIC_RAW)")
    p.add_argument("--brokers", help="host:port[,host:port] (default: NEARDUP_BROKERS)")
    p.add_argument(
        "--max-message-bytes",
        type=int,
        help="longest line sent; longer ones are skipped and reported (default: the longest "
        "line the worker parses for NEARDUP_ENGINE__MAX_BYTES). The broker's "
        "message.max.bytes must be at least this.",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {"brokers": args.brokers} if args.brokers else {}
    settings = read_settings("neardup-produce", **overrides)
    if settings is None:
        return EXIT_USAGE
    install_log_redaction(settings)
    topic = args.topic or settings.topic_raw
    limit = args.max_message_bytes or max_line_bytes(settings.engine.max_bytes)
    try:
        check_inputs(args.files)
        kwargs = producer_kwargs(settings, max_request_size=limit + _RECORD_SLACK)
    except (InputError, ValueError) as exc:
        _warn(str(exc))
        return EXIT_USAGE

    tally = Tally()

    def too_large(source: str) -> None:
        tally.too_large += 1
        _warn(f"{source}: line over {limit} bytes, not sent")

    def broken(detail: str) -> None:
        tally.broken_files += 1
        _warn(detail)

    lines = iter_lines(args.files, limit, too_large, broken)
    try:
        asyncio.run(produce(lines, topic, kwargs, tally))
    except Exception as exc:  # connection or authentication failure: say it once, plainly
        _warn(
            f"cannot produce to NEARDUP_BROKERS={describe(settings)}: {why_failed(settings, exc)}"
        )
        tally.failed += 1
    print(
        f"sent {tally.sent} messages to {topic} at {settings.brokers}"
        f" ({tally.too_large} too large, {tally.failed} failed, "
        f"{tally.broken_files} broken files)"
    )
    return tally.exit_code()


if __name__ == "__main__":
    sys.exit(main())
