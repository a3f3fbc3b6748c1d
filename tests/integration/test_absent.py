"""``neardup.kafka.absent`` against a real broker: which offsets hold no message."""

from __future__ import annotations

import asyncio

import pytest

from neardup.kafka.absent import Absent
from tests.integration.helpers import Names, create_topics, produce

pytestmark = pytest.mark.integration


def test_the_broker_names_the_offsets_of_transaction_markers(kafka_bootstrap: str) -> None:
    topic = Names().raw
    create_topics(kafka_bootstrap, {topic: 1})
    pages = [f'{{"url": "https://a.example.cn/{i}"}}'.encode() for i in range(6)]
    # three transactions of two: records at 0-1, 3-4, 6-7; commit markers at 2, 5, 8
    produce(kafka_bootstrap, topic, pages, transaction=2)

    async def ask() -> tuple[object, ...]:
        absent = Absent(kafka_bootstrap, {})
        try:
            return (
                await absent.between(topic, 0, 0, 100),
                await absent.between(topic, 0, 3, 5),
                await absent.between(topic, 0, 9, 20),  # past the end: not written yet
            )
        finally:
            await absent.close()

    everything, middle, beyond = asyncio.run(ask())
    assert everything == [(2, 3), (5, 6), (8, 9)]
    assert middle == []
    assert beyond == []
