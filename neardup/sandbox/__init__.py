"""Bounded analysis: ``analyse`` (or, for ``neardup extract``, only ``extract_page``) in a
child process, with a time and a memory limit.

One hostile page (an attribute flood that lexbor parses in quadratic time, a text that
takes seconds to segment, a parser bug that loops) must not hold a partition past the
consumer's poll interval, nor take the worker's memory. As datatrove's ``ExtractorSandbox``
does, a persistent worker process analyses the pages the parent sends it through a pipe:

* the parent waits at most ``extract_timeout_s`` for the answer; past that the worker is
  killed and the page rejected as ``timeout``;
* the worker runs under an RLIMIT_AS of its idle size plus ``extract_max_mb``; a page that
  needs more is rejected as ``too_large``, and the worker, its heap now fragmented, retires;
* a worker that dies on a page (a crash in a C parser, the OOM killer) costs that page an
  ``internal`` rejection;

and the next page gets a new worker. Workers are forked from a zygote, a process that
imported the engine and loaded the segmenter's dictionary and the keyword lexicon once
(about 0.5 s of CPU with the lexicon cached, see ``tables.cache_dir``), so a new
worker costs milliseconds and shares those 170 MB with it, copy-on-write::

    parent ── control socket: spawn, reap ──▶ zygote (single-threaded, warm)
      │  ◀── the worker's two pipe ends ────────┘ fork
      └──── page frames ─▶ worker ─▶ result frames ───▶ parent

The parent is not forked itself: it may hold threads (RocksDB, the Kafka client) whose
locks a forked copy would inherit held, and sockets it would keep open. The zygote is one
per parent process, shared by every ``Sandbox``: it holds imported modules, never a page
or a decision, so no decision depends on which sandbox ran it.

Workers are a resource boundary, not a security boundary: they run as the same user. They
get a minimal environment all the same (no broker credentials), and the parent reads
nothing from them but JSON and raw byte strings, never a pickle, so a worker subverted by
a page cannot make the parent run code through the pipe.

A page goes to a worker parsed (``RawPage``: the command line) or as the message it came
in (``RawMessage``: the Kafka worker), which the worker parses, and whose page id, URL and
times the parent then takes from the worker's answer.

This module holds ``Sandbox``, the parent's side of one stream of pages. The frames that
cross the pipes are ``wire.py``; what runs in the zygote and its workers is ``child.py``;
the parent's handles on those processes (start, spawn, kill, reap) are ``handles.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections import deque
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

from neardup.config import EngineConfig
from neardup.contract import parse_message
from neardup.engine import STAGES, Analysed, Stats, refuse_unencodable
from neardup.records import Extracted, RawMessage, RawPage, Reason, Rejected
from neardup.sandbox.child import RETIRE_SHARE
from neardup.sandbox.handles import DeadlineError, SandboxError, Shared, Worker, describe_exit
from neardup.sandbox.wire import (
    ANALYSE,
    EXTRACT,
    Result,
    message_frame,
    page_frame,
    result_from,
    split_frame,
)

__all__ = ["Sandbox", "SandboxError"]

log = logging.getLogger(__name__)

#: Bytes of address space that parsing a message takes, per byte of it: orjson reserves
#: its worst case up front (12.2-12.5 times the line, measured on 2, 8 and 20 MB lines
#: under RLIMIT_AS), and the worker holds the message's bytes besides. A message that
#: could not be parsed within half of ``extract_max_mb`` is parsed in the parent.
PARSE_BYTES_PER_BYTE = 16


_Kind = TypeVar("_Kind", Analysed, Extracted)


_Item = TypeVar("_Item", bound=RawPage | RawMessage | Rejected)


def _of_kind(
    answers: Generator[tuple[_Item, Result], None, None], kind: type[_Kind]
) -> Generator[tuple[_Item, _Kind | Rejected], None, None]:
    """The answers of one job, each a ``kind`` or a ``Rejected``; closing this closes
    ``answers`` (which then stops the worker if pages are still written ahead)."""
    try:
        for item, result in answers:
            if not isinstance(result, kind | Rejected):
                raise TypeError(f"a {type(result).__name__} answer to a {kind.__name__} job")
            yield item, result
    finally:
        answers.close()


@dataclasses.dataclass(slots=True, eq=False)
class _Pending:
    """One item of ``Sandbox.stream``, from when it is read until it is handed back."""

    item: Any
    #: The page's frame, None for an item that needs no worker.
    frame: bytes | None = None
    result: Result | None = None
    #: Whether the current worker has its frame (a new worker needs it written again).
    sent: bool = False
    #: When it was written (monotonic seconds).
    sent_at: float = 0.0
    #: Writes that found the worker dead before it had the frame.
    broken_writes: int = 0
    #: Workers its frame was written to.
    writes: int = 0
    #: A message's page, parsed by the parent (``Sandbox._pending``): what the worker got.
    page: RawPage | None = None

    @property
    def work(self) -> RawPage | RawMessage:
        """What the worker is given: the item, or the page parsed from it here."""
        return self.item if self.page is None else self.page


class Sandbox:
    """``analyse`` in a worker process, bounded by ``cfg.extract_timeout_s`` and
    ``cfg.extract_max_mb``. Returns what ``analyse`` returns, or a ``Rejected`` (timeout,
    too_large, internal) for a page the worker could not finish. Not thread-safe: one per
    analysing thread.

    ``stream`` keeps up to ``LOOKAHEAD`` pages written ahead in the worker's pipe, so the
    worker goes from one page to the next without waiting for the parent to take its
    answer and write the next page, and the parent decides one page while the worker
    analyses the next. Each page still gets ``extract_timeout_s`` of its own, counted
    from when it was written or the answer before it was read, whichever is later (the
    worker starts on it a little before that); a page that times out or kills its worker
    is rejected alone, and the pages written after it go to the next worker."""

    #: Pages written ahead of the one whose answer is awaited.
    LOOKAHEAD = 4

    def __init__(self, cfg: EngineConfig) -> None:
        if cfg.extract_timeout_s <= 0:
            raise ValueError("the sandbox needs extract_timeout_s > 0")
        self.cfg = cfg
        #: Workers started: the first, then one after each timeout, crash or retirement.
        self.starts = 0
        #: Pages written again to a new worker, the one they were written to having died
        #: or retired on a page before them.
        self.rewrites = 0
        self._worker: Worker | None = None
        self._finalizer: weakref.finalize[Any, Sandbox] | None = None
        #: When the current worker last answered (monotonic seconds).
        self._answered = 0.0

    def _ensure_worker(self) -> Worker:
        if self._worker is None:
            for attempt in (1, 2):
                zygote = Shared.get()
                try:
                    pid, rfd, wfd = zygote.spawn(self.cfg)
                    break
                except (OSError, ValueError) as exc:  # the zygote died: one more try
                    Shared.reset(zygote)
                    if attempt == 2:
                        raise SandboxError(f"no sandbox worker could be started: {exc}") from exc
            self._worker = Worker(zygote, pid, rfd, wfd)
            self._answered = 0.0
            self.starts += 1
            # A sandbox dropped without close() must not leave its worker behind.
            self._finalizer = weakref.finalize(self, Worker.stop, self._worker)
        return self._worker

    def _drop_worker(self) -> int | None:
        worker, self._worker = self._worker, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        return worker.stop() if worker is not None else None

    def analyse(self, page: RawPage, stats: Stats | None = None) -> Analysed | Rejected:
        """``analyse(page, cfg, stats)``, bounded."""
        for _, result in self.stream([page], stats):
            return result
        raise AssertionError("unreachable")

    def stream(
        self, items: Iterable[_Item], stats: Stats | None = None
    ) -> Generator[tuple[_Item, Analysed | Rejected], None, None]:
        """``(item, analyse(item))`` for each page of ``items``, in their order, bounded as
        ``analyse`` is; an item that is already a ``Rejected`` comes back as its own result.
        A ``RawMessage`` is parsed by the worker (``contract.parse_message``): its result is
        the page's rejection or analysis, whose page has no body.
        Reads up to ``LOOKAHEAD`` pages ahead of the one it hands back. Never raises for a
        page: when no worker can be started, the page is rejected as ``internal``."""
        return _of_kind(self._stream(items, ANALYSE, stats), Analysed)

    def extracted(
        self, items: Iterable[_Item]
    ) -> Generator[tuple[_Item, Extracted | Rejected], None, None]:
        """``(item, extract_page(item))`` for each page of ``items``, bounded as
        ``stream`` bounds the analysis."""
        return _of_kind(self._stream(items, EXTRACT, None), Extracted)

    def _stream(
        self, items: Iterable[_Item], job: str, stats: Stats | None
    ) -> Generator[tuple[_Item, Result], None, None]:
        source = iter(items)
        queue: deque[_Pending] = deque()
        more = True
        try:
            while True:
                while self._send(queue) and more and self._in_flight(queue) <= self.LOOKAHEAD:
                    item = next(source, None)
                    if item is None:
                        more = False
                    else:
                        queue.append(self._pending(item, job))
                if not queue:
                    return
                head = queue[0]
                if head.result is None and head.sent:
                    self._await(queue, stats)
                if head.result is None:  # its worker died first: ``_send`` writes it again
                    continue
                queue.popleft()
                yield head.item, head.result
        finally:
            if any(p.sent and p.result is None for p in queue):
                # Left early (the caller stopped, or an error): the worker would answer
                # pages nobody asks for any more, ahead of the next caller's.
                self._drop_worker()

    def _pending(self, item: RawPage | RawMessage | Rejected, job: str) -> _Pending:
        if isinstance(item, Rejected):
            return _Pending(item, result=item)
        if isinstance(item, RawPage):
            refused = refuse_unencodable(item)  # here too: the sandbox's own dead letters
            if refused is not None:
                return _Pending(item, result=refused)
        elif self._parses_here(item):
            return self._parsed_here(item, job)
        try:
            if isinstance(item, RawMessage):
                return _Pending(item, message_frame(item, job))
            return _Pending(item, page_frame(item, job))
        except Exception as exc:
            return _Pending(item, result=self._no_frame(item, exc))

    def _parsed_here(self, msg: RawMessage, job: str) -> _Pending:
        parsed = parse_message(msg, self.cfg.max_bytes)
        if isinstance(parsed, Rejected):
            return _Pending(msg, result=parsed)
        page = dataclasses.replace(parsed, body="")  # as the worker's answer would be
        pending = _Pending(msg, page=page)
        try:
            pending.frame = page_frame(parsed, job)
        except Exception as exc:
            pending.result = self._no_frame(page, exc)
        return pending

    def _no_frame(self, item: RawPage | RawMessage, exc: Exception) -> Rejected:
        # no memory for the frame: the page, not the stream, fails
        ids = self._ids(item)
        log.exception("page %s (%s): no frame for the sandbox", *ids)
        return Rejected(Reason.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], *ids)

    def _parses_here(self, msg: RawMessage) -> bool:
        """Whether ``msg`` is too big for the worker to parse within its memory limit,
        which it would report as bad JSON (orjson: "Not enough memory"); a page that size
        is analysed all the same when it is parsed here."""
        budget = RETIRE_SHARE * self.cfg.extract_max_mb * 1024 * 1024
        return bool(budget) and len(msg.line) * PARSE_BYTES_PER_BYTE > budget

    def _ids(self, item: RawPage | RawMessage) -> tuple[str | None, str | None]:
        """The page id and URL of ``item``, for a rejection the worker did not make: a
        message is parsed here for them, which only a failed page costs."""
        if isinstance(item, RawMessage):
            parsed = parse_message(item, self.cfg.max_bytes)
            return parsed.page_id, parsed.url
        return item.page_id, item.url

    @staticmethod
    def _in_flight(queue: deque[_Pending]) -> int:
        return sum(1 for p in queue if p.result is None)

    def _send(self, queue: deque[_Pending]) -> bool:
        """Write the frames not written yet, in order, while the pipe surely has room for
        them (the first in any case: the worker is reading it). Whether all were written."""
        waiting = 0  # bytes written and not answered yet: at least what the pipe holds
        for p in queue:
            if p.result is not None:
                continue
            assert p.frame is not None
            if p.sent:
                waiting += len(p.frame)
                continue
            try:
                worker = self._ensure_worker()
            except SandboxError as exc:  # a fault of the host, not of the page
                ids = self._ids(p.work)
                log.error("page %s (%s): %s", *ids, exc)
                p.result = Rejected(Reason.INTERNAL, f"SandboxError: {exc}"[:500], *ids)
                continue
            if waiting and waiting + len(p.frame) > worker.capacity:
                return False
            now = time.monotonic()
            try:
                worker.write(p.frame, now + self.cfg.extract_timeout_s)
            except OSError:  # EPIPE
                if waiting:  # it died on an earlier page: reading that one will say so
                    return False
                # It died before it had the whole page, so not of this page: a new one.
                how = describe_exit(self._drop_worker())
                log.warning("sandbox worker died while idle (%s)", how)
                p.broken_writes += 1
                if p.broken_writes < 2:
                    return False
                p.result = self._rejected(p.work, Reason.INTERNAL, f"sandbox workers die ({how})")
                continue
            except DeadlineError:  # the worker read nothing for the whole time limit
                self._restart(queue)
                p.result = self._timeout(p.work)
                continue
            p.sent, p.sent_at = True, now
            self.rewrites += p.writes > 0
            p.writes += 1
            waiting += len(p.frame)
        return True

    def _await(self, queue: deque[_Pending], stats: Stats | None) -> None:
        """Read the answer for the head of ``queue``; on a failure, reject the head and
        have the pages written after it written again, to a new worker."""
        head = queue[0]
        page = head.work
        worker = self._worker
        assert worker is not None
        # The worker starts on a page when it has answered the one before it.
        deadline = max(head.sent_at, self._answered) + self.cfg.extract_timeout_s
        try:
            frame = worker.read(deadline)
        except DeadlineError:
            self._restart(queue)
            head.result = self._timeout(page)
            return
        except (EOFError, OSError):
            how = self._restart(queue)
            ids = self._ids(page)
            log.warning("sandbox worker died on page %s (%s): %s", *ids, how)
            head.result = Rejected(Reason.INTERNAL, f"the sandbox worker died on it ({how})", *ids)
            return
        self._answered = time.monotonic()
        try:
            header, payload = split_frame(frame)
            result = result_from(header, payload, page)
        except (KeyError, TypeError, ValueError) as exc:
            self._restart(queue)
            detail = f"malformed sandbox reply: {type(exc).__name__}: {exc}"[:500]
            head.result = self._rejected(page, Reason.INTERNAL, detail)
            return
        head.result = self._named(result, page)
        if stats is not None:
            seconds = header.get("seconds", {})
            for stage in STAGES:
                stats.seconds[stage] += float(seconds.get(stage, 0.0))
        if header.get("retire"):  # it exits now: the pages written after this one are lost
            self._restart(queue)

    def _named(self, result: Result, page: RawPage | RawMessage) -> Result:
        """``result``, a message's too_large rejection without a page id named here: the
        worker ran out of memory before it had parsed the message (reading it, or in
        ``parse_message``), and a dead letter without its page's id and URL is lost."""
        if (
            isinstance(page, RawMessage)
            and isinstance(result, Rejected)
            and result.reason is Reason.TOO_LARGE
            and result.page_id is None
        ):
            page_id, url = self._ids(page)
            return dataclasses.replace(result, page_id=page_id, url=url)
        return result

    def _restart(self, queue: deque[_Pending]) -> str:
        """Kill the worker: the pages written to it and not answered go to the next one.
        How the worker ended."""
        how = describe_exit(self._drop_worker())
        for p in queue:
            p.sent = False
        return how

    def _timeout(self, page: RawPage | RawMessage) -> Rejected:
        limit, ids = self.cfg.extract_timeout_s, self._ids(page)
        log.warning("page %s (%s) took over %s s; its sandbox worker was killed",
                    *ids, limit)  # fmt: skip
        return Rejected(Reason.TIMEOUT, f"analysis took more than {limit} s", *ids)

    def _rejected(self, page: RawPage | RawMessage, reason: Reason, detail: str) -> Rejected:
        return Rejected(reason, detail, *self._ids(page))

    def close(self) -> None:
        """Stop the worker (a new one starts if the sandbox is used again)."""
        self._drop_worker()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
