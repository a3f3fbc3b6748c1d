"""A worker: one consumer in the group, the tasks it was dealt, the loop that steps them
and commits (``neardup.kafka.delivery``), and what a rebalance does to them.

A task has at most one transaction in flight, and the loop goes on fetching and stepping
the other tasks while it commits. Records that come for a task meanwhile are held, and
stepped once the commit has ended, into the next transaction, which starts as soon as it
may (``Config.commit_min_ms``): at a low rate small transactions with little delay, under
load everything that came during a commit in one. Nothing is stepped on top of a commit
in flight, so a commit that fails leaves nothing to undo but itself.

The consumer reads with ``isolation_level="read_committed"`` and commits nothing itself
(each task's offsets go into its transaction). The group's assignor
(``neardup.kafka.assignor``) deals whole tasks. On revocation, before the rebalance
completes, each revoked task commits what it has done (or aborts it) and closes its
producer; each task assigned is then opened by the loop, its inputs paused meanwhile: it
starts its producer, restores its store and seeks to the group's committed offsets. The
protocol is eager: a rebalance revokes every task.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from neardup.kafka.assignor import Layout, Task, task_assignor
from neardup.kafka.delivery import (
    Config,
    FencedError,
    ProducerBrokenError,
    StepFactory,
    TaskRunner,
    quiet_fenced,
)
from neardup.kafka.membership import InstanceFencedError, StaticMember
from neardup.store import StateError

log = logging.getLogger("neardup.kafka")


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.rt.revoke(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.rt.assign(set(assigned))


class Runtime:
    """The worker: one consumer, the tasks it was dealt, the loop that steps and commits."""

    def __init__(self, cfg: Config, layout: Layout, factory: StepFactory) -> None:
        self.cfg, self.layout, self.factory = cfg, layout, factory
        self.tasks: dict[str, TaskRunner] = {}
        #: Tasks dealt to this worker that are not open, and when to try again.
        self.waiting: dict[str, tuple[Task, float]] = {}
        #: Tasks paused after a failure, and when to resume them.
        self.paused: dict[str, float] = {}
        #: Tasks whose inputs are paused until their commit in flight ends: they hold
        #: enough records for the next one, and the rest waits in Kafka (backpressure).
        self.held_back: set[str] = set()
        self.lock = asyncio.Lock()
        self.restore_lock = asyncio.Lock()
        self.generation = 0
        #: The fetch the loop waits for, if any (``stop`` ends it).
        self.fetching: asyncio.Future[Any] | None = None
        self.stopping = False
        #: What stops the worker (a store it cannot open or write, its instance id taken
        #: by another worker), raised by ``run``.
        self.fatal: StateError | InstanceFencedError | None = None
        self.records = 0
        self.commit_seconds: deque[float] = deque(maxlen=100_000)
        #: Records committed to each output topic by this worker's tasks.
        self.published: Counter[str] = Counter()
        kw = {"bootstrap_servers": cfg.bootstrap, "enable_auto_commit": False}
        kw |= {"isolation_level": "read_committed", **cfg.client}
        self.member: StaticMember | None = None
        if cfg.group_instance_id:
            self.member = StaticMember(cfg.app, cfg.group_instance_id, cfg.bootstrap, cfg.client)
        self.consumer = AIOKafkaConsumer(
            group_id=cfg.app,
            auto_offset_reset=cfg.auto_offset_reset,
            partition_assignment_strategy=(task_assignor(layout),),
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=max(cfg.session_timeout_ms // 5, 100),
            **kw,
            **(self.member.kwargs if self.member else {}),
        )
        self.reader = AIOKafkaConsumer(group_id=None, **kw)

    async def start(self) -> None:
        # A task keeps many small objects for long (the order task's union-find nodes,
        # items held behind a watermark), which the collector's default thresholds walk
        # again and again: 15% of the order task's CPU. Cycles are rare in a step's
        # garbage, so collecting less often costs little memory.
        gc.set_threshold(50_000, 20, 20)
        asyncio.get_running_loop().set_exception_handler(quiet_fenced)
        await self.reader.start()
        await self.consumer.start()
        self.consumer.subscribe(list(self.cfg.topics), listener=_Listener(self))

    def stop(self) -> None:
        """Finish the current batch, commit every task and leave (safe from a signal)."""
        self.stopping = True
        if self.fetching is not None:  # in a rebalance, a fetch waits for its end
            self.fetching.cancel()

    async def run(self) -> None:
        while not self.stopping:
            generation = self.generation
            try:
                batch = await self._fetch()
            except KafkaError as exc:  # the broker away, a rebalance: fetch again
                log.warning("fetch failed: %r", exc)
                await asyncio.sleep(self.cfg.tick_ms / 1000)
                continue
            async with self.lock:
                if generation != self.generation:
                    # fetched across a rebalance: maybe from before a task's seek, maybe
                    # after it; read it all again from where each task is
                    for runner in self.tasks.values():
                        runner.drop_held()
                        for tp, offset in runner.next.items():
                            self.consumer.seek(tp, offset)
                    continue
                await self._turn(batch)
        async with self.lock:
            for runner in list(self.tasks.values()):
                await self._close(runner)
        if self.fatal is not None:
            raise self.fatal

    async def close(self) -> None:
        # tasks still open after ``run`` raised: their producers stopped, nothing committed
        for runner in list(self.tasks.values()):
            self.tasks.pop(runner.task.name, None)
            if runner.committing is not None:
                runner.committing.cancel()
                await asyncio.wait([runner.committing])
                runner.committing = None
            try:
                await runner.close()
            except Exception as exc:  # the store that failed: said already
                log.debug("task %s: closing it failed: %r", runner.task.name, exc)
        if self.member is not None:
            await self.member.release()  # a replaced member's rejoin, never sent (``revoke``)
        await self.consumer.stop()
        await self.reader.stop()

    async def _fetch(self) -> Mapping[Any, Sequence[Any]]:
        """Records fetched within ``_wait_ms``; nothing, sooner, when a commit in flight
        ends first (its task may have records held, or more to commit)."""
        fetch = asyncio.ensure_future(
            self.consumer.getmany(timeout_ms=self._wait_ms(), max_records=self.cfg.max_records)
        )
        self.fetching = fetch
        try:
            commits = [r.committing for r in self.tasks.values() if r.committing is not None]
            await asyncio.wait([fetch, *commits], return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done():
                # getmany takes records from the fetcher's buffer only as it returns them:
                # cancelled while it waits, it has taken none
                fetch.cancel()
                await asyncio.wait([fetch])
                if fetch.cancelled():
                    return {}
            if fetch.cancelled():  # by ``stop``
                return {}
            result: Mapping[Any, Sequence[Any]] = fetch.result()
            return result
        finally:
            if not fetch.done():
                fetch.cancel()

    def _wait_ms(self) -> int:
        """Up to a tick, but no later than the first commit due (a task whose commit is in
        flight wakes the loop when that ends)."""
        wait = self.cfg.tick_ms / 1000
        now = time.monotonic()
        for r in self.tasks.values():
            if r.committing is None and r.held:
                return 0
            if r.committing is None and r.pending:
                wait = min(wait, r.last_commit + self.cfg.commit_min_ms / 1000 - now)
        return max(int(wait * 1000), 0)

    async def _turn(self, batch: Mapping[Any, Sequence[Any]]) -> None:
        """One round of the loop: take the ended commits' outcomes, resume and open what is
        due, step ``batch`` and begin the commits due."""
        for runner in list(self.tasks.values()):
            if runner.committing is not None and runner.committing.done():
                await self._settle(runner)
        await self._resume()
        await self._step(batch)

    async def _step(self, batch: Mapping[Any, Sequence[Any]]) -> None:
        for runner in list(self.tasks.values()):
            kv = runner.kv
            assert kv is not None
            runner.feed(batch)
            if runner.committing is not None:
                # what it was fed waits for the commit to end
                if runner.holds_enough() and runner.task.name not in self.held_back:
                    self.held_back.add(runner.task.name)
                    self.consumer.pause(*runner.task.inputs)
                continue
            at = "tick"
            try:
                while runner.held:
                    chunk = runner.take(runner.chunk_size())
                    at = f"{chunk[0].topic}[{chunk[0].partition}]@{chunk[0].offset}"
                    began = time.perf_counter()
                    runner.step.on_records(chunk, kv, runner.out)
                    runner.timed(len(chunk), time.perf_counter() - began)
                    runner.stepped(chunk)
                    self.records += len(chunk)
                    if runner.held and runner.due(time.monotonic(), mid_batch=True):
                        self._begin(runner)  # the rest waits for it
                        break
                    # between chunks, the group heartbeats and the other tasks' commits in
                    # flight go on (a chunk is sized to take about ``chunk_seconds``)
                    await asyncio.sleep(0)
                else:
                    now, at = time.monotonic(), "tick"
                    if now - runner.last_tick >= self.cfg.tick_ms / 1000:
                        runner.last_tick = now
                        caught_up, as_of = await self._caught_up(runner)
                        runner.step.on_tick(as_of, kv, runner.out, caught_up)
            except StateError as exc:  # a replay would meet it again: the worker stops
                raise type(exc)(f"task {runner.task.name}: {exc}") from exc
            except Exception:
                log.exception("task %s failed at %s", runner.task.name, at)
                self._rewind(runner)
        for runner in self.tasks.values():
            if runner.due(time.monotonic(), mid_batch=False):
                self._begin(runner)

    async def _caught_up(self, runner: TaskRunner) -> tuple[bool, float]:
        """Whether the task has read every input up to its last stable offset, and the
        time, taken before the read of those offsets: a drained mark made with it vouches
        only for what was written before then."""
        caught_up, as_of = True, time.time()
        for tp in runner.task.inputs:
            lso = self.consumer.last_stable_offset(tp)
            # the position, not the runner's next offset: it is past transaction markers
            position = await self.consumer.position(tp)
            if lso is None or position < lso:
                caught_up = False
            elif position > runner.next[tp]:
                # every record below it was handed to the task (none is held: it ticks
                # only then): the offset committed next passes the transaction markers
                # after its last record too
                runner.next[tp] = runner.fed[tp] = position
        if not caught_up:
            return False, as_of
        # the stable offsets above came with the last fetch of each partition, which may be
        # seconds old on a busy worker: asked again, so that ``as_of`` is no later than them
        as_of = time.time()
        try:
            stable = await self.consumer.end_offsets(list(runner.task.inputs))
        except KafkaError:  # the broker away: not known to be caught up
            return False, as_of
        for tp in runner.task.inputs:
            if await self.consumer.position(tp) < stable[tp]:
                return False, as_of
        return True, as_of

    def _begin(self, runner: TaskRunner) -> None:
        """Start committing what ``runner`` has stepped, in the background."""
        sizes: Counter[str] = Counter()
        for (topic, _), msgs in runner.out.pending.items():
            sizes[topic] += len(msgs)

        async def commit() -> tuple[float, Counter[str]]:
            return await runner.commit(self.cfg.app), sizes

        runner.committing = asyncio.ensure_future(commit())

    async def _commit(self, runner: TaskRunner, final: bool = False) -> bool:
        """Commit everything ``runner`` has stepped: the commit in flight, then the rest.
        False if a commit failed (the task is rewound or dropped)."""
        if not await self._settle(runner, final):
            return False
        if runner.pending:
            self._begin(runner)
            return await self._settle(runner, final)
        return True

    async def _settle(self, runner: TaskRunner, final: bool = False) -> bool:
        """Wait for ``runner``'s commit in flight, if any, and take its outcome; False if it
        failed (the task is rewound or dropped)."""
        job, runner.committing = runner.committing, None
        if job is None:
            return True
        if runner.task.name in self.held_back:  # paused again below if it failed
            self.held_back.discard(runner.task.name)
            self.consumer.resume(*runner.task.inputs)
        try:
            seconds, sizes = await job
            self.commit_seconds.append(seconds)
            self.published.update(sizes)
        except StateError:
            raise
        except FencedError as exc:
            log.warning("task %s fenced (%s): dropped, its new owner has it", runner.task.name, exc)
            await self._drop(runner, None if final else self.cfg.session_timeout_ms / 1000)
            return False
        except ProducerBrokenError:
            # opened again no sooner than a fenced task: a zombie must not fence the owner
            log.exception("task %s: its producer failed", runner.task.name)
            await self._drop(runner, None if final else self.cfg.session_timeout_ms / 1000)
            return False
        except Exception:
            log.exception("task %s: commit failed", runner.task.name)
            self._rewind(runner)
            return False
        runner.failures = 0
        return True

    async def _close(self, runner: TaskRunner) -> None:
        """Commit what the task has done, or abort it, and close it."""
        await self._commit(runner, final=True)
        if runner.task.name in self.tasks:
            await self._drop(runner, None)

    def _rewind(self, runner: TaskRunner) -> None:
        """Replay from the committed offsets, after a pause that doubles with each failure
        in a row (a step that fails on a record fails again on its replay)."""
        log.warning("task %s: replaying from %s", runner.task.name, runner.committed)
        runner.rewind(self.consumer)
        runner.failures += 1
        self.consumer.pause(*runner.task.inputs)
        self.paused[runner.task.name] = time.monotonic() + min(0.05 * 2**runner.failures, 10)

    async def _drop(self, runner: TaskRunner, retry_s: float | None) -> None:
        """Close a task. When ``retry_s`` is given and the group still has it here then, it
        is opened again: a fenced task whose transaction timed out has no other owner."""
        self.tasks.pop(runner.task.name, None)
        self.paused.pop(runner.task.name, None)
        await runner.close()
        if retry_s is not None:
            self.consumer.pause(*runner.task.inputs)
            self.waiting[runner.task.name] = (runner.task, time.monotonic() + retry_s)

    async def _resume(self) -> None:
        """Resume paused tasks and open waiting ones whose time has come."""
        now = time.monotonic()
        for name, when in list(self.paused.items()):
            if when <= now:
                del self.paused[name]
                if name in self.tasks:
                    self.consumer.resume(*self.tasks[name].task.inputs)
        ready = [task for task, when in self.waiting.values() if when <= now]
        for task in ready:
            del self.waiting[task.name]
        if ready:
            await self._open(ready)

    async def _open(self, tasks: Sequence[Task]) -> None:
        results = await asyncio.gather(
            *(
                TaskRunner.open(
                    t,
                    self.factory,
                    self.cfg,
                    consumer=self.consumer,
                    reader=self.reader,
                    restore_lock=self.restore_lock,
                )
                for t in tasks
            ),
            return_exceptions=True,
        )
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, TaskRunner):
                self.tasks[task.name] = result
                self.consumer.resume(*task.inputs)
            elif isinstance(result, StateError) or str(result).startswith("IO error"):
                # a store that cannot be opened or written (locked, a full disk): trying
                # again would only say so again
                # of its kind (state of another format says what to do itself)
                kind = type(result) if isinstance(result, StateError) else StateError
                self.fatal = self.fatal or kind(f"task {task.name}: {result}")
                self.stopping = True
            else:
                log.error("task %s did not open (%r): trying again", task.name, result)
                self.consumer.pause(*task.inputs)
                self.waiting[task.name] = (task, time.monotonic() + 1.0)

    async def revoke(self, revoked: set[Any]) -> None:
        async with self.lock:
            self.generation += 1
            for runner in list(self.tasks.values()):
                if revoked & set(runner.task.inputs):
                    await self._close(runner)
            self.waiting = {n: w for n, w in self.waiting.items() if not revoked & set(w[0].inputs)}
        # a static member revoked because another process took its instance id would take
        # it back by the rejoin that follows: it stops instead, and this never returns
        # (``neardup.kafka.membership``)
        if self.member is not None and (why := await self.member.replaced()):
            self.fatal = InstanceFencedError(why)
            self.stop()
            await self.member.park()

    async def assign(self, assigned: set[Any]) -> None:
        async with self.lock:
            self.generation += 1
            counts = {}
            for topic in self.cfg.topics:
                partitions = self.consumer.partitions_for_topic(topic)
                if partitions:
                    counts[topic] = len(partitions)
            for task in self.layout(counts):
                inputs = set(task.inputs)
                if inputs <= assigned and task.name not in self.tasks:
                    # opened by the loop (``_resume``), not in this callback: aiokafka
                    # sends no heartbeat until it returns, and restoring a store can take
                    # longer than the session timeout, which would drop the worker
                    self.consumer.pause(*task.inputs)
                    self.waiting[task.name] = (task, time.monotonic())
                elif inputs & assigned and not inputs <= assigned:
                    log.error(
                        "task %s was dealt in part (%s): not run", task.name, inputs & assigned
                    )
        if self.member is not None:
            await self.member.joined()


def run(cfg: Config, layout: Layout, factory: StepFactory) -> None:
    """Run a worker until SIGTERM or SIGINT, then commit, close and return. Everything it
    takes can be pickled when ``layout`` and ``factory`` are module-level, so a test can
    run it in a child process."""

    async def main() -> None:
        rt = Runtime(cfg, layout, factory)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, rt.stop)
        await rt.start()
        try:
            await rt.run()
        finally:
            await rt.close()

    asyncio.run(main())
