"""The task assignor: whole tasks, balanced, sticky; and its aiokafka wiring (no broker)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from hypothesis import given
from hypothesis import strategies as st

from neardup.kafka.assignor import Task, decode_names, encode_names, plan, task_assignor

TOPICS = ("raw", "hosts", "pages")


def layout(counts: Mapping[str, int]) -> list[Task]:
    """Task i: partition i of every partitioned topic; ``order``: the 1-partition topic."""
    n = min(counts.get(t, 0) for t in TOPICS)
    tasks = [
        Task(
            f"task-{i}",
            tuple(TopicPartition(t, i) for t in TOPICS),
            TopicPartition("changelog", i),
        )
        for i in range(n)
    ]
    if "order" in counts:
        tasks.append(
            Task("order", (TopicPartition("order", 0),), TopicPartition("order-log", 0), "order")
        )
    return tasks


TASKS = layout({"raw": 8, "hosts": 8, "pages": 8, "order": 1})


def loads(dealt: dict[str, list[str]]) -> dict[str, int]:
    return {m: len(names) for m, names in dealt.items()}


def test_every_task_goes_to_one_member_and_the_counts_differ_by_one_at_most() -> None:
    dealt = plan(TASKS[:8], ["a", "b", "c"], {})
    names = [n for names in dealt.values() for n in names]
    assert sorted(names) == sorted(t.name for t in TASKS[:8])
    assert sorted(loads(dealt).values()) == [2, 3, 3]


def test_the_single_task_goes_to_the_least_loaded_member() -> None:
    dealt = plan(TASKS, ["a", "b", "c"], {})
    (holder,) = [m for m, names in dealt.items() if "order" in names]
    assert len(dealt[holder]) == 3  # its 2 partitioned tasks and order; the others 3 each
    assert sorted(loads(dealt).values()) == [3, 3, 3]


def test_the_single_task_leaves_a_member_that_has_more_than_its_share() -> None:
    tasks = [*TASKS[:7], TASKS[-1]]  # 7 partitioned tasks: a keeps 4, b gets 3
    previous = {"a": ["task-0", "task-1", "task-2", "task-3", "task-4", "order"]}
    dealt = plan(tasks, ["a", "b"], previous)
    assert "order" in dealt["b"]
    assert sorted(dealt["a"]) == ["task-0", "task-1", "task-2", "task-3"]


def test_with_loads_equal_the_single_task_stays() -> None:
    previous = {"b": ["order"]}
    assert "order" in plan(TASKS, ["a", "b"], previous)["b"]
    assert "order" in plan(TASKS, ["a", "b"], {"a": ["order"]})["a"]


def test_members_keep_their_tasks_when_one_joins() -> None:
    before = plan(TASKS, ["a", "b"], {})
    after = plan(TASKS, ["a", "b", "c"], before)
    moved = [n for m in ("a", "b") for n in before[m] if n not in after[m]]
    # c's share (3 of 9) is all that moves
    assert len(moved) == len(after["c"]) == 3
    assert sorted(loads(after).values()) == [3, 3, 3]


def test_a_member_that_leaves_hands_over_only_its_tasks() -> None:
    before = plan(TASKS, ["a", "b", "c"], {})
    after = plan(TASKS, ["a", "b"], {m: before[m] for m in ("a", "b")})
    for m in ("a", "b"):
        assert set(before[m]) <= set(after[m])
    assert sorted(loads(after).values()) == [4, 5]


def test_no_members_no_plan_and_more_members_than_tasks() -> None:
    assert plan(TASKS, [], {}) == {}
    dealt = plan(TASKS[:2], ["a", "b", "c", "d"], {})
    assert sorted(loads(dealt).values()) == [0, 0, 1, 1]


@given(
    n=st.integers(0, 20),
    members=st.sets(st.sampled_from("abcdefg"), min_size=1),
    seed=st.dictionaries(st.sampled_from("abcdefg"), st.lists(st.integers(0, 25), max_size=8)),
)
def test_whole_balanced_and_deterministic(
    n: int, members: set[str], seed: dict[str, list[int]]
) -> None:
    tasks = layout({"raw": n, "hosts": n, "pages": n, "order": 1})
    previous = {m: [f"task-{i}" for i in ids] for m, ids in seed.items()}
    dealt = plan(tasks, members, previous)
    names = [x for names in dealt.values() for x in names]
    assert sorted(names) == sorted(t.name for t in tasks)
    partitioned = [sum(x != "order" for x in names) for names in dealt.values()]
    assert max(partitioned) - min(partitioned) <= 1
    assert max(loads(dealt).values()) - min(loads(dealt).values()) <= 1
    assert plan(tasks, sorted(members, reverse=True), previous) == dealt


def test_user_data_round_trips_and_junk_reads_as_nothing() -> None:
    assert decode_names(encode_names(["task-1", "order"])) == ["order", "task-1"]
    for junk in (b"", b"\xff\x00", b'{"a": 1}', b"[1, 2]", None):
        assert decode_names(junk) == []


@dataclass
class Cluster:
    counts: dict[str, int]

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


def test_the_aiokafka_assignor_deals_whole_tasks_and_remembers_them() -> None:
    cls = task_assignor(layout)
    subscribed = [*TOPICS, "order"]
    cluster = Cluster({"raw": 4, "hosts": 4, "pages": 4, "order": 1})
    members = {
        "m1": ConsumerProtocolMemberMetadata(0, subscribed, encode_names(["task-3"])),
        "m2": ConsumerProtocolMemberMetadata(0, subscribed, b""),
    }
    out = cls.assign(cluster, members)
    assert set(out) == {"m1", "m2"}
    owned: dict[str, set[str]] = {}
    for member, assignment in out.items():
        tps = assignment.partitions()
        names = decode_names(assignment.user_data)
        owned[member] = set(names)
        want = {tp for t in layout(cluster.counts) if t.name in names for tp in t.inputs}
        assert set(tps) == want
    assert "task-3" in owned["m1"]
    assert sorted(len(v) for v in owned.values()) == [2, 3]
    cls.on_assignment(out["m1"])
    meta = cls.metadata(subscribed)
    assert decode_names(meta.user_data) == sorted(owned["m1"])
    # each runtime's class remembers its own member's tasks
    assert task_assignor(layout).owned == ()


@pytest.mark.parametrize("missing", ["pages", "order"])
def test_tasks_of_missing_topics_are_not_dealt(missing: str) -> None:
    counts = {"raw": 2, "hosts": 2, "pages": 2, "order": 1}
    del counts[missing]
    cls = task_assignor(layout)
    members = {"m": ConsumerProtocolMemberMetadata(0, [*TOPICS, "order"], b"")}
    out = cls.assign(Cluster(counts), members)
    assert all(tp.topic != missing for tp in out["m"].partitions())
