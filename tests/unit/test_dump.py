"""``neardup.kafka.dump``: where the threads and tasks of a quiet worker are."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from types import SimpleNamespace

import pytest
from mode.threads import WorkerThread

from neardup.kafka import dump


def test_report_names_each_thread_and_each_task_where_it_waits() -> None:
    release = threading.Event()
    parked = threading.Thread(target=release.wait, name="parked-thread")
    parked.start()

    async def waits_on_a_queue(q: asyncio.Queue[int]) -> None:
        await q.get()

    async def scene() -> str:
        q: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.create_task(waits_on_a_queue(q), name="the-waiter")
        await asyncio.sleep(0)
        text = dump.report()
        task.cancel()
        return text

    try:
        text = asyncio.run(scene())
    finally:
        release.set()
        parked.join()
    threads, tasks = text.split("tasks of the main loop:")
    assert "thread parked-thread" in threads
    assert "wait" in threads.split("thread parked-thread")[1].split("thread ")[0]
    waiter = tasks.split("task the-waiter ")[1].split("  task ")[0]
    assert waiter.startswith(waits_on_a_queue_name())
    assert "test_dump.py" in waiter  # the frame it is suspended in


def test_report_lists_the_tasks_of_the_loop_of_fausts_consumer_thread() -> None:
    """Faust runs aiokafka in a mode ``WorkerThread``, on its ``ServiceThread``'s loop."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def waits_in_the_thread(q: asyncio.Queue[int]) -> None:
        started.set()
        await q.get()

    tasks: list[asyncio.Task[None]] = []

    def start_thread() -> None:
        asyncio.set_event_loop(loop)
        tasks.append(loop.create_task(waits_in_the_thread(asyncio.Queue()), name="the-fetcher"))
        loop.run_forever()
        tasks[0].cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    service = SimpleNamespace(thread_loop=loop, _start_thread=start_thread)
    thread = WorkerThread(service, name="consumer-thread")  # type: ignore[arg-type]
    thread.start()
    try:
        assert started.wait(10)
        text = dump.report()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    tasks = text.split("tasks of the consumer-thread loop:")[1]
    assert "task the-fetcher " in tasks and "waits_in_the_thread" in tasks


def waits_on_a_queue_name() -> str:
    return "test_report_names_each_thread_and_each_task_where_it_waits.<locals>.waits_on_a_queue"


def test_sigusr1_logs_the_report(caplog: pytest.LogCaptureFixture) -> None:
    async def scene() -> None:
        dump.install(asyncio.get_running_loop())
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):
            if any("SIGUSR1" in r.getMessage() for r in caplog.records):
                return
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="neardup.kafka"):
        asyncio.run(scene())
    said = [r.getMessage() for r in caplog.records if "SIGUSR1" in r.getMessage()]
    assert said and "tasks of the main loop:" in said[0]


def test_the_callers_own_state_comes_first_and_a_failing_one_is_named() -> None:
    text = dump.report(lambda: "worker: pending=3")
    assert text.startswith("worker: pending=3\nthreads:")

    def broken() -> str:
        raise KeyError("gone")

    assert dump.report(broken).startswith("(KeyError('gone') while reporting more)\nthreads:")
