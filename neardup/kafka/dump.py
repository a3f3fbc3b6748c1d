"""``kill -USR1 <worker pid>``: log where every thread and every asyncio task is.

For a worker that has gone quiet: one ``WARNING`` block in the worker's log with, for each
thread, its innermost frames, and for each task of the worker's event loop and of Faust's
consumer thread's loop, the frames it is suspended in. (mode's own ``SIGUSR1`` handler,
which this one replaces, prints every frame's local variables: megabytes for a worker
holding a batch.) A worker whose event loop is blocked does not answer; the thread stacks
then need a tool from outside the process (``py-spy dump --pid``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("neardup.kafka")

#: Frames shown for each thread and task (the innermost ones).
FRAMES = 6


def _frames(frames: list[FrameType]) -> list[str]:
    return [f"    {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in frames[-FRAMES:]]


def _thread_stack(frame: FrameType | None) -> list[FrameType]:
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    return stack[::-1]


def _awaiting(obj: object) -> list[str]:
    """The frames of a suspended coroutine and of what it awaits, outermost first:
    ``Task.get_stack`` gives only the task's own frame."""
    lines: list[str] = []
    for _ in range(64):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None)
        frame = frame or getattr(obj, "gi_frame", None)
        if frame is None:
            if obj is not None:
                lines.append(f"    awaits {type(obj).__name__}")
            break
        lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        obj = (
            getattr(obj, "cr_await", None)
            or getattr(obj, "ag_await", None)
            or getattr(obj, "gi_yieldfrom", None)
        )
    return lines[-FRAMES:]


def _tasks(loop: asyncio.AbstractEventLoop) -> list[str]:
    lines = []
    try:
        tasks = list(asyncio.all_tasks(loop))
    except RuntimeError:  # the other thread's loop changed its set while we copied it
        return ["  (tasks changed while being listed)"]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
        lines.append(f"  task {task.get_name()} {name}")
        lines += _awaiting(coro)
    return lines


def _generators() -> list[str]:
    """Suspended async generators (a stream's iterators: an agent waiting in ``async
    for`` awaits one, and the frames stop there)."""
    lines = []
    for obj in gc.get_objects():
        if inspect.isasyncgen(obj) and obj.ag_frame is not None and obj.ag_await is not None:
            lines.append(f"  async generator {obj.__qualname__}")
            lines += _awaiting(obj)
    return lines


def report(extra: Callable[[], str] | None = None) -> str:
    """``extra()``, then every thread's innermost frames, every known event loop's
    tasks and the suspended async generators. (``extra`` first: it is the shortest and
    says most, and a reader who sees only the first lines, as a CI log's excerpt, sees
    it.)"""
    lines = []
    if extra is not None:
        try:
            lines.append(extra())
        except Exception as exc:  # a report about a worker in trouble must not fail
            lines.append(f"({exc!r} while reporting more)")
    lines.append("threads:")
    names = {t.ident: t for t in threading.enumerate()}
    loops: list[tuple[str, asyncio.AbstractEventLoop]] = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        name = thread.name if thread is not None else str(ident)
        lines.append(f"  thread {name}")
        lines += _frames(_thread_stack(frame))
        # mode's WorkerThread (Faust's consumer thread) runs its ServiceThread's loop
        loop = getattr(getattr(thread, "service", None), "thread_loop", None)
        if isinstance(loop, asyncio.AbstractEventLoop):
            loops.append((name, loop))
    try:
        running = asyncio.get_running_loop()
        loops.insert(0, ("main", running))
    except RuntimeError:
        pass
    seen: set[int] = set()
    for name, loop in loops:
        if id(loop) in seen:
            continue
        seen.add(id(loop))
        lines.append(f"tasks of the {name} loop:")
        lines += _tasks(loop)
    lines.append("async generators:")
    lines += _generators()
    return "\n".join(lines)


def install(loop: asyncio.AbstractEventLoop, extra: Callable[[], str] | None = None) -> None:
    """Answer ``SIGUSR1`` with ``report(extra)`` in the log (call from within ``loop``,
    after mode installed its handlers)."""

    def on_signal() -> None:
        log.warning("SIGUSR1: where the worker is\n%s", report(extra))

    loop.add_signal_handler(signal.SIGUSR1, on_signal)
