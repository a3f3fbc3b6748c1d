"""The parent's handles on the sandbox's processes: the zygote (started once per process,
shared by every ``Sandbox``, stopped at exit) and each worker's two non-blocking pipe
ends, read and written against a deadline.

Apart from ``neardup.sandbox``, which decides what to write and what a failure costs a
page; this module only starts, talks to, kills and reaps processes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from neardup.config import EngineConfig
from neardup.sandbox.wire import CHUNK, CONTROL_BYTES, FRAME, dumps

#: Seconds the zygote may take to import the engine and load the segmenter's dictionary.
START_TIMEOUT_S = 120.0
_REPLY_READ = 1 << 16  # a result frame is about 10 KiB on a news page
# Environment the zygote keeps: nothing a page could leak (broker credentials live in
# other NEARDUP_* variables), only what Python, numpy and jieba need, where the lexicon
# is cached (``tables.cache_dir``), and whether to use the native fingerprints.
_ENV_KEEP = (
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "PYTHONHASHSEED",
    "NEARDUP_CACHE_DIR", "XDG_CACHE_HOME", "NEARDUP_NATIVE",
)  # fmt: skip


class SandboxError(RuntimeError):
    """The sandbox cannot run at all (no zygote or worker starts): a fault of the host."""


class DeadlineError(Exception):
    pass


def _zygote_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    # The zygote imports this package from where the parent did, installed or not.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    # One thread each: a single-threaded zygote is safe to fork, and BLAS or OpenMP pools
    # would reserve address space under RLIMIT_AS.
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def describe_exit(code: int | None) -> str:
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
                [sys.executable, "-c",
                 "from neardup.sandbox.child import zygote_main; zygote_main()",
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
            self.ctl.send(dumps(request))
        msg, fds, _, _ = socket.recv_fds(self.ctl, CONTROL_BYTES, 2)
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


class Shared:
    """The one zygote of this process (see ``neardup.sandbox``), started on first use."""

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


atexit.register(Shared.shutdown)
os.register_at_fork(after_in_child=Shared.forget)


class Worker:
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
            raise DeadlineError

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:  # the pipe has room for a page nearly always: poll only when it is full
                view = view[os.write(self.wfd, view[:CHUNK]) :]
            except BlockingIOError:
                self._wait(self.writable, deadline)

    def _read_some(self, n: int, deadline: float) -> bytes:
        self._wait(self.readable, deadline)
        chunk = os.read(self.rfd, n)
        if not chunk:
            raise EOFError
        return chunk

    def read(self, deadline: float) -> bytes:
        """One frame, whole (see ``split_frame``). Reads ask for more than an answer's
        usual size, so that one poll and one read take a whole answer, or several when
        the worker ran ahead; what follows the frame is kept for the next call."""
        buf = self.buffer
        while len(buf) < FRAME.size:
            buf += self._read_some(_REPLY_READ, deadline)
        head_len, payload_len = FRAME.unpack_from(buf)
        total = FRAME.size + head_len + payload_len
        while len(buf) < total:
            buf += self._read_some(min(max(total - len(buf), _REPLY_READ), CHUNK), deadline)
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
