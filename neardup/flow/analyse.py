"""The analyse task's stage: raw-topic message values to analysed pages or rejections.

Pure: the runtime (``neardup.kafka.tasks``) hands it a batch of a raw partition's values
and sends what comes out on, the analysed pages to their hosts partitions and the
rejections to the dead-letter topic."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

from neardup.analysis import Analysed, Stats, analyse, internal_rejection
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.records import RawMessage, RawPage, Reason, Rejected


def analyse_messages(
    raws: Iterable[bytes | None], cfg: EngineConfig, stats: Stats, sandbox: Any = None
) -> Generator[Analysed | Rejected, None, None]:
    """Raw-topic message values to analysed pages or rejections, in order; never raises
    for a message.

    ``sandbox`` is an ``Engine``'s sandbox (``neardup.sandbox``): the engine's ``analyse``
    bounded in time and memory, its child analysing the next pages while the caller
    handles one (``Sandbox.stream``, as ``Engine.process_many``; ``raws`` is read a few
    messages ahead). None runs ``analyse`` here."""
    if sandbox is None:
        pages = (_parse_message(raw, cfg) for raw in raws)
        stream = ((page, _analyse_here(page, cfg, stats)) for page in pages)
    else:  # its worker parses the messages too: this process never holds a body as text
        stream = sandbox.stream(map(_unparsed, raws), stats)
    try:
        for _, out in stream:
            stats.pages += 1
            if isinstance(out, Rejected):
                stats.rejects[str(out.reason)] += 1
            yield out
    finally:
        stream.close()  # left early: the sandbox's child drops the pages written ahead


def _parse_message(raw: bytes | None, cfg: EngineConfig) -> RawPage | Rejected:
    if raw is None:
        return _no_value()
    return parse_raw(raw, cfg.max_bytes)


def _unparsed(raw: bytes | None) -> RawMessage | Rejected:
    return _no_value() if raw is None else RawMessage(raw)


def _no_value() -> Rejected:
    return Rejected(Reason.BAD_JSON, "message has no value")


def _analyse_here(page: RawPage | Rejected, cfg: EngineConfig, stats: Stats) -> Analysed | Rejected:
    if isinstance(page, Rejected):
        return page
    try:
        return analyse(page, cfg, stats)
    except Exception as exc:  # a bug, not bad input: the page is dead-lettered
        return internal_rejection(page, exc)
