"""What each task of a partitioned worker holds now, read from its step object: for each
watermark, what it holds back and why. ``/metrics`` (``neardup.kafka.endpoint``) sums it;
``SIGUSR1`` logs it (``log_tasks``), for an operator whose partition has stalled."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from neardup.flow.messages import Key
from neardup.flow.watermark import Watermark
from neardup.kafka.tasks import PartStep
from neardup.kafka.topology import ORDER_TASK, PART

log = logging.getLogger("neardup.kafka")


@dataclass(frozen=True, slots=True)
class Held:
    """One watermark of one task."""

    task: str
    #: The task's kind (``part``, ``order``) and the stage the watermark is in front of.
    kind: str
    stage: str
    #: Items held behind it.
    held: int
    w: Key | None
    released: Key | None
    #: The greatest key held, and the least (the next to go).
    newest: Key | None
    oldest: Key | None
    #: Each source's latest frontier; the sources that hold the next item back.
    fronts: dict[int, Key | None]
    blocking: list[int]
    #: Seconds the next item has held the partition back.
    waiting_s: float
    #: Items released late (after a later key had gone on), by this step object.
    late: int = 0

    @property
    def lag_s(self) -> float:
        """How far the watermark is behind the newest key held, in seconds of fetch time
        (0: nothing held; behind the greatest key released when no source has promised
        anything yet)."""
        below = self.w or self.released
        if self.newest is None or below is None:
            return 0.0
        return max(0.0, (self.newest[0] - below[0]) / 1000)


def _held(task: str, kind: str, stage: str, w: Watermark) -> Held:
    return Held(task, kind, stage, len(w), w.w, w.released, w.newest(), w.oldest(),
                w.fronts(), w.blocking(), w.waiting(), w.late)  # fmt: skip


def watermarks(tasks: dict[str, Any]) -> Iterator[Held]:
    """The watermarks of the runtime's tasks (``Runtime.tasks``: name to runner)."""
    for name, runner in sorted(tasks.items()):
        step, kind = runner.step, runner.task.group
        if kind == PART and isinstance(step, PartStep) and step.stages is not None:
            hosts, buckets, decide = step.stages
            yield _held(name, kind, "hosts", hosts.watermark)
            yield _held(name, kind, "buckets", buckets.watermark)
            yield _held(name, kind, "decide", decide.watermark)
        elif kind == ORDER_TASK and getattr(step, "task", None) is not None:
            yield _held(name, kind, "order", step.task.edges)


def pending_pages(tasks: dict[str, Any]) -> int:
    """Pages the decide tasks hold past their watermark: waiting for answers, records or
    a verdict."""
    steps = [runner.step for runner in tasks.values()]
    return sum(len(s.stages[2].pages) for s in steps if isinstance(s, PartStep) and s.stages)


def log_tasks(rt: Any) -> None:
    """Where the runtime ``rt`` is: its tasks, then a line a watermark, what it holds and
    what holds it."""
    views = list(watermarks(rt.tasks))
    log.info(
        "SIGUSR1: where the worker is: %d tasks open %s; paused after a failure: %s; "
        "dealt but not open: %s",
        len(rt.tasks),
        sorted(rt.tasks),
        sorted(rt.paused) or "none",
        sorted(rt.waiting) or "none",
    )
    for v in views:
        log.info(
            f"task state: {v.task} {v.stage}: {v.held} held (oldest {v.oldest}, newest "
            f"{v.newest}, {v.lag_s:.1f} s behind); W {v.w}, released {v.released}; sources' "
            f"frontiers {v.fronts}; held back by {v.blocking or 'nothing'} for "
            f"{v.waiting_s:.1f} s; {v.late} late"
        )
