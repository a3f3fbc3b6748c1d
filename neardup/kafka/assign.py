"""Fewer raw partitions for the worker that runs the sequencer.

Faust's assignor deals out each group of co-partitioned topics evenly: with 4 raw
partitions and 2 workers, 2 each. But one worker also runs the sequencer, whose single
partition every page passes through (ordering, the template filter, the decision and the
state writes of every page), so it has more to do than the others and the others wait
for it: measured on the dev pages with two pinned workers, the one with the sequencer
used 9.8 s of CPU and the other 5.2 s, idle for the last half of the run.

``lighten`` moves raw partitions, each with the partitions of every topic co-partitioned
with it (probes, records and their tables' changelogs), from that worker to the others,
one at a time, to the least loaded, while a move lowers the larger of the two loads. A
worker's load counts a raw partition as 1 and the sequencer as ``weight`` times the raw
partition count (the sequencer's CPU a page against the rest of a page's CPU on a worker:
``Settings.sequencer_weight``). Which worker decides what does not change: the sequencer
decides every page in the same order wherever the raw pages were analysed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from faust.assignor import PartitionAssignor

log = logging.getLogger("neardup.kafka")


def lighten(
    assignments: Mapping[str, Any],
    partitions_by_topic: Mapping[str, int],
    *,
    raw: str,
    sequencer: str,
    weight: float,
) -> list[tuple[int, str]]:
    """Move raw partitions off the client holding ``sequencer`` in ``assignments``
    (member id -> Faust ``ClientAssignment``, changed in place). A partition moves with
    its co-partitioned topics; a standby the new owner held of it goes to the old owner.
    Returns the moves: (raw partition, member id it went to)."""
    n = partitions_by_topic.get(raw, 0)
    if weight <= 0 or n < 2 or partitions_by_topic.get(sequencer, n) == n:
        return []  # the sequencer co-partitioned with the raw pages: nothing to weigh
    hosts = [c for c, a in assignments.items() if a.actives.get(sequencer)]
    if len(hosts) != 1 or len(assignments) < 2:
        return []
    host = hosts[0]
    group = sorted(t for t, k in partitions_by_topic.items() if k == n)
    load = {c: float(len(a.actives.get(raw, ()))) for c, a in assignments.items()}
    load[host] += weight * n
    moves: list[tuple[int, str]] = []
    while assignments[host].actives.get(raw):
        target = min((c for c in assignments if c != host), key=lambda c: (load[c], c))
        if load[target] + 1 >= load[host]:
            break
        partition = max(assignments[host].actives[raw])
        _move(assignments[host], assignments[target], partition, group)
        load[host] -= 1
        load[target] += 1
        moves.append((partition, target))
    return moves


def _move(src: Any, dst: Any, partition: int, topics: list[str]) -> None:
    for topic in topics:
        actives = src.actives.get(topic)
        if actives is None or partition not in actives:
            continue
        actives.remove(partition)
        dst.actives.setdefault(topic, []).append(partition)
        standbys = dst.standbys.get(topic)
        if standbys is not None and partition in standbys:  # the roles swap
            standbys.remove(partition)
            src.standbys.setdefault(topic, []).append(partition)


def assignor(raw: str, sequencer: str, weight: float) -> type[PartitionAssignor]:
    """Faust's assignor, with ``lighten`` applied to each assignment it makes."""

    class SequencerAwareAssignor(PartitionAssignor):
        def _global_table_standby_assignments(
            self, assignments: Any, partitions_by_topic: Any
        ) -> Any:
            moves = lighten(
                assignments, partitions_by_topic, raw=raw, sequencer=sequencer, weight=weight
            )
            if moves:
                log.info(
                    "raw partitions moved off the sequencer's worker (weight %g): %s",
                    weight,
                    ", ".join(f"{p} to {member}" for p, member in moves),
                )
            return super()._global_table_standby_assignments(assignments, partitions_by_topic)

    return SequencerAwareAssignor
