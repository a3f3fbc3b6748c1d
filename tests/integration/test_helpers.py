"""The integration helpers that change a broker's topics, against a real broker."""

from __future__ import annotations

import pytest

from tests.integration.helpers import Names, create_topics, delete_topics, list_topics, wait_for

pytestmark = pytest.mark.integration


def test_delete_topics_removes_one_runs_topics_and_no_other(kafka_bootstrap: str) -> None:
    names, other = Names(), Names()
    mine = [names.raw, f"{names.prefix}-order", f"{names.prefix}-part-changelog"]
    # a name that only starts like the run's prefix, and another run's topic
    kept = [f"{names.prefix}x.raw", other.raw]
    create_topics(kafka_bootstrap, {t: 1 for t in mine + kept})
    wait_for(lambda: set(mine + kept) <= list_topics(kafka_bootstrap), 30, "the topics")

    assert delete_topics(kafka_bootstrap, names.prefix) == sorted(mine)

    wait_for(lambda: not set(mine) & list_topics(kafka_bootstrap), 30, "the topics to go")
    assert set(kept) <= list_topics(kafka_bootstrap)
    assert delete_topics(kafka_bootstrap, names.prefix) == []
    delete_topics(kafka_bootstrap, other.prefix)
    delete_topics(kafka_bootstrap, f"{names.prefix}x")


def test_delete_topics_takes_several_prefixes_and_remembers_every_names(
    kafka_bootstrap: str,
) -> None:
    from tests.integration.helpers import USED_PREFIXES

    first, second, other = Names(), Names(), Names()
    assert {first.prefix, second.prefix, other.prefix} <= USED_PREFIXES  # deleted at the end
    mine = [first.raw, f"{second.prefix}-probes"]
    create_topics(kafka_bootstrap, {t: 1 for t in [*mine, other.raw]})
    wait_for(lambda: {*mine, other.raw} <= list_topics(kafka_bootstrap), 30, "the topics")

    assert delete_topics(kafka_bootstrap, [first.prefix, second.prefix]) == sorted(mine)

    wait_for(lambda: not set(mine) & list_topics(kafka_bootstrap), 30, "the topics to go")
    assert other.raw in list_topics(kafka_bootstrap)
    assert delete_topics(kafka_bootstrap, []) == []
    delete_topics(kafka_bootstrap, other.prefix)
