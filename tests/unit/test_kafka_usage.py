"""What a new user of the worker meets first: its own help and options, the broker
variable (named in the error, exported by ``scripts/kafka-local.sh env``), and a fatal
error said in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neardup.kafka.__main__ import broker_errors, brokers_hint, fatal_message, main
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
    assert "NEARDUP_TOPOLOGY" not in out  # one topology: nothing to choose


def test_no_command_is_a_usage_error_with_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "NEARDUP_BROKERS=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["tables"], "no command 'tables': the one command is worker"),
        (["worker", "--loop", "aio"], "unrecognized arguments: --loop aio"),
        (["worker", "-l", "loud"], "argument -l/--loglevel: invalid choice: 'loud'"),
        (["worker", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_a_command_line_the_worker_does_not_take_is_a_usage_error(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m neardup.kafka worker") and said in err
    assert "Traceback" not in err


def test_the_version_is_neardups(capsys: pytest.CaptureFixture[str]) -> None:
    from neardup import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"neardup {__version__}\n"


@pytest.mark.parametrize(
    ("argv", "env_level", "level"),
    [
        (["worker"], "ERROR", "ERROR"),
        (["worker", "-l", "debug"], "ERROR", "DEBUG"),  # the command line wins
        (["-l", "warn", "worker"], "DEBUG", "WARNING"),
        (["worker", "--loglevel=CRIT"], "INFO", "CRITICAL"),
    ],
)
def test_the_worker_logs_at_the_level_asked_for(
    argv: list[str], env_level: str, level: str, tmp_path: Path
) -> None:
    """In a process of its own: ``logging.basicConfig`` sets the level only where no
    handler is installed yet, as in the worker, not under pytest."""
    script = (
        "import logging, sys\n"
        "from neardup.kafka import __main__ as entry\n"
        "entry.run_worker = lambda settings: print(logging.getLevelName("
        "logging.getLogger().level)) or 0\n"
        f"sys.exit(entry.main({argv!r}))\n"
    )
    env = {**os.environ, "NEARDUP_LOG_LEVEL": env_level, "NEARDUP_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False,
        env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == level


def test_a_log_file_that_cannot_be_written_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from neardup.kafka import __main__ as entry

    monkeypatch.setattr(entry, "run_worker", lambda settings: pytest.fail("started"))
    assert main(["worker", "-f", str(tmp_path / "no" / "such" / "dir" / "log")]) == 2
    assert "cannot write the log file" in capsys.readouterr().err


def test_a_fatal_error_is_one_line_that_says_what_to_do() -> None:
    locked = OSError("IO error: lock /s/part-0/LOCK: Resource temporarily unavailable")
    line = fatal_message(locked, "/s")
    assert "\n" not in line and "locked by another process" in line
    assert "NEARDUP_STATE_DIR" in line
    other = fatal_message(RuntimeError("disk on fire"), "/s")
    assert other.startswith("fatal: the worker stopped on RuntimeError: disk on fire")
    assert "read again at the next start" in other
    # state of another format, an instance id taken: what to do is in the error itself,
    # and a restart alone would not help
    from neardup.kafka.membership import InstanceFencedError
    from neardup.kafka.taskstate import StateFormatError

    for exc in (StateFormatError("task part-0: run the version that wrote it"),
                InstanceFencedError("give each worker an id of its own")):  # fmt: skip
        line = fatal_message(exc, "/s")
        assert line == f"fatal: {exc}" and "read again" not in line


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
