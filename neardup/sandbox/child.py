"""What runs in the sandbox's child processes: the zygote, which imports the engine once
and forks a worker for each ``spawn`` it is sent, and the worker's loop, which reads a
page frame, analyses the page under its memory limit and writes the result frame.

Apart from ``neardup.sandbox`` and its ``handles.py`` because none of this runs in the
parent: the parent starts the zygote as ``python -c "from neardup.sandbox.child import
zygote_main; zygote_main()"``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import fcntl
import gc
import json
import logging
import os
import resource
import signal
import socket
import sys
from typing import Any

from neardup.config import EngineConfig
from neardup.contract import parse_message
from neardup.engine import Stats, analyse, extract_page
from neardup.records import RawMessage, RawPage, Reason, Rejected
from neardup.sandbox.wire import (
    ANALYSE,
    CHUNK,
    CONTROL_BYTES,
    EXTRACT,
    FRAME,
    Result,
    dumps,
    loads,
    page_from,
    result_frame,
)

# One logger for the sandbox, whichever of its modules logs: the parent's and the
# zygote's log lines name it as they always have.
log = logging.getLogger("neardup.sandbox")

#: A worker whose memory grew past its idle size by this share of the memory limit retires
#: after the page: memory once taken is not given back to the system.
RETIRE_SHARE = 0.5
#: Pipe buffer asked for (Linux caps it at /proc/sys/fs/pipe-max-size, 1 MiB by default).
PIPE_BYTES = 1 << 20
_WARMUP = RawPage(
    "warmup",
    "http://warmup.invalid/",
    "2000-01-01T00:00:00Z",
    "text/html",
    "<html><head><title>预热</title></head><body><article><p>今天天气很好，我们去公园散步。"
    "公园里的花开了，孩子们在草地上奔跑。</p></article></body></html>",
)


# ------------------------------------------------------------ blocking I/O, in the worker


def _read_exact_blocking(fd: int, n: int) -> bytes:
    """``n`` bytes of ``fd``. On a MemoryError all ``n`` are read all the same, and dropped,
    so that the next read starts where the sender's next frame does."""
    chunks: list[bytes] = []
    try:
        while n:
            chunk = os.read(fd, min(n, CHUNK))
            if not chunk:
                raise EOFError
            n -= len(chunk)  # first: a MemoryError in append must not count it unread
            chunks.append(chunk)
        return b"".join(chunks)
    except MemoryError:
        chunks.clear()  # reading on needs the memory they hold
        while n:
            chunk = os.read(fd, min(n, CHUNK))
            if not chunk:
                raise EOFError from None
            n -= len(chunk)
        raise


def _read_item_blocking(
    fd: int, max_mb: int
) -> tuple[str, RawPage | RawMessage | Rejected, bytes | None]:
    """The job and the page or message of the next frame, and the body's UTF-8 for
    ``decode`` (``page_from``). A body this process cannot hold under its memory limit
    is a too_large rejection (its bytes read and dropped): the parent sends whatever
    ``max_bytes`` lets through, which may be set near ``extract_max_mb``."""
    head_len, payload_len = FRAME.unpack(_read_exact_blocking(fd, FRAME.size))
    header: dict[str, Any] = loads(_read_exact_blocking(fd, head_len))
    job = str(header.get("job", ANALYSE))
    try:
        payload = _read_exact_blocking(fd, payload_len)
        if header.get("raw"):
            return job, RawMessage(payload, str(header.get("where", ""))), None
        page, utf8 = page_from(header, payload)
        return job, page, utf8
    except MemoryError:
        what = "message" if header.get("raw") else "body"
        detail = (f"analysis needed more than {max_mb} MiB: the sandbox could not hold the "
                  f"{payload_len}-byte {what}")  # fmt: skip
        ids = (None, None) if header.get("raw") else (header["page_id"], header["url"])
        return job, Rejected(Reason.TOO_LARGE, detail, *ids), None


def _write_all_blocking(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:CHUNK]) :]


# ---------------------------------------------------------------------- the worker


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class _Meter:
    """This process's memory from /proc, read with pread on descriptors opened once: the
    worker asks after every page, and an open and a Python file object per read cost
    more than the kernel's answer."""

    def __init__(self) -> None:
        self.statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)

    def vm_bytes(self) -> tuple[int, int]:
        """(virtual size, resident size) of this process, in bytes."""
        size, resident = os.pread(self.statm, 256, 0).split()[:2]
        return int(size) * _PAGE_SIZE, int(resident) * _PAGE_SIZE

    def peak_bytes(self) -> int:
        """The most address space this process has held (VmPeak), in bytes."""
        status = os.pread(self.status, 1 << 14, 0)
        at = status.find(b"VmPeak:")
        return int(status[at + 7 : status.index(b"\n", at)].split()[0]) * 1024 if at >= 0 else 0


def _limit_memory(max_mb: int, meter: _Meter) -> int:
    """Cap this process's address space at its current size plus ``max_mb`` MiB."""
    if not max_mb:
        return 0
    limit = meter.vm_bytes()[0] + max_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def _analyse_one(
    item: RawPage | RawMessage,
    cfg: EngineConfig,
    stats: Stats,
    utf8: bytes | None = None,
    job: str = ANALYSE,
) -> Result:
    page: RawPage | None = item if isinstance(item, RawPage) else None
    try:
        if page is None:
            assert isinstance(item, RawMessage)
            parsed = parse_message(item, cfg.max_bytes)
            if isinstance(parsed, Rejected):
                return parsed
            page = parsed
        if job == EXTRACT:
            return extract_page(page, cfg, stats, utf8)
        return analyse(page, cfg, stats, utf8)
    except MemoryError:
        detail = f"analysis needed more than {cfg.extract_max_mb} MiB"
        return Rejected(Reason.TOO_LARGE, detail, *_ids_of(page))
    except Exception as exc:  # a bug, not bad input: logged here, dead-lettered there
        log.exception("analyse failed on page %s (%s)", *_ids_of(page))
        detail = f"{type(exc).__name__}: {exc}"[:500]
        return Rejected(Reason.INTERNAL, detail, *_ids_of(page))


def _ids_of(page: RawPage | None) -> tuple[str | None, str | None]:
    return (None, None) if page is None else (page.page_id, page.url)


def _serve(cfg: EngineConfig, rfd: int, wfd: int) -> None:
    """The worker's loop: page frames in, result frames out, until the pipe closes."""
    meter = _Meter()
    limit = _limit_memory(cfg.extract_max_mb, meter)
    headroom = RETIRE_SHARE * cfg.extract_max_mb * 1024 * 1024
    retire_rss = meter.vm_bytes()[1] + headroom
    while True:
        try:
            job, item, utf8 = _read_item_blocking(rfd, cfg.extract_max_mb)
        except EOFError:
            return
        stats = Stats()
        result: Result
        if isinstance(item, Rejected):  # a body it could not hold: it had to try
            result, exhausted = item, True
        else:
            result = _analyse_one(item, cfg, stats, utf8, job)
            # VmPeak covers the worker's whole life, so it is read after every page (8 us):
            # a page that came near the limit retires the worker, and a later failure is
            # never blamed on a peak of an earlier page.
            exhausted = bool(limit) and meter.peak_bytes() > limit - headroom
        if (
            isinstance(result, Rejected)
            and result.reason is Reason.INTERNAL
            and (exhausted or "MemoryError" in result.detail)
        ):
            # Extractors turn a MemoryError into a parser failure, and a C parser that
            # cannot allocate reports "Can't parse HTML": near the limit, the failure is
            # the page's size.
            detail = f"analysis needed more than {cfg.extract_max_mb} MiB ({result.detail})"
            result = Rejected(Reason.TOO_LARGE, detail[:500], result.page_id, result.url)
            exhausted = True
        retire = exhausted or (bool(limit) and meter.vm_bytes()[1] > retire_rss)
        reply = result_frame(result, stats.seconds, retire, isinstance(item, RawMessage))
        _write_all_blocking(wfd, reply)
        if retire:
            return


def _fork_worker(cfg: EngineConfig, ctl: socket.socket) -> tuple[int, list[int]]:
    """Fork a worker; its pid and the parent's ends of its pipes (read, write)."""
    req_r, req_w = os.pipe()  # pages: parent -> worker
    rep_r, rep_w = os.pipe()  # results: worker -> parent
    for fd in (req_w, rep_w):
        # A page in one write, not sixteen 64 KiB ones that each wait for the other side
        # to be scheduled: on a busy host those waits cost more than the copy.
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the zygote's loop
        code = 0
        try:
            ctl.close()
            os.close(req_w)
            os.close(rep_r)
            _die_with_parent(zygote)
            _serve(cfg, req_r, rep_w)
        except BaseException:
            code = 1  # first: logging itself may fail (a MemoryError near the limit)
            log.exception("sandbox worker failed")
        finally:
            os._exit(code)
    os.close(req_r)
    os.close(rep_w)
    return pid, [rep_r, req_w]


def zygote_main() -> None:
    """The zygote: warm up, then fork a worker or reap one on each control message,
    until the parent goes away (its end of the control socket closes)."""
    os.dup2(2, 1)  # a library's stray print goes to stderr, never into the parent's stdout
    # Ctrl-C reaches the whole process group; the parent decides when the sandbox stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in a C parser leaves a Python traceback in the log
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctl = socket.socket(fileno=int(sys.argv[1]))
    analyse(_WARMUP, EngineConfig())  # imports, and the segmenter's dictionary
    gc.freeze()  # the collector must not touch (and so copy) the shared objects in workers
    ctl.send(dumps({"ready": os.getpid()}))
    workers: set[int] = set()
    try:
        while msg := ctl.recv(CONTROL_BYTES):
            request = json.loads(msg)
            if "spawn" in request:
                cfg = EngineConfig(**request["spawn"])
                analyse(_WARMUP, cfg)  # another segmenter loads here, once, not in a page
                pid, fds = _fork_worker(cfg, ctl)
                workers.add(pid)
                socket.send_fds(ctl, [dumps({"pid": pid})], fds)
                for fd in fds:
                    os.close(fd)
            elif "reap" in request:
                pid = int(request["reap"])
                _, status = os.waitpid(pid, 0)
                workers.discard(pid)
                ctl.send(dumps({"code": os.waitstatus_to_exitcode(status)}))
    except OSError:
        pass  # the parent is gone
    finally:
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
