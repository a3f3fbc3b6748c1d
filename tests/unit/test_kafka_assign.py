"""The assignor's weighing of the sequencer (``neardup.kafka.assign``), on Faust's own
assignment objects."""

from __future__ import annotations

from typing import Any

import pytest
from faust.assignor.client_assignment import ClientAssignment
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.kafka.assign import lighten

RAW, PROBES, BUCKETS = "raw", "app-probes", "app-buckets-changelog"
SEQ, STATE = "app-sequencer", "app-state-changelog"


def _even(members: int, n: int, host: int = 0, standbys: bool = False) -> dict[str, Any]:
    """Faust's even deal: raw partition p (with its co-partitioned topics) to member
    p % members, its standby to the next member; the sequencer and the state to ``host``."""
    out = {f"m{i}": ClientAssignment(actives={}, standbys={}) for i in range(members)}
    for i, a in enumerate(out.values()):
        mine = [p for p in range(n) if p % members == i]
        spare = [p for p in range(n) if standbys and (p + 1) % members == i and members > 1]
        for topic in (RAW, PROBES, BUCKETS):
            a.actives[topic] = list(mine)
            a.standbys[topic] = list(spare)
        a.actives[SEQ] = a.actives[STATE] = [0] if i == host else []
        a.standbys[SEQ] = a.standbys[STATE] = []
    return out


def _sizes(n: int) -> dict[str, int]:
    return {RAW: n, PROBES: n, BUCKETS: n, SEQ: 1, STATE: 1}


def _load(assignments: dict[str, Any], member: str, weight: float, n: int) -> float:
    a = assignments[member]
    return len(a.actives[RAW]) + (weight * n if a.actives[SEQ] else 0)


def test_two_workers_four_partitions_the_sequencers_worker_keeps_one() -> None:
    got = _even(2, 4, standbys=True)
    moves = lighten(got, _sizes(4), raw=RAW, sequencer=SEQ, weight=0.4)
    assert moves == [(2, "m1")]
    assert got["m0"].actives[RAW] == [0] and sorted(got["m1"].actives[RAW]) == [1, 2, 3]
    for topic in (PROBES, BUCKETS):  # the co-partitioned topics moved with it
        assert got["m0"].actives[topic] == [0]
        assert sorted(got["m1"].actives[topic]) == [1, 2, 3]
    # m1 held partition 2's standby: m0, which had it, holds it now
    assert 2 not in got["m1"].standbys[BUCKETS] and 2 in got["m0"].standbys[BUCKETS]
    assert got["m0"].actives[SEQ] == [0] and got["m1"].actives[SEQ] == []


@pytest.mark.parametrize(
    ("members", "n", "weight"),
    [(1, 4, 0.4), (2, 4, 0.0), (2, 1, 0.4), (3, 6, 0.4)],
)
def test_nothing_moves_without_a_reason(members: int, n: int, weight: float) -> None:
    got = _even(members, n)
    sizes = _sizes(n) if n > 1 else {RAW: 1, PROBES: 1, BUCKETS: 1, SEQ: 1, STATE: 1}
    moves = lighten(got, sizes, raw=RAW, sequencer=SEQ, weight=weight)
    if (members, n, weight) == (3, 6, 0.4):  # the one case here with something to move
        assert moves
    else:
        assert moves == []
        assert got == _even(members, n)


@settings(max_examples=200, deadline=None)
@given(
    members=st.integers(2, 6),
    n=st.integers(2, 24),
    host=st.integers(0, 5),
    weight=st.floats(0.05, 3.0),
    standbys=st.booleans(),
)
def test_every_partition_keeps_one_owner_and_the_largest_load_never_grows(
    members: int, n: int, host: int, weight: float, standbys: bool
) -> None:
    host %= members
    before = _even(members, n, host, standbys)
    got = _even(members, n, host, standbys)
    moves = lighten(got, _sizes(n), raw=RAW, sequencer=SEQ, weight=weight)
    for topic in (RAW, PROBES, BUCKETS):
        owners = sorted(p for a in got.values() for p in a.actives[topic])
        assert owners == list(range(n))
        for a in got.values():
            assert not set(a.actives[topic]) & set(a.standbys[topic])
        assert sum(len(a.standbys[topic]) for a in got.values()) == sum(
            len(a.standbys[topic]) for a in before.values()
        )
    for a in got.values():  # co-partitioned: the same partitions of each topic
        assert sorted(a.actives[RAW]) == sorted(a.actives[PROBES]) == sorted(a.actives[BUCKETS])
    largest = max(_load(before, m, weight, n) for m in before)
    assert max(_load(got, m, weight, n) for m in got) <= largest
    # moves go only off the sequencer's worker, and stop when one more would not help
    assert all(member != f"m{host}" for _, member in moves)
    others = [_load(got, m, weight, n) for m in got if m != f"m{host}"]
    if got[f"m{host}"].actives[RAW]:
        assert min(others) + 1 >= _load(got, f"m{host}", weight, n)
