"""Tasks, and how the group deals them out: whole tasks to members.

A task owns input partitions (of one or several topics) that must be read by one process,
because one transactional producer commits the task's outputs, state changelog and input
offsets together. The app says which partitions make a task (a ``Layout``); the assignor
gives every member whole tasks, as evenly as it can, and each member keeps the tasks it
had where balance allows (its previous tasks travel in its join metadata), since a task
that moves must restore its state on the new member.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.coordinator.assignors.abstract import (  # type: ignore[import-untyped]
    AbstractPartitionAssignor,
)
from aiokafka.coordinator.protocol import (  # type: ignore[import-untyped]
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

log = logging.getLogger("neardup.kafka")


@dataclass(frozen=True)
class Task:
    """A unit of work with one producer, one store and its own input partitions.

    ``name`` is stable (the producer's transactional id is ``<app>-<name>``, and that is
    what fences a zombie owner); ``inputs`` and ``changelog`` are aiokafka
    ``TopicPartition``s; tasks of one ``group`` are balanced among themselves, and a
    group's leftover tasks go to the members with the fewest tasks in all."""

    name: str
    inputs: tuple[Any, ...]
    changelog: Any
    group: str = ""


#: The app's tasks, given the partition count of each subscribed topic that exists.
Layout = Callable[[Mapping[str, int]], Sequence[Task]]


def plan(
    tasks: Sequence[Task], members: Iterable[str], previous: Mapping[str, Collection[str]]
) -> dict[str, list[str]]:
    """Task names per member. In each group (the largest first) every member gets
    ``n // m`` or one more; a member first keeps the tasks it had (``previous``), one more
    than ``n // m`` only while no member has fewer tasks in all; the rest go one by one
    to the member with the fewest of the group, then the fewest in all, then the one that
    had it. Deterministic: the same input gives the same plan."""
    names = sorted(members)
    if not names:
        return {}
    dealt: dict[str, list[str]] = {m: [] for m in names}
    had = {t: m for m in names for t in previous.get(m, ())}
    groups: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        groups[task.group].append(task)
    for group in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        members_of = groups[group]
        base, extra = divmod(len(members_of), len(names))
        count = dict.fromkeys(names, 0)
        left: list[Task] = []
        for task in members_of:  # keeps, up to the base share
            owner = had.get(task.name)
            if owner is not None and count[owner] < base:
                dealt[owner].append(task.name)
                count[owner] += 1
            else:
                left.append(task)
        rest: list[Task] = []
        for task in left:  # keeps of one more, by members no busier than the others
            owner = had.get(task.name)
            at_base = [m for m in names if count[m] == base]
            if (
                extra > 0
                and owner in at_base
                and len(dealt[owner]) == min(len(dealt[m]) for m in at_base)
            ):
                dealt[owner].append(task.name)
                count[owner] += 1
                extra -= 1
            else:
                rest.append(task)
        for task in rest:
            owner = had.get(task.name)
            room = [m for m in names if count[m] < base]
            if not room:  # the leftover tasks: one more each for ``extra`` members
                room = [m for m in names if count[m] == base]
                extra -= 1
            if extra < 0:  # pragma: no cover - the counts above add up
                raise AssertionError("more tasks than shares")
            best = min(room, key=lambda m: (count[m], len(dealt[m]), m != owner, m))
            dealt[best].append(task.name)
            count[best] += 1
    return dealt


def encode_names(names: Iterable[str]) -> bytes:
    return json.dumps(sorted(names)).encode()


def decode_names(raw: bytes | None) -> list[str]:
    """Task names from a member's user data; none when it holds something else (an
    older member, another assignor)."""
    try:
        names = json.loads(raw or b"[]")
    except ValueError:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return []
    return names


def task_assignor(layout: Layout) -> type[Any]:
    """An assignor class (aiokafka's interface is class methods, so each runtime gets its
    own class, which remembers its member's tasks for the next join)."""

    class TaskAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "neardup-tasks"
        version = 0
        #: The task names this member was given last, sent with its next join.
        owned: tuple[str, ...] = ()

        @classmethod
        def assign(cls, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
            topics = sorted({t for m in members.values() for t in m.subscription})
            counts = {t: len(ps) for t in topics if (ps := cluster.partitions_for_topic(t))}
            tasks = [
                t
                for t in layout(counts)
                if all(tp.partition < counts.get(tp.topic, 0) for tp in t.inputs)
            ]
            previous = {m: decode_names(md.user_data) for m, md in members.items()}
            dealt = plan(tasks, members, previous)
            by_name = {t.name: t for t in tasks}
            out = {}
            for member, names in dealt.items():
                parts: dict[str, list[int]] = defaultdict(list)
                for name in names:
                    for tp in by_name[name].inputs:
                        parts[tp.topic].append(tp.partition)
                assignment = [(t, sorted(ps)) for t, ps in sorted(parts.items())]
                out[member] = ConsumerProtocolMemberAssignment(
                    cls.version, assignment, encode_names(names)
                )
            log.info("tasks dealt: %s", {m: sorted(n) for m, n in dealt.items()})
            return out

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> Any:
            return ConsumerProtocolMemberMetadata(
                cls.version, sorted(topics), encode_names(cls.owned)
            )

        @classmethod
        def on_assignment(cls, assignment: Any) -> None:
            cls.owned = tuple(decode_names(assignment.user_data))

    return TaskAssignor
