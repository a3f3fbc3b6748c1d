"""A task store holding a message that does not decode stops the worker with one clear
line (``StateError``; the runtime adds the task's name): replayed, the step would meet
the same bytes again, forever."""

from __future__ import annotations

import math

import pytest

from neardup.config import EngineConfig
from neardup.flow import codec
from neardup.flow import messages as m
from neardup.flow.hosts import PREFIX
from neardup.flow.upkeep import TODO
from neardup.flow.watermark import key_bytes
from neardup.kafka.delivery import Out as Sink
from neardup.kafka.delivery import Record
from neardup.kafka.tasks import Context, CountedOrderStep, PartStep
from neardup.kafka.topology import Topics
from neardup.store import MemoryKV, StateError
from tests.corpus import analysed_page

CFG = EngineConfig(extract_timeout_s=0)
TOPICS = Topics("raw", "decisions", "merges", "rejects", "app-hosts", "app-probes",
                "app-pages", "app-order", "a-cl", "p-cl", "o-cl")  # fmt: skip
END: m.Key = (1 << 62, "")
GARBAGE = b"\x07garbage"  # no message of any version


def _ctx() -> Context:
    return Context(CFG, TOPICS, 1, 1, order_wait=math.inf, mark_interval=1.0)


def _rec(topic: str, value: bytes, key: bytes = b"", offset: int = 1) -> Record:
    return Record(topic, 0, offset, key, value, 1_000)


def _damage(kv: MemoryKV, prefix: bytes) -> bytes:
    """Spoil the payload of the one value under ``prefix`` (its arrival time kept)."""
    [(key, value)] = list(kv.scan(prefix))
    kv.put_many([(key, value[:8] + GARBAGE)])
    return key


def test_a_damaged_held_page_stops_the_part_task_with_a_readable_line() -> None:
    kv, sink = MemoryKV(), Sink()
    a = analysed_page("rail", 1, CFG)
    page_in = codec.encode(m.PageIn((a.order, a.page.page_id), a))
    PartStep(0, _ctx()).on_records([_rec("app-hosts", page_in, b"news.example.cn")], kv, sink)
    _damage(kv, b"h" + PREFIX + b"p")  # held behind the watermark: no mark came yet

    mark = _rec("app-hosts", codec.encode(m.Mark(0, END, None)), offset=2)
    with pytest.raises(StateError, match=r"a stored message of .* does not unpack"):
        PartStep(0, _ctx()).on_records([mark], kv, Sink())


def test_a_damaged_stored_page_stops_the_part_task_when_its_stages_load() -> None:
    kv = MemoryKV()
    kv.put_many([(b"d" + TODO + key_bytes((5, "x")), GARBAGE)])
    with pytest.raises(StateError, match=r"stored message .*damaged"):
        PartStep(0, _ctx()).on_tick(0.0, kv, Sink(), True)


def test_a_damaged_held_edge_stops_the_order_task() -> None:
    kv, ctx = MemoryKV(), _ctx()
    edge = m.Edge((5, "x"), 9, (), ())
    CountedOrderStep(ctx).on_records([_rec("app-order", codec.encode(edge), b"x")], kv, Sink())
    [(key, value)] = [(k, v) for k, v in kv.scan(b"") if v.endswith(codec.encode(edge))]
    kv.put_many([(key, value[:8] + GARBAGE)])

    mark = _rec("app-order", codec.encode(m.Mark(0, END, None)), offset=2)
    with pytest.raises(StateError, match=r"a stored message of .* does not unpack"):
        CountedOrderStep(ctx).on_records([mark], kv, Sink())
