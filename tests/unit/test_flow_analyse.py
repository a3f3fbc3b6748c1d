"""The analyse task's stage (``neardup.flow.analyse``) and an analysed page's JSON
(``neardup.flow.analysed_wire``)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from neardup.analysis import Analysed, Stats, analyse
from neardup.config import EngineConfig
from neardup.contract import parse_raw
from neardup.flow.analyse import analyse_messages
from neardup.flow.analysed_wire import analysed_from_json, analysed_to_json
from neardup.records import Reason, Rejected
from tests.corpus import line
from tests.gold import gold_stream

CFG = EngineConfig()


@pytest.fixture(scope="module")
def gold() -> list[Analysed]:
    out = list(analyse_messages([line(m).encode() for m in gold_stream()[0][:20]], CFG, Stats()))
    assert all(isinstance(a, Analysed) for a in out)
    return out  # type: ignore[return-value]


def test_a_message_is_analysed_as_the_engine_analyses_its_page(gold: list[Analysed]) -> None:
    for msg, a in zip(gold_stream()[0], gold, strict=False):
        page = parse_raw(line(msg), CFG.max_bytes)
        assert not isinstance(page, Rejected)
        assert analyse(page, CFG) == a


def test_a_message_that_is_not_a_page_is_rejected_without_raising() -> None:
    stats = Stats()
    for raw, reason in (
        (None, Reason.BAD_JSON),
        (b"{", Reason.BAD_JSON),
        (b'{"url": "u"}', Reason.SCHEMA),
        (
            b'{"url": "https://a/x", "fetched_at": "2026-03-01T00:00:00Z", '
            b'"content_type": "text/html", "body_b64": "@@@"}',
            Reason.BAD_BASE64,
        ),
    ):
        [out] = analyse_messages([raw], CFG, stats)
        assert isinstance(out, Rejected) and out.reason is reason
    assert stats.pages == 4 and sum(stats.rejects.values()) == 4


def test_an_analysed_page_round_trips_without_its_body(gold: list[Analysed]) -> None:
    for a in gold:
        back = analysed_from_json(orjson.loads(orjson.dumps(analysed_to_json(a))))
        assert back.page.body == ""
        assert back == replace(a, page=back.page)  # every other field as it was
        assert back.page == replace(a.page, body="")


def test_json_that_is_not_an_analysed_page_is_a_value_error(gold: list[Analysed]) -> None:
    obj = analysed_to_json(gold[0])
    for bad in ({}, {**obj, "fps": {**obj["fps"], "sketch": "@@"}}, {**obj, "order": "x"}):
        with pytest.raises(ValueError, match="not an analysed page"):
            analysed_from_json(bad)
