"""The watermark: items go on in key order once no source can send an earlier one; drained
sources, the wait for fresh marks, late items, and state that survives a reload."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.flow.messages import Key, Mark
from neardup.flow.watermark import Watermark, after, key_bytes, key_from_bytes
from neardup.store import MemoryKV


def _wm(sources: int = 2, **kw: object) -> tuple[Watermark, MemoryKV]:
    kv = MemoryKV()
    wm = Watermark(kv, b"w", sources, **kw)  # type: ignore[arg-type]
    wm.load()
    return wm, kv


def _keys(out: list[tuple[Key, bytes]]) -> list[Key]:
    return [k for k, _ in out]


@given(st.lists(st.tuples(st.integers(-(2**62), 2**62), st.text(max_size=8)), max_size=30))
def test_key_bytes_sort_like_keys(keys: list[Key]) -> None:
    assert sorted(keys) == [key_from_bytes(b) for b in sorted(key_bytes(k) for k in keys)]
    for k in keys:
        assert k < after(k) and not any(k < o < after(k) for o in keys)


def test_an_item_waits_until_every_source_is_past_it_or_drained() -> None:
    wm, _ = _wm()
    wm.add((10, "a"), b"A")
    wm.on_mark(Mark(0, (10, ""), None))
    assert wm.release() == []  # source 1 unheard of
    wm.add((10, "b"), b"B")
    wm.on_mark(Mark(1, (10, ""), None))
    assert wm.release() == []  # a tie: either source may still send order 10
    assert wm.blocking() == [0, 1]
    wm.on_mark(Mark(1, None, 5.0))  # drained, before anything arrived
    assert wm.blocking() == [0]
    wm.add((11, "c"), b"C")
    wm.on_mark(Mark(0, (11, ""), None))
    assert wm.release() == [((10, "a"), b"A"), ((10, "b"), b"B")]
    assert wm.blocking() == [0]  # (11, "c"): source 0 may still send order 11
    wm.on_mark(Mark(0, (12, ""), None))
    assert wm.release() == [((11, "c"), b"C")] and len(wm) == 0 and wm.late == 0


def test_ties_go_by_page_id_then_arrival() -> None:
    wm, _ = _wm(1)
    for page_id in ("p3", "p1", "p2", "p1"):
        wm.add((7, page_id), page_id.encode())
    wm.on_mark(Mark(0, (8, ""), None))
    assert _keys(wm.release()) == [(7, "p1"), (7, "p1"), (7, "p2"), (7, "p3")]


def test_a_source_past_an_item_releases_it_without_waiting_for_a_tie() -> None:
    """A frontier is a whole key: a source that promises nothing below (10, "b") lets
    (10, "a") go, with no later order needed."""
    wm, _ = _wm(1)
    wm.add((10, "a"), b"")
    wm.on_mark(Mark(0, (10, "a"), None))
    assert wm.release() == []
    wm.on_mark(Mark(0, (10, "b"), None))
    assert _keys(wm.release()) == [(10, "a")]


def test_late_items_are_released_at_once_and_counted() -> None:
    wm, _ = _wm(1)
    wm.add((30, "x"), b"")
    wm.on_mark(Mark(0, (31, ""), None))
    assert _keys(wm.release()) == [(30, "x")]
    assert wm.frontier() == (31, "")
    # not above the greatest key released: released at once, in arrival order
    for key in ((20, "late"), (5, "later"), (30, "x")):
        assert not wm.add(key, b"")
    wm.add((40, "y"), b"")
    assert wm.add((30, "y"), b"")  # below W (a source broke its promise), above (30, "x")
    assert _keys(wm.release()) == [(20, "late"), (5, "later"), (30, "x"), (30, "y")]
    assert wm.late == 3 and wm.released == (30, "y") and len(wm) == 1


def test_a_drained_mark_vouches_only_for_items_that_arrived_before_it_was_made() -> None:
    """A source dies right after it read new input; its last mark said it was drained.
    Items of other sources that arrive after that mark wait for a newer one."""
    wm, _ = _wm()
    wm.on_mark(Mark(0, (10, ""), 100.0))  # drained at t=100, then dies
    wm.add((50, "x"), b"", arrived=101.0)
    wm.on_mark(Mark(1, (60, ""), None))
    assert wm.release() == [] and wm.blocking() == [0]
    # the new owner of source 0 sends what it had read, then a drained mark
    wm.add((20, "y"), b"", arrived=112.0)
    wm.on_mark(Mark(0, (21, ""), 113.0))
    assert _keys(wm.release()) == [(20, "y"), (50, "x")]
    assert wm.late == 0


def test_with_a_skew_a_drained_mark_vouches_only_for_items_that_far_before_it() -> None:
    """The hosts stage's skew: source 0 has read all of its raw partition at 11, but a
    page of an earlier key may still be written there up to 2 s after one of source 1's
    went on; the item that came at 10 waits for a mark of 12 or later. A frontier past
    the item needs no skew."""
    wm, _ = _wm(skew=2.0)
    wm.add((50, "x"), b"", arrived=10.0)
    wm.on_mark(Mark(1, (60, ""), 10.0))
    wm.on_mark(Mark(0, None, 11.0))
    assert wm.release() == [] and wm.blocking() == [0]
    wm.add((40, "y"), b"", arrived=11.5)  # written late to raw partition 0, still in time
    wm.on_mark(Mark(0, (41, ""), 12.0))
    assert _keys(wm.release()) == [(40, "y"), (50, "x")] and wm.late == 0
    assert wm.drained_at() == 10.0  # passed on as made: downstream needs no skew
    wm.add((70, "z"), b"", arrived=13.0)
    wm.on_mark(Mark(0, (80, ""), None))
    wm.on_mark(Mark(1, (90, ""), None))
    assert _keys(wm.release()) == [(70, "z")]


def test_a_source_that_reads_again_is_not_drained_any_more() -> None:
    wm, _ = _wm()
    wm.on_mark(Mark(0, None, 100.0))
    wm.on_mark(Mark(0, (5, ""), None))  # its next mark: not drained
    wm.on_mark(Mark(1, (90, ""), None))
    wm.add((50, "x"), b"", arrived=99.0)
    assert wm.release() == [] and wm.blocking() == [0]


def test_an_item_waits_for_fresh_marks_only_so_long_then_the_last_ones_count() -> None:
    now = [101.0]
    wm, _ = _wm(wait=30.0, clock=lambda: now[0])
    wm.on_mark(Mark(0, (10, ""), 100.0))  # source 0's owner dies after this
    wm.add((50, "x"), b"", arrived=101.0)
    wm.on_mark(Mark(1, (60, ""), None))
    now[0] = 130.9
    assert wm.release() == [] and wm.blocking() == [0]
    now[0] = 131.0  # 30 s after it arrived: source 0's last mark is taken
    assert _keys(wm.release()) == [(50, "x")]
    # the item source 0 had read before it died comes late, and is counted
    assert not wm.add((20, "y"), b"", arrived=140.0)
    assert _keys(wm.release()) == [(20, "y")] and wm.late == 1


def test_the_wait_counts_again_from_a_load() -> None:
    """After a restart a pending item waits for fresh marks again: a crash may have cut
    off a source's step before an earlier item of it."""
    now = [100.0]
    wm, kv = _wm(wait=30.0, clock=lambda: now[0])
    wm.on_mark(Mark(0, (10, ""), 50.0))
    wm.on_mark(Mark(1, (60, ""), None))
    wm.add((50, "x"), b"X", arrived=90.0)
    assert wm.release() == []
    now[0] = 200.0
    wm.flush()  # the step committed: what is held is in the store
    again = Watermark(kv, b"w", 2, wait=30.0, clock=lambda: now[0])
    again.load()
    assert again.release() == [] and again.blocking() == [0]
    now[0] = 230.0
    assert again.release() == [((50, "x"), b"X")]


def test_a_frontier_never_goes_back() -> None:
    wm, _ = _wm(1)
    wm.on_mark(Mark(0, (10, ""), None))
    wm.on_mark(Mark(0, (4, ""), None))
    wm.on_mark(Mark(0, None, None))
    assert wm.w == (10, "")
    wm.add((9, "z"), b"")
    assert _keys(wm.release()) == [(9, "z")]


def test_the_frontier_is_the_watermark_or_past_the_last_key_released() -> None:
    wm, _ = _wm()
    assert wm.frontier() is None
    wm.on_mark(Mark(0, (10, ""), None))
    assert wm.frontier() is None  # source 1 promised nothing
    wm.add((30, "a"), b"")
    wm.on_mark(Mark(1, None, math.inf))  # drained (ever after)
    wm.on_mark(Mark(0, (31, ""), None))
    assert _keys(wm.release()) == [(30, "a")]
    assert wm.w is None and wm.frontier() == after((30, "a"))
    wm.on_mark(Mark(1, (50, ""), None))
    assert wm.frontier() == (31, "")


def test_state_survives_a_reload_and_pending_items_keep_their_payloads() -> None:
    wm, kv = _wm(3)
    wm.on_mark(Mark(0, (10, "a"), None))
    wm.on_mark(Mark(1, None, 7.5))
    wm.on_mark(Mark(2, (3, ""), None))
    for i, key in enumerate([(5, "q"), (2, "r"), (12, "s"), (5, "q")]):
        wm.add(key, f"payload {i}".encode(), arrived=float(i))
    assert _keys(wm.release()) == [(2, "r")]
    wm.flush()  # the step committed: what is held is in the store
    again = Watermark(kv, b"w", 3)
    again.load()
    assert (again.w, again.released, len(again)) == (wm.w, wm.released, 3)
    again.on_mark(Mark(2, (20, ""), None))
    assert again.release() == [((5, "q"), b"payload 0"), ((5, "q"), b"payload 3")]
    again.add((5, "q"), b"new")  # its arrival number follows the loaded ones'
    assert _keys(again.release()) == [(5, "q")] and again.late == 1
    assert sorted(kv.data) == sorted(
        [b"wr", *(b"ws" + s.to_bytes(4, "big") for s in range(3)), *_pending(kv)]
    )
    assert len(_pending(kv)) == 1  # (12, "s")


def _pending(kv: MemoryKV) -> list[bytes]:
    return [k for k in kv.data if k.startswith(b"wp")]


def test_a_load_finds_late_items_late_and_others_pending() -> None:
    wm, kv = _wm(1)
    wm.on_mark(Mark(0, (10, ""), None))
    wm.add((6, "a"), b"A")
    assert _keys(wm.release()) == [(6, "a")]
    assert not wm.add((4, "late"), b"L")  # not released before the step was committed
    assert wm.add((8, "b"), b"B")  # nor this one, which is in order
    wm.add((11, "c"), b"C")
    wm.flush()  # the step committed: what is held is in the store
    again = Watermark(kv, b"w", 1)
    again.load()
    assert again.release() == [((4, "late"), b"L"), ((8, "b"), b"B")] and again.late == 1


def test_waiting_counts_from_the_release_before_or_the_load_not_the_arrival() -> None:
    now = [100.0]
    wm, kv = _wm(1, clock=lambda: now[0])
    for order in (1, 2):
        wm.add((order, "p"), b"", arrived=100.0)
    assert wm.waiting() == 0.0
    now[0] = 150.0
    assert wm.waiting() == 50.0
    wm.on_mark(Mark(0, (2, ""), None))
    assert _keys(wm.release()) == [(1, "p")]
    now[0] = 170.0
    assert wm.waiting() == 20.0  # since the release before it
    wm.flush()  # the step committed: what is held is in the store
    again = Watermark(kv, b"w", 1, clock=lambda: now[0])
    again.load()
    now[0] = 175.0
    assert again.waiting() == 5.0  # since the load


@st.composite
def _streams(draw: st.DrawFn) -> tuple[int, list[list[tuple[str, object]]]]:
    """Each source's messages in its order: items of non-decreasing order, each followed
    at some point by a mark of the greatest order sent so far; a drained mark last."""
    n = draw(st.integers(1, 4))
    streams = []
    for s in range(n):
        orders = sorted(draw(st.lists(st.integers(0, 20), max_size=8)))
        msgs: list[tuple[str, object]] = []
        for i, order in enumerate(orders):
            msgs.append(("item", (order, f"s{s}-{i}")))
            if draw(st.booleans()):
                msgs.append(("mark", Mark(s, (order, ""), None)))
        msgs.append(("mark", Mark(s, (orders[-1], "") if orders else None, math.inf)))
        streams.append(msgs)
    return n, streams


@settings(max_examples=200, deadline=None)
@given(_streams(), st.randoms(use_true_random=False))
def test_any_interleaving_releases_every_item_once_in_key_order(
    drawn: tuple[int, list[list[tuple[str, object]]]], rng: random.Random
) -> None:
    n, streams = drawn
    wm, kv = _wm(n)
    heads = [0] * n
    out: list[Key] = []
    while any(h < len(s) for h, s in zip(heads, streams, strict=True)):
        s = rng.choice([i for i in range(n) if heads[i] < len(streams[i])])
        kind, value = streams[s][heads[s]]
        heads[s] += 1
        if kind == "item":
            assert isinstance(value, tuple)
            assert wm.add(value, repr(value).encode())
        else:
            assert isinstance(value, Mark)
            wm.on_mark(value)
        if rng.random() < 0.2:  # a restart between steps
            wm.flush()  # the step committed: what is held is in the store
            wm = Watermark(kv, b"w", n)
            wm.load()
        out += _keys(wm.release())
    every = sorted(v for msgs in streams for k, v in msgs if k == "item")  # type: ignore[type-var]
    assert out == every and wm.late == 0 and len(wm) == 0


def test_an_item_let_go_before_the_commit_never_reaches_the_store() -> None:
    # the ordered step holds an edge only until the marks behind it come, often in the
    # same batch: written and deleted, it would cost two store writes and a changelog
    # record for nothing
    wm, kv = _wm(1)
    written: list[bytes] = []
    put = kv.put_many

    def recording(items: object) -> None:
        pairs = list(items)  # type: ignore[call-overload]
        written.extend(k for k, _ in pairs)
        put(pairs)

    kv.put_many = recording  # type: ignore[method-assign]
    wm.add((5, "a"), b"gone at once")
    wm.add((9, "b"), b"still held")
    wm.on_mark(Mark(0, (7, ""), None))
    assert _keys(wm.release()) == [(5, "a")]
    wm.flush()
    held = [k for k in written if k.startswith(b"wp")]
    assert len(held) == 1 and b"b" in held[0]


def test_a_later_mark_that_is_not_drained_takes_back_nothing_an_earlier_one_vouched() -> None:
    # an analyse task drained at 10 s, then busy again at the same frontier (nothing new
    # sent): both marks read in one batch still let go what came before 10 s
    wm, _ = _wm(1)
    wm.add((5, "a"), b"x", arrived=8.0)
    wm.on_mark(Mark(0, (3, ""), 10.0))
    wm.on_mark(Mark(0, (3, ""), None))
    assert _keys(wm.release()) == [(5, "a")]
    # a new frontier is news: what came before the old drained mark waits again
    wm.add((9, "b"), b"y", arrived=9.0)
    wm.on_mark(Mark(0, (6, ""), None))
    assert wm.release() == []


def test_an_item_added_decoded_is_not_decoded_again_but_one_restored_is() -> None:
    wm, kv = _wm(1, cached=2)
    decoded: list[bytes] = []

    def decode(raw: bytes) -> str:
        decoded.append(raw)
        return raw.decode()

    for name in "abc":  # the third is beyond the two kept decoded
        wm.add((10, name), name.upper().encode(), msg=f"msg {name}")
    wm.on_mark(Mark(0, (10, "b"), None))
    assert wm.release_decoded(decode) == [((10, "a"), "msg a", b"A")]  # (at hand: fresh)
    wm.flush()  # b and c into the store
    wm.on_mark(Mark(0, (11, ""), None))
    # b comes back as it was given, its payload not read back; c is decoded from the store
    assert wm.release_decoded(decode) == [((10, "b"), "msg b", None), ((10, "c"), "C", b"C")]
    assert decoded == [b"C"] and list(kv.scan(b"wp")) == []


def test_items_restored_by_load_are_decoded_at_release() -> None:
    wm, kv = _wm(1)
    wm.add((10, "a"), b"A", msg="kept in memory only")
    wm.flush()
    again = Watermark(kv, b"w", 1)
    again.load()
    again.on_mark(Mark(0, (11, ""), None))
    assert again.release_decoded(bytes.decode) == [((10, "a"), "A", b"A")]
    assert list(kv.scan(b"wp")) == []
