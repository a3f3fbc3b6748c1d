"""Records on internal topics that no version reads: each goes to the dead-letter topic,
the task goes on, and a page that waited for a lost record is given up rather than
holding every page behind it back."""

from __future__ import annotations

import json
import math
from typing import Any

from neardup.analysis import Analysed, for_decision, page_pid
from neardup.config import EngineConfig
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.flow.decide import DecideTask
from neardup.flow.upkeep import LOST_ORDER, lost_notice
from neardup.flow.watermark import key_bytes
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.tasks import Context, PartStep
from neardup.kafka.topology import Topics
from neardup.store import MemoryKV
from tests.corpus import analysed_page

CFG = EngineConfig(extract_timeout_s=0)
TOPICS = Topics("raw", "decisions", "merges", "rejects", "app-hosts", "app-probes",
                "app-pages", "app-order", "a-cl", "p-cl", "o-cl")  # fmt: skip
END: m.Key = (1 << 62, "")


def _page(story: str, minute: int) -> Analysed:
    a: Analysed = analysed_page(story, minute, CFG)
    return a


def _rec(topic: str, value: bytes | None, key: bytes | None = None, offset: int = 7) -> Record:
    return Record(topic, 0, offset, key, value, 1_000)


def _sent(sink: Sink, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [kv for (t, _), kvs in sink.pending.items() if t == topic for kv in kvs]


def test_an_unreadable_record_is_a_dead_letter_and_the_task_goes_on(tmp_path: Any) -> None:
    ctx = Context(CFG, TOPICS, 1, 1, order_wait=math.inf, mark_interval=1.0)
    step, kv, sink = PartStep(0, ctx), MemoryKV(), Sink()
    a = _page("rail", 1)
    page_in = codec.encode(m.PageIn((a.order, a.page.page_id), a))
    records = [
        _rec("app-hosts", b"\x07garbage", b"news.example.cn", offset=3),  # a PageIn cut short
        _rec("app-probes", None, a.page.page_id.encode(), offset=4),  # a tombstone
        _rec("app-pages", codec.encode(m.PageIn((1, "x"), a)), b"x", offset=5),  # wrong topic
        _rec("app-hosts", page_in, b"news.example.cn", offset=6),
        _rec("app-hosts", codec.encode(m.Mark(0, END, None)), b"", offset=8),
    ]
    step.on_records(records, kv, sink)

    dead = [json.loads(v or b"") for _, v in _sent(sink, "rejects")]
    assert [d["reason"] for d in dead] == ["internal"] * 3
    assert [d["detail"].split(" (")[0].split(": ")[0] for d in dead] == [
        "unreadable record at app-hosts[0]@3",
        "unreadable record at app-probes[0]@4",
        "unreadable record at app-pages[0]@5",
    ]
    assert "PageIn does not belong on a pages partition" in dead[2]["detail"]
    # the probe's and the pages record's pages are reported to their decide tasks
    notices = [codec.decode(v or b"") for _, v in _sent(sink, "app-pages")]
    lost = [n for n in notices if isinstance(n, m.Answer) and n.key[0] == LOST_ORDER]
    assert [n.key[1] for n in lost] == [a.page.page_id, "x"]
    # and the readable page after them went on: probes and its decision request
    assert _sent(sink, "app-probes")
    assert any(isinstance(n, m.ToDecide) for n in notices)
    assert ctx.tally.dead[("part", "unreadable")] == 3
    assert ctx.tally.stages[("hosts", "pages")] == 1


def test_a_page_whose_answer_was_lost_is_given_up_and_holds_nothing_back() -> None:
    task = DecideTask(MemoryKV(), CFG, 0, 1)
    a, b = _page("rail", 1), _page("library", 2)
    out: list[m.Out] = []
    for todo in (
        m.ToDecide((a.order, a.page.page_id), for_decision(a), 2, False),
        m.ToDecide((b.order, b.page.page_id), for_decision(b), 0, False),
    ):
        out += task.step(codec.encode(todo))
    out += task.step(codec.encode(m.Mark(0, END, None)))
    out += task.step(codec.encode(m.Answer((a.order, a.page.page_id), a.pid, (), ())))
    assert task.frontier() == (a.order, a.page.page_id)  # a waits for its second answer
    assert [json.loads(o.value)["page_id"] for o in out if o.topic == "decisions"] == [
        b.page.page_id
    ]

    notice = lost_notice(a.page.page_id, 1)
    out = task.step(notice.value)
    dead = [json.loads(o.value) for o in out if o.topic == "rejects"]
    assert [(d["page_id"], d["reason"], d["url"]) for d in dead] == [
        (a.page.page_id, "internal", a.page.url)
    ]
    assert task.frontier() == END and not task.pages  # nothing waits for a any more
    # its answer that comes after all is dropped, and so is a page of its id later
    assert task.step(codec.encode(m.Answer((a.order, a.page.page_id), a.pid, (), ()))) == []
    assert not task.pages
    again = m.ToDecide((a.order + 5, a.page.page_id), for_decision(a), 0, True)
    out = task.step(codec.encode(again))
    assert [o.topic for o in out] == ["rejects"]
    # a page that found it will read its record (it came with it), and not wait for ever
    assert task._records([a.pid])[0] is not None
    # and it all holds after a restart from the store
    again_task = DecideTask(task.store, CFG, 0, 1)
    assert a.pid in again_task.lost and not again_task.pages


def test_a_lost_edge_or_verdict_names_its_page() -> None:
    """The order topic's edges are keyed by their page's key, and verdicts by its id, so
    that either, lost, gives its page up."""
    from neardup.flow.order import OrderStep

    sent: list[tuple[str, int, bytes | None, bytes | None]] = []

    class Out:
        def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
            sent.append((topic, partition, key, value))

    bad: list[tuple[Any, m.WireError]] = []
    step = OrderStep(CFG, 1, "app-pages", 2, on_bad=lambda r, e, out: bad.append((r, e)))
    key = (5, "p")
    edge = m.Edge(key, 1, (m.EdgeMatch(2, 1, "q", "duplicate", 0, 1.0, 1.0, True),), ())
    records = [
        _rec("app-order", b"\x01\x01broken", key_bytes(key)),
        _rec("app-order", codec.encode(edge), key_bytes(key)),
        _rec("app-order", codec.encode(m.Mark(0, END, None)), b""),
    ]
    step.on_records(records, MemoryKV(), Out())  # type: ignore[arg-type]
    assert len(bad) == 1 and bad[0][0].key == key_bytes(key)
    verdicts = [(k, codec.decode(v or b"")) for _, _, k, v in sent]
    assert [k for k, v in verdicts if isinstance(v, m.Verdict)] == [b"p"]


def test_an_ask_for_the_record_of_a_page_whose_record_was_lost_is_answered_without_it() -> None:
    name = "lost-page"
    task = DecideTask(MemoryKV(), CFG, m.partition_of_pid(page_pid(name), 2), 2)
    asker = next(p for p in range(100) if m.partition_of_pid(p, 2) != task.partition)
    ask = m.SketchAsk((10, "asker"), asker, (page_pid(name),))
    assert task.step(codec.encode(ask)) == []  # its record is on its way: the ask waits
    out = task.step(lost_notice(name, 2).value)
    (reply,) = [codec.decode(o.value) for o in out if o.topic == m.PAGES]
    assert isinstance(reply, m.SketchReply) and reply.asker == (10, "asker")
    assert reply.records == () and not task.asks
