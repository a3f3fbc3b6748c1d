"""What mode's "Timer X is overlapping" warning means, said once in the worker's log.

mode runs each periodic task of Faust and of the worker (``commit``: offsets, every
NEARDUP_COMMIT_INTERVAL_MS; ``neardup.marks``, ``neardup.admit``, ``neardup.stamp``: every
NEARDUP_MARK_INTERVAL_MS) in a loop of its own: run the body, sleep the interval, again.
It warns when a run took longer than the interval, which happens whenever the event loop
is busy analysing pages or the broker is slow to answer a commit or a send: a loaded
worker, the normal case. The runs never overlap: the next one starts after the current
one ends, so the task just runs less often than asked. The first such warning is
completed with what it means and when to act; the later ones are left as mode's own.
"""

from __future__ import annotations

import logging

#: mode's logger, and the start of its message (``mode.timers.Timer.tick``).
TIMER_LOGGER = "mode.timers"
OVERLAP = "Timer %s is overlapping"

EXPLANATION = (
    "a periodic task took longer than its interval, the event loop busy with pages or the "
    "broker slow to answer; it runs less often, nothing is lost or repeated. No action "
    "needed unless the consumer lag keeps growing (the workers at capacity: add workers "
    "and partitions). Said once; later ones are mode's alone"
)


class _ExplainOverlap(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.said and str(record.msg).startswith(OVERLAP):
            self.said = True
            record.msg, record.args = f"{record.getMessage()}: {EXPLANATION}", ()
        return True


def explain_overlaps() -> None:
    """From now on, the first overlap warning carries its explanation (a filter on mode's
    logger, which Faust's logging set-up leaves in place)."""
    logger = logging.getLogger(TIMER_LOGGER)
    if not any(isinstance(f, _ExplainOverlap) for f in logger.filters):
        logger.addFilter(_ExplainOverlap())
