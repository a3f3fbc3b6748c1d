"""``python -m neardup.kafka.tail`` against a real broker: a topic printed from its
beginning, every partition, without joining a consumer group."""

from __future__ import annotations

import os
import signal
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
        [sys.executable, "-m", "neardup.kafka.tail", *args],
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


def test_tail_stops_quietly_on_ctrl_c_and_when_its_reader_goes(kafka_bootstrap: str) -> None:
    names = Names()
    create_topics(kafka_bootstrap, {names.decisions: 2})
    # 200 KB: more than a pipe holds, so a closed reader is seen by a write
    produce(kafka_bootstrap, names.decisions, [b'{"n": "%s"}' % (b"x" * 2000) for _ in range(100)])
    env = {
        **os.environ,
        "NEARDUP_BROKERS": kafka_bootstrap,
        "NEARDUP_TOPIC_DECISIONS": names.decisions,
    }
    # Python's own SIGINT handler even where the runner started us with SIGINT ignored
    launch = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['tail', '--idle-s', '60']; runpy.run_module('neardup.kafka.tail', "
        "run_name='__main__')"
    )
    argv = [sys.executable, "-c", launch]
    pipes = {"env": env, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    # Ctrl-C: exit 130, as neardup dedup, with no traceback
    proc = subprocess.Popen(argv, **pipes)  # type: ignore[call-overload]
    assert proc.stdout.readline()  # reading, then interrupted
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    # `| head -1`: the reader closes the pipe; not a broker failure, nothing said
    proc = subprocess.Popen(argv, **pipes)  # type: ignore[call-overload]
    assert proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=90) == 0
    assert proc.stderr.read() == b""
