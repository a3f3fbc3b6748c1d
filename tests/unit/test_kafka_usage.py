"""What a new user of the worker meets first: its own help, the broker variable (named in
the error, exported by ``scripts/kafka-local.sh env``), and mode's timer warnings
explained."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neardup.kafka import timerlog
from neardup.kafka.__main__ import broker_errors, brokers_hint, command_of, main
from neardup.kafka.usage import MAIN_SETTINGS
from neardup.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["worker", "--help"], ["worker", "-h"]])
def test_the_help_is_the_workers_own_with_the_defaults_it_uses(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEARDUP_PARTITIONS", "not a number")  # help whatever the settings
    monkeypatch.delenv("NEARDUP_BROKERS", raising=False)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m neardup.kafka")
    for name, _ in MAIN_SETTINGS:
        default = Settings.model_fields[name].default
        shown = rf"^  NEARDUP_{name.upper()}={re.escape(str(default))}(  \(set here: .*\))?$"
        assert re.search(shown, out, re.MULTILINE), name
    assert "(set here: not a number)" in out and "docs/settings.md" in out
    # Faust's defaults the worker overrides are not shown
    for faust_default in ("{conf.name}-data", "[default: aio]", "[default: WARN]", "6066"):
        assert faust_default not in out


def test_no_command_is_a_usage_error_with_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "NEARDUP_BROKERS=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["worker"], "worker"),
        (["--loop", "aio", "worker", "-l", "info"], "worker"),
        (["-l", "debug", "--json", "tables"], "tables"),
        (["--loglevel=info", "worker"], "worker"),
        (["--version"], None),
    ],
)
def test_the_command_is_found_behind_faust_options(argv: list[str], command: str | None) -> None:
    assert command_of(argv) == command


def test_a_connection_error_names_the_variable_read_and_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka.errors import KafkaConnectionError

    monkeypatch.setenv("NEARDUP_BROKERS", "127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:2")
    with pytest.raises(SystemExit) as stopped, broker_errors(Settings()):
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")
    said = str(stopped.value.code)
    assert "NEARDUP_BROKERS=127.0.0.1:1 over PLAINTEXT: 127.0.0.1:1: Connection" in said
    assert "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:2 is set, but the worker reads" in said
    assert "\n" not in said


def test_the_hint_says_which_variable_is_read_when_another_is_set() -> None:
    assert brokers_hint({"NEARDUP_BROKERS": "h:1"}) == ""
    assert brokers_hint({"NEARDUP_BROKERS": "h:1", "KAFKA_BOOTSTRAP_SERVERS": "h:1"}) == ""
    unset = brokers_hint({"KAFKA_BOOTSTRAP_SERVERS": "h:2"})
    assert "NEARDUP_BROKERS is unset" in unset
    assert "KAFKA_BOOTSTRAP_SERVERS=h:2 is set, but the worker reads NEARDUP_BROKERS" in unset
    assert "KAFKA_BOOTSTRAP_SERVERS=h:2" in brokers_hint(
        {"NEARDUP_BROKERS": "h:1", "KAFKA_BOOTSTRAP_SERVERS": "h:2"}
    )


def test_the_scripts_env_sets_the_brokers_the_worker_reads(tmp_path: Path) -> None:
    """``eval "$(bash scripts/kafka-local.sh env)"``, then the worker's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NEARDUP_BROKERS", "KAFKA_BOOTSTRAP_SERVERS")
    }
    env.update(NEARDUP_KAFKA_PORT="29711", NEARDUP_KAFKA_DIR=str(tmp_path / "kafka"))
    read = "from neardup.settings import Settings; print(Settings().brokers)"
    script = f'eval "$(bash scripts/kafka-local.sh env)" && "{sys.executable}" -c "{read}"'
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "127.0.0.1:29711"


def test_the_first_timer_overlap_is_explained_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode's own timer, its run made longer than its interval with a clock of the test's."""
    from mode.timers import Timer

    monkeypatch.setattr(logging.getLogger(timerlog.TIMER_LOGGER), "filters", [])
    timerlog.explain_overlaps()
    timerlog.explain_overlaps()  # twice: still one filter
    now = [0.0]
    timer = Timer(1.0, name="commit", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, timerlog.TIMER_LOGGER):
        for _ in range(3):
            now[0] += timer.tick()  # asleep
            timer.on_before_yield()  # woke up: the run starts
            now[0] += 2.5  # a run of 2.5 s against an interval of 1 s
    said = [r.getMessage() for r in caplog.records if "overlapping" in r.getMessage()]
    assert len(said) == 2 and timer.overlaps == 2
    assert said[0].startswith("Timer commit is overlapping") and "nothing is lost" in said[0]
    assert timerlog.EXPLANATION not in said[1]
