"""``python -m worker.kafka.tail`` against a real broker: a topic printed from its
beginning, every partition, without joining a consumer group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.helpers import Names, create_topics, produce

pytestmark = pytest.mark.integration


def _tail(bootstrap: str, names: Names, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "NEARDUP_BROKERS": bootstrap,
        "NEARDUP_APP_ID": names.app_id,
        "NEARDUP_TOPIC_DECISIONS": names.decisions,
    }
    return subprocess.run(
        [sys.executable, "-m", "worker.kafka.tail", *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tail_prints_every_partition_from_the_beginning(kafka_bootstrap: str) -> None:
    names = Names()
    create_topics(kafka_bootstrap, {names.decisions: 3})
    values = [f'{{"url": "https://a.example.cn/{i}", "n": {i}}}'.encode() for i in range(9)]
    produce(kafka_bootstrap, names.decisions, values)
    done = _tail(kafka_bootstrap, names, "--idle-s", "2")  # "decisions": the settings' name
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # keyed by URL (the helper's producer), so spread over the partitions
    assert sorted(lines) == sorted(
        f"https://a.example.cn/{i} | {v.decode()}" for i, v in enumerate(values)
    )
    assert done.stderr.strip().endswith(f"9 messages from {names.decisions}")
    # read again: nothing was committed, and the topic is read from its beginning again
    again = _tail(kafka_bootstrap, names, names.decisions, "--idle-s", "2")
    assert sorted(again.stdout.splitlines()) == sorted(lines)


def test_tail_of_a_topic_that_does_not_exist_says_so_and_creates_none(
    kafka_bootstrap: str,
) -> None:
    names = Names()
    done = _tail(kafka_bootstrap, names, names.raw, "--idle-s", "1")
    assert done.returncode == 1
    assert f"no topic '{names.raw}'" in done.stderr
    assert done.stdout == ""
    again = _tail(kafka_bootstrap, names, names.raw, "--idle-s", "1")
    assert again.returncode == 1  # still none: asking did not create it
