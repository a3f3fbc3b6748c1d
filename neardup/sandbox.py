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
(about 0.5 s of CPU with the lexicon cached, see ``fingerprint.cache_dir``), so a new
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
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import faulthandler
import fcntl
import gc
import json
import logging
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from neardup.config import EngineConfig
from neardup.contract import parse_message
from neardup.engine import STAGES, Analysed, Stats, analyse, extract_page, refuse_unencodable
from neardup.fingerprint import Fingerprints
from neardup.records import Extracted, RawMessage, RawPage, Reason, Rejected

log = logging.getLogger(__name__)

#: Seconds the zygote may take to import the engine and load the segmenter's dictionary.
START_TIMEOUT_S = 120.0
#: A worker whose memory grew past its idle size by this share of the memory limit retires
#: after the page: memory once taken is not given back to the system.
RETIRE_SHARE = 0.5
#: Bytes of address space that parsing a message takes, per byte of it: orjson reserves
#: its worst case up front (12.2-12.5 times the line, measured on 2, 8 and 20 MB lines
#: under RLIMIT_AS), and the worker holds the message's bytes besides. A message that
#: could not be parsed within half of ``extract_max_mb`` is parsed in the parent.
PARSE_BYTES_PER_BYTE = 16
#: Pipe buffer asked for (Linux caps it at /proc/sys/fs/pipe-max-size, 1 MiB by default).
PIPE_BYTES = 1 << 20

# What a worker does with a page: ``analyse`` it (the engine), or only ``extract`` its
# title and text (``neardup extract``).
ANALYSE, EXTRACT = "analyse", "extract"
_Result = Analysed | Extracted | Rejected

# A frame: two big-endian lengths, then a JSON header and a byte payload of those lengths.
_FRAME = struct.Struct(">II")
_CHUNK = 1 << 20
_REPLY_READ = 1 << 16  # a result frame is about 10 KiB on a news page
_CONTROL_BYTES = 1 << 16  # one control message (a config, a pid, an exit status)
# Environment the zygote keeps: nothing a page could leak (broker credentials live in
# other NEARDUP_* variables), only what Python, numpy and jieba need, where the lexicon
# is cached (``fingerprint.cache_dir``), and whether to use the native fingerprints.
_ENV_KEEP = (
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "PYTHONHASHSEED",
    "NEARDUP_CACHE_DIR", "XDG_CACHE_HOME", "NEARDUP_NATIVE",
)  # fmt: skip
_WARMUP = RawPage(
    "warmup",
    "http://warmup.invalid/",
    "2000-01-01T00:00:00Z",
    "text/html",
    "<html><head><title>预热</title></head><body><article><p>今天天气很好，我们去公园散步。"
    "公园里的花开了，孩子们在草地上奔跑。</p></article></body></html>",
)


class SandboxError(RuntimeError):
    """The sandbox cannot run at all (no zygote or worker starts): a fault of the host."""


class _DeadlineError(Exception):
    pass


# ------------------------------------------------------------------------- the wire


def _dumps(obj: object) -> bytes:
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        # a lone surrogate (a hand-built page's URL may hold one), which orjson refuses:
        # json's ASCII escapes carry it both ways (``_loads``)
        return json.dumps(obj).encode()


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # a lone surrogate's escape, from ``_dumps``
        return json.loads(data)


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = _dumps(header)
    return _FRAME.pack(len(head), len(payload)) + head + payload


def _split_frame(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the payload of one whole frame."""
    head_len, payload_len = _FRAME.unpack_from(frame)
    if len(frame) != _FRAME.size + head_len + payload_len:
        raise ValueError("sandbox reply: the frame's length does not match its prefix")
    header: dict[str, Any] = _loads(frame[_FRAME.size : _FRAME.size + head_len])
    return header, frame[_FRAME.size + head_len :]


def _page_frame(page: RawPage, job: str = ANALYSE) -> bytes:
    body: bytes
    text = isinstance(page.body, str)
    if isinstance(page.body, str):
        try:
            body = page.body.encode("utf-8")
        except UnicodeEncodeError:  # a JSON string's lone surrogate, for decode() to see
            body = page.body.encode("utf-8", "surrogatepass")  # slower: only when needed
    else:
        body = page.body
    header = {
        "page_id": page.page_id,
        "url": page.url,
        "fetched_at": page.fetched_at,
        "content_type": page.content_type,
        "site": page.site,
        "text": text,
        "job": job,
    }
    return _frame(header, body)


def _message_frame(msg: RawMessage, job: str = ANALYSE) -> bytes:
    """A message not parsed yet: the worker parses it (``contract.parse_message``)."""
    return _frame({"raw": True, "where": msg.where, "job": job}, msg.line)


_PAGE_FIELDS = ("page_id", "url", "fetched_at", "content_type", "site")


def _page_meta(page: RawPage) -> dict[str, Any]:
    return {name: getattr(page, name) for name in _PAGE_FIELDS}


def _page_from(header: dict[str, Any], payload: bytes) -> tuple[RawPage, bytes | None]:
    """The page of a frame, and a text body's UTF-8 (the payload itself) for ``decode``,
    which then need not encode it again; None for a byte body, or a text body that held
    a lone surrogate (sent as surrogatepass, which is not UTF-8)."""
    body: str | bytes = payload
    utf8: bytes | None = None
    if header["text"]:
        try:
            body, utf8 = payload.decode("utf-8"), payload
        except UnicodeDecodeError:
            body = payload.decode("utf-8", "surrogatepass")
    page = RawPage(
        header["page_id"],
        header["url"],
        header["fetched_at"],
        header["content_type"],
        body,
        header["site"],
    )
    return page, utf8


_FPS_FIELDS = tuple(f.name for f in dataclasses.fields(Fingerprints))
_ANALYSED_FIELDS = tuple(
    f.name for f in dataclasses.fields(Analysed) if f.name not in ("page", "fps")
)


def _result_frame(
    result: _Result, seconds: dict[str, float], retire: bool, parsed: bool = False
) -> bytes:
    """``parsed``: the worker parsed the page from a message, and the parent, which has
    no page of its own, needs its fields (never its body)."""
    header: dict[str, Any] = {"seconds": seconds, "retire": retire}
    if isinstance(result, Rejected):
        header["rejected"] = {"reason": str(result.reason), "detail": result.detail,
                              "page_id": result.page_id, "url": result.url}  # fmt: skip
        return _frame(header)
    if parsed:
        header["page"] = _page_meta(result.page)
    if isinstance(result, Extracted):
        header["extracted"] = {"title": result.title, "paragraphs": result.paragraphs}
        return _frame(header)
    blobs: list[bytes] = []
    fps: dict[str, Any] = {}
    for name in _FPS_FIELDS:
        value = getattr(result.fps, name)
        if isinstance(value, bytes):
            fps[name] = {"blob": len(value)}
            blobs.append(value)
        else:
            fps[name] = value
    header["analysed"] = {name: getattr(result, name) for name in _ANALYSED_FIELDS}
    header["fps"] = fps
    return _frame(header, b"".join(blobs))


def _result_from(header: dict[str, Any], payload: bytes, item: RawPage | RawMessage) -> _Result:
    """The child's answer for ``item``: a page is the parent's own copy; a message's page
    is made from the fields the child parsed, without its body (nothing after the
    analysis reads it)."""
    if "rejected" in header:
        rej = header["rejected"]
        ids = (item.page_id, item.url) if isinstance(item, RawPage) else (
            _opt_str(rej.get("page_id")), _opt_str(rej.get("url")))  # fmt: skip
        return Rejected(Reason(rej["reason"]), str(rej["detail"]), *ids)
    page = item if isinstance(item, RawPage) else _parsed_page(header["page"])
    if "extracted" in header:
        ext = header["extracted"]
        return Extracted(page, str(ext["title"]), tuple(str(p) for p in ext["paragraphs"]))
    fps: dict[str, Any] = {}
    at = 0
    for name, value in header["fps"].items():
        if isinstance(value, dict):
            size = int(value["blob"])
            fps[name] = payload[at : at + size]
            at += size
        else:
            fps[name] = tuple(value) if isinstance(value, list) else value
    if at != len(payload):
        raise ValueError("sandbox reply: payload does not match its header")
    analysed: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in header["analysed"].items()
    }
    return Analysed(page=page, fps=Fingerprints(**fps), **analysed)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _parsed_page(meta: dict[str, Any]) -> RawPage:
    fields = {name: _opt_str(meta[name]) for name in _PAGE_FIELDS}
    if any(fields[name] is None for name in _PAGE_FIELDS if name != "site"):
        raise ValueError("sandbox reply: a parsed page without its identity")
    return RawPage(body="", **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------ blocking I/O, in the worker


def _read_exact_blocking(fd: int, n: int) -> bytes:
    """``n`` bytes of ``fd``. On a MemoryError all ``n`` are read all the same, and dropped,
    so that the next read starts where the sender's next frame does."""
    chunks: list[bytes] = []
    try:
        while n:
            chunk = os.read(fd, min(n, _CHUNK))
            if not chunk:
                raise EOFError
            n -= len(chunk)  # first: a MemoryError in append must not count it unread
            chunks.append(chunk)
        return b"".join(chunks)
    except MemoryError:
        chunks.clear()  # reading on needs the memory they hold
        while n:
            chunk = os.read(fd, min(n, _CHUNK))
            if not chunk:
                raise EOFError from None
            n -= len(chunk)
        raise


def _read_item_blocking(
    fd: int, max_mb: int
) -> tuple[str, RawPage | RawMessage | Rejected, bytes | None]:
    """The job and the page or message of the next frame, and the body's UTF-8 for
    ``decode`` (``_page_from``). A body this process cannot hold under its memory limit
    is a too_large rejection (its bytes read and dropped): the parent sends whatever
    ``max_bytes`` lets through, which may be set near ``extract_max_mb``."""
    head_len, payload_len = _FRAME.unpack(_read_exact_blocking(fd, _FRAME.size))
    header: dict[str, Any] = _loads(_read_exact_blocking(fd, head_len))
    job = str(header.get("job", ANALYSE))
    try:
        payload = _read_exact_blocking(fd, payload_len)
        if header.get("raw"):
            return job, RawMessage(payload, str(header.get("where", ""))), None
        page, utf8 = _page_from(header, payload)
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
        view = view[os.write(fd, view[:_CHUNK]) :]


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
) -> _Result:
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
        result: _Result
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
        reply = _result_frame(result, stats.seconds, retire, isinstance(item, RawMessage))
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
    ctl.send(_dumps({"ready": os.getpid()}))
    workers: set[int] = set()
    try:
        while msg := ctl.recv(_CONTROL_BYTES):
            request = json.loads(msg)
            if "spawn" in request:
                cfg = EngineConfig(**request["spawn"])
                analyse(_WARMUP, cfg)  # another segmenter loads here, once, not in a page
                pid, fds = _fork_worker(cfg, ctl)
                workers.add(pid)
                socket.send_fds(ctl, [_dumps({"pid": pid})], fds)
                for fd in fds:
                    os.close(fd)
            elif "reap" in request:
                pid = int(request["reap"])
                _, status = os.waitpid(pid, 0)
                workers.discard(pid)
                ctl.send(_dumps({"code": os.waitstatus_to_exitcode(status)}))
    except OSError:
        pass  # the parent is gone
    finally:
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


# ---------------------------------------------------------------------- the parent


def _zygote_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    # The zygote imports this package from where the parent did, installed or not.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    # One thread each: a single-threaded zygote is safe to fork, and BLAS or OpenMP pools
    # would reserve address space under RLIMIT_AS.
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


class _Zygote:
    """The parent's handle on the zygote: spawn and reap workers, one request at a time."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from neardup.sandbox import zygote_main; zygote_main()",
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_zygote_env(),
            )  # fmt: skip
        self.ctl = ours
        self.lock = threading.Lock()
        self.owner = os.getpid()
        try:
            self._request(None)
        except (OSError, ValueError) as exc:
            self.close()
            raise SandboxError(f"the sandbox zygote did not start: {exc}") from exc

    def _request(self, request: dict[str, Any] | None) -> tuple[dict[str, Any], list[int]]:
        self.ctl.settimeout(START_TIMEOUT_S)
        if request is not None:
            self.ctl.send(_dumps(request))
        msg, fds, _, _ = socket.recv_fds(self.ctl, _CONTROL_BYTES, 2)
        if not msg:
            raise EOFError("the sandbox zygote exited")
        reply: dict[str, Any] = json.loads(msg)
        return reply, fds

    def spawn(self, cfg: EngineConfig) -> tuple[int, int, int]:
        """A new worker for ``cfg``: its pid, and the parent's read and write ends."""
        with self.lock:
            reply, fds = self._request({"spawn": cfg.to_dict()})
        if len(fds) != 2 or "pid" not in reply:
            for fd in fds:
                os.close(fd)
            raise SandboxError(f"the sandbox zygote answered {reply} to spawn")
        return int(reply["pid"]), fds[0], fds[1]

    def reap(self, pid: int) -> int | None:
        """Wait for a worker that was killed or told to stop; its exit code."""
        with self.lock:
            reply, _ = self._request({"reap": pid})
        code = reply.get("code")
        return int(code) if code is not None else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if os.getpid() != self.owner:  # a forked copy: the zygote is the parent's
            return
        self.ctl.close()  # the zygote kills its workers and exits
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Shared:
    """The one zygote of this process (see the module's docstring), started on first use."""

    zygote: _Zygote | None = None
    lock = threading.Lock()

    @classmethod
    def get(cls) -> _Zygote:
        with cls.lock:
            if cls.zygote is None or not cls.zygote.alive():
                cls.zygote = _Zygote()
            return cls.zygote

    @classmethod
    def shutdown(cls) -> None:
        """Stop the zygote and wait for it, so that no process outlives this one."""
        with cls.lock:
            zygote, cls.zygote = cls.zygote, None
        if zygote is not None:
            with contextlib.suppress(OSError):
                zygote.close()

    @classmethod
    def reset(cls, dead: _Zygote) -> None:
        with cls.lock:
            if cls.zygote is dead:
                cls.zygote = None
        with contextlib.suppress(OSError):
            dead.close()

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the zygote is the parent's; the child starts its own."""
        cls.zygote = None
        cls.lock = threading.Lock()


atexit.register(_Shared.shutdown)
os.register_at_fork(after_in_child=_Shared.forget)


class _Worker:
    """The parent's end of one worker: its pid and two non-blocking pipe ends."""

    def __init__(self, zygote: _Zygote, pid: int, rfd: int, wfd: int) -> None:
        self.zygote, self.pid, self.rfd, self.wfd = zygote, pid, rfd, wfd
        self.owner = os.getpid()  # a forked copy of this object must leave the worker be
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        # poll, not select: a worker with many sockets has descriptors above FD_SETSIZE
        #: The pipe's size: bytes that can be written ahead without blocking.
        self.capacity = 1 << 16  # Linux's default
        with contextlib.suppress(OSError, AttributeError):
            self.capacity = fcntl.fcntl(wfd, fcntl.F_GETPIPE_SZ)
        self.readable = select.poll()
        self.readable.register(rfd, select.POLLIN)
        self.writable = select.poll()
        self.writable.register(wfd, select.POLLOUT)
        self.closed = False
        #: Bytes read past the last whole frame.
        self.buffer = bytearray()

    @staticmethod
    def _wait(poller: select.poll, deadline: float) -> None:
        # Past the deadline, what is there already still counts: a caller that came back
        # late to a stream (its event loop busy elsewhere) finds answers waiting.
        remaining = max(deadline - time.monotonic(), 0.0)
        if not poller.poll(remaining * 1000):
            raise _DeadlineError

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:  # the pipe has room for a page nearly always: poll only when it is full
                view = view[os.write(self.wfd, view[:_CHUNK]) :]
            except BlockingIOError:
                self._wait(self.writable, deadline)

    def _read_some(self, n: int, deadline: float) -> bytes:
        self._wait(self.readable, deadline)
        chunk = os.read(self.rfd, n)
        if not chunk:
            raise EOFError
        return chunk

    def read(self, deadline: float) -> bytes:
        """One frame, whole (see ``_split_frame``). Reads ask for more than an answer's
        usual size, so that one poll and one read take a whole answer, or several when
        the worker ran ahead; what follows the frame is kept for the next call."""
        buf = self.buffer
        while len(buf) < _FRAME.size:
            buf += self._read_some(_REPLY_READ, deadline)
        head_len, payload_len = _FRAME.unpack_from(buf)
        total = _FRAME.size + head_len + payload_len
        while len(buf) < total:
            buf += self._read_some(min(max(total - len(buf), _REPLY_READ), _CHUNK), deadline)
        frame = bytes(buf[:total])
        del buf[:total]
        return frame

    def stop(self) -> int | None:
        """Kill the worker (idle or not, it holds nothing worth keeping), close its pipes
        and reap it; its exit code, which says how it died if it died by itself first."""
        if self.closed or os.getpid() != self.owner:
            return None
        self.closed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # not reaped yet: the pid cannot be reused
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            return self.zygote.reap(self.pid)
        except (OSError, ValueError):
            return None  # the zygote is gone, and took its workers with it


_Kind = TypeVar("_Kind", Analysed, Extracted)


_Item = TypeVar("_Item", bound=RawPage | RawMessage | Rejected)


def _of_kind(
    answers: Generator[tuple[_Item, _Result], None, None], kind: type[_Kind]
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
    result: _Result | None = None
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
        self._worker: _Worker | None = None
        self._finalizer: weakref.finalize[Any, Sandbox] | None = None
        #: When the current worker last answered (monotonic seconds).
        self._answered = 0.0

    def _ensure_worker(self) -> _Worker:
        if self._worker is None:
            for attempt in (1, 2):
                zygote = _Shared.get()
                try:
                    pid, rfd, wfd = zygote.spawn(self.cfg)
                    break
                except (OSError, ValueError) as exc:  # the zygote died: one more try
                    _Shared.reset(zygote)
                    if attempt == 2:
                        raise SandboxError(f"no sandbox worker could be started: {exc}") from exc
            self._worker = _Worker(zygote, pid, rfd, wfd)
            self._answered = 0.0
            self.starts += 1
            # A sandbox dropped without close() must not leave its worker behind.
            self._finalizer = weakref.finalize(self, _Worker.stop, self._worker)
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
    ) -> Generator[tuple[_Item, _Result], None, None]:
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
                return _Pending(item, _message_frame(item, job))
            return _Pending(item, _page_frame(item, job))
        except Exception as exc:
            return _Pending(item, result=self._no_frame(item, exc))

    def _parsed_here(self, msg: RawMessage, job: str) -> _Pending:
        parsed = parse_message(msg, self.cfg.max_bytes)
        if isinstance(parsed, Rejected):
            return _Pending(msg, result=parsed)
        page = dataclasses.replace(parsed, body="")  # as the worker's answer would be
        pending = _Pending(msg, page=page)
        try:
            pending.frame = _page_frame(parsed, job)
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
                how = _describe_exit(self._drop_worker())
                log.warning("sandbox worker died while idle (%s)", how)
                p.broken_writes += 1
                if p.broken_writes < 2:
                    return False
                p.result = self._rejected(p.work, Reason.INTERNAL, f"sandbox workers die ({how})")
                continue
            except _DeadlineError:  # the worker read nothing for the whole time limit
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
        except _DeadlineError:
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
            header, payload = _split_frame(frame)
            result = _result_from(header, payload, page)
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

    def _named(self, result: _Result, page: RawPage | RawMessage) -> _Result:
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
        how = _describe_exit(self._drop_worker())
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
