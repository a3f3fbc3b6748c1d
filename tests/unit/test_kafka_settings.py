"""The worker's settings as the Kafka clients get them, its topics, and its start-up."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rocksdict import Options, Rdict, WriteBatch

from neardup.kafka import freshness, undo
from neardup.kafka.__main__ import RUNNING_MARKER, doubt_state, prepare_state, release_state
from neardup.kafka.security import (
    REDACTED,
    aiokafka_kwargs,
    describe,
    faust_credentials,
    install_log_redaction,
    secret_forms,
)
from neardup.kafka.topics import TopicNames
from neardup.settings import Settings


def test_sasl_ssl_reaches_the_clients_and_the_password_no_log(tmp_path: Path) -> None:
    settings = Settings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="neardup",
        sasl_password="s3cret-pw",  # type: ignore[arg-type]
    )
    kw = aiokafka_kwargs(settings)
    assert kw["security_protocol"] == "SASL_SSL"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "neardup" and kw["sasl_plain_password"] == "s3cret-pw"
    assert kw["ssl_context"] is not None
    creds = faust_credentials(settings)
    assert creds.protocol.value == "SASL_SSL" and creds.mechanism.value == "SCRAM-SHA-512"
    for text in (repr(settings), str(settings), repr(creds), settings.model_dump_json()):
        assert "s3cret-pw" not in text


def test_plaintext_has_no_credentials() -> None:
    settings = Settings()
    assert aiokafka_kwargs(settings) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(settings) is None


@pytest.mark.parametrize("topology", ["routed", "sequential"])
def test_the_sequencer_has_one_partition_and_routing_topics_follow_the_setting(
    topology: str,
) -> None:
    settings = Settings(partitions=6, app_id="nd", topology=topology)  # type: ignore[arg-type]
    names = TopicNames.of(settings)
    parts = names.partitions(settings)
    assert parts[names.sequence] == 1 and parts[names.raw] == 6
    assert (names.probes in parts) == (topology == "routed")
    assert set(names.fixed(settings)) <= set(parts)


def test_a_killed_worker_keeps_its_tables_less_what_the_changelog_may_lack(
    tmp_path: Path,
) -> None:
    tables = tmp_path / "v1" / "tables"
    db = Rdict(str(tables / "state-0.db"), Options(raw_mode=True))
    db[b"k"] = b"in the changelog"
    db[undo.OFFSET_KEY] = b"41"
    db.close()
    assert not prepare_state(str(tmp_path), str(tables))  # first start: nothing to fear
    assert (tmp_path / RUNNING_MARKER).exists()
    db = Rdict(str(tables / "state-0.db"), Options(raw_mode=True))
    batch = WriteBatch(raw_mode=True)  # as TableKV._write does; then killed before the flush
    batch.put(
        undo.next_key(),
        undo.encode(41, [b"k", b"new"], [b"in the changelog", None], [b"not sent"] * 2)[0],
    )
    batch.put(b"k", b"not sent")
    batch.put(b"new", b"not sent")
    db.write(batch)
    db.close()
    # killed: the marker stays, and the next start undoes the write, not the tables
    assert prepare_state(str(tmp_path), str(tables))
    db = Rdict(str(tables / "state-0.db"), Options(raw_mode=True))
    assert db.get(b"k") == b"in the changelog" and db.get(b"new") is None
    assert db.get(undo.OFFSET_KEY) == b"41"  # Faust's recovery reads on from offset 42
    db.close()
    release_state(str(tmp_path))  # a clean stop
    assert not (tmp_path / RUNNING_MARKER).exists()
    assert not prepare_state(str(tmp_path), str(tables))


@pytest.mark.parametrize("killed", [True, False])
def test_tables_last_caught_up_long_ago_are_restored_whole(tmp_path: Path, killed: bool) -> None:
    """Catching up from the changelog (after a kill: undoing first) relies on the
    changelog's tail, deletions included, and a compacted topic drops its tombstones a day
    after compacting them: a partition database last caught up longer ago than half that
    is removed, whether the worker was killed or stopped cleanly; the others stay."""
    tables = tmp_path / "v1" / "tables"
    for name in ("state-0.db", "buckets-0.db", "buckets-1.db"):
        db = Rdict(str(tables / name), Options(raw_mode=True))
        db[b"k"] = b"v"
        db.close()
    assert not prepare_state(str(tmp_path), str(tables))
    now = time.time()
    freshness.stamp(tables / "state-0.db", now - freshness.MAX_AGE_S - 60)  # a day away
    freshness.stamp(tables / "buckets-0.db", now - 60)  # held a minute ago
    # buckets-1.db has no stamp (a build from before stamps): judged by its files' mtimes
    if not killed:
        release_state(str(tmp_path))
    assert prepare_state(str(tmp_path), str(tables)) == killed

    def kept() -> list[str]:  # removed ones are left empty, for a restore from the start
        names = []
        for name in sorted(p.name for p in tables.iterdir()):
            db = Rdict(str(tables / name), Options(raw_mode=True))
            if db.get(b"k") is not None:
                names.append(name)
            db.close()
        return names

    assert kept() == ["buckets-0.db", "buckets-1.db"]
    long_ago = now - 45 * 60  # fresh by a day's tombstones, not by an hour's
    for f in (tables / "buckets-1.db").rglob("*"):
        os.utime(f, (long_ago, long_ago))
    release_state(str(tmp_path))
    # the limit is what the changelog topics really keep (read at start): an hour here
    assert not prepare_state(str(tmp_path), str(tables), max_age_s=freshness.max_age_s(3.6e6))
    assert kept() == ["buckets-0.db"]


def test_a_worker_that_stopped_with_its_tables_in_doubt_loses_them(tmp_path: Path) -> None:
    tables = tmp_path / "v1" / "tables"
    Rdict(str(tables / "state-0.db"), Options(raw_mode=True)).close()
    assert not prepare_state(str(tmp_path), str(tables))
    doubt_state(str(tmp_path))  # a failed local write, an inconsistency found
    assert prepare_state(str(tmp_path), str(tables))
    assert not tables.exists()
    release_state(str(tmp_path))
    assert not prepare_state(str(tmp_path), str(tables))
    assert not (tmp_path / "neardup-worker.discard").exists()  # once only


def test_tables_of_a_build_without_undo_records_are_not_trusted_after_a_kill(
    tmp_path: Path,
) -> None:
    tables = tmp_path / "v1" / "tables"
    Rdict(str(tables / "state-0.db"), Options(raw_mode=True)).close()
    (tmp_path / RUNNING_MARKER).write_text("1\n")  # killed, under an older build
    assert prepare_state(str(tmp_path), str(tables))
    assert not tables.exists()


def test_after_a_clean_stop_undo_records_left_are_dropped_not_undone(tmp_path: Path) -> None:
    tables = tmp_path / "v1" / "tables"
    Rdict(str(tables / "state-0.db"), Options(raw_mode=True)).close()
    assert not prepare_state(str(tmp_path), str(tables))
    db = Rdict(str(tables / "state-0.db"), Options(raw_mode=True))
    batch = WriteBatch(raw_mode=True)  # acknowledged, but its database closed first
    batch.put(undo.next_key(), undo.encode(3, [b"k"], [None], [b"v"])[0])
    batch.put(b"k", b"v")
    db.write(batch)
    db.close()
    release_state(str(tmp_path))
    assert not prepare_state(str(tmp_path), str(tables))
    db = Rdict(str(tables / "state-0.db"), Options(raw_mode=True))
    assert db.get(b"k") == b"v"
    assert not [k for k in db.keys(from_key=undo.UNDO_PREFIX) if k.startswith(undo.UNDO_PREFIX)]
    db.close()


def test_the_sandbox_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_MAX_MB", "512")
    monkeypatch.setenv("NEARDUP_ENGINE__MAX_TEXT_CHARS", "200000")
    monkeypatch.setenv("NEARDUP_ENGINE__TEMPLATE_IDLE_DAYS", "45")
    cfg = Settings().engine_config()
    assert (cfg.extract_timeout_s, cfg.extract_max_mb, cfg.max_text_chars) == (2.5, 512, 200000)
    assert cfg.template_idle_days == 45
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="extract_timeout_s"):
        Settings().engine_config()


def test_topics_the_worker_creates_take_its_largest_messages() -> None:
    from neardup.contract import max_line_bytes
    from neardup.kafka.topics import STATE_MAX_MESSAGE_BYTES, _configs

    settings = Settings(partitions=3)
    names = TopicNames.of(settings)
    fixed = names.fixed(settings)
    raw = int(_configs(names.raw, names, fixed, settings)["max.message.bytes"])
    assert raw > max_line_bytes(settings.engine.max_bytes) > 1 << 20
    assert _configs(names.sequence, names, fixed, settings) == {
        "max.message.bytes": str(STATE_MAX_MESSAGE_BYTES)
    }
    assert _configs(names.decisions, names, fixed, settings) == {}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    factory = logging.getLogRecordFactory()
    conn_filters = list(logging.getLogger("aiokafka.conn").filters)
    yield
    logging.setLogRecordFactory(factory)
    logging.getLogger("aiokafka.conn").filters[:] = conn_filters


def test_log_records_never_carry_the_password(
    restore_logging: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever logger writes it, as text, in arguments, as bytes, in a traceback; and
    aiokafka's DEBUG dump of the SASL PLAIN request."""
    secret = 'pä$$-w0rd"x'
    settings = Settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_username="u",
        sasl_password=secret,  # type: ignore[arg-type]
    )
    install_log_redaction(settings)
    install_log_redaction(settings)  # twice is harmless
    payload = ("u\x00u\x00" + secret).encode()
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("some.library").warning("config %s", {"password": secret})
        logging.getLogger("other").info(f"inline {secret}!")
        logging.getLogger("aiokafka.conn").debug(
            "Request to %s:%d %d: %s",
            "127.0.0.1",
            9092,
            3,
            f"SaslAuthenticateRequest_v1(sasl_auth_bytes={payload!r})",
        )
        logging.getLogger("other").debug("as bytes %r", secret.encode())
        try:
            raise RuntimeError(f"failed with {secret}")
        except RuntimeError:
            logging.getLogger("other").exception("boom")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(message)s"))
    for record in caplog.records:
        handler.handle(record)
    text = handler.stream.getvalue() + caplog.text
    assert len(caplog.records) == 5
    assert "Request to 127.0.0.1:9092 3: SaslAuthenticate (payload redacted)" in text
    assert REDACTED in text and "Traceback" in text
    for form in secret_forms(secret):
        assert form not in text, form
    assert "w0rd" not in text


def test_errors_about_settings_do_not_show_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARDUP_SASL_PASSWORD", "s3cret-pw-in-env")
    monkeypatch.setenv("NEARDUP_SASL_USERNAME", "neardup")
    monkeypatch.setenv("NEARDUP_PARTITIONS", "0")  # invalid: the whole object is refused
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert "partitions" in str(caught.value)
    assert "s3cret-pw-in-env" not in str(caught.value) + repr(caught.value)
    monkeypatch.setenv("NEARDUP_PARTITIONS", "2")
    settings = Settings(security_protocol="SASL_SSL")  # type: ignore[arg-type]
    assert settings.sasl_password is not None
    assert settings.sasl_password.get_secret_value() == "s3cret-pw-in-env"
    for text in (describe(settings), repr(settings), str(settings), settings.model_dump_json()):
        assert "s3cret-pw-in-env" not in text
    assert "as user 'neardup'" in describe(settings)


def test_topics_created_a_moment_ago_are_awaited_not_taken_for_the_wrong_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in CI under load: right after create_topics the broker described the new
    topics with an error and no partitions, and the worker refused to start, saying
    they had the wrong number of partitions (None, not 1)."""
    import asyncio

    import aiokafka.admin  # type: ignore[import-untyped]

    from neardup.kafka.topics import ensure_topics
    from neardup.settings import Settings

    settings = Settings(partitions=2)
    names = TopicNames.of(settings)
    wanted = names.fixed(settings)

    class Admin:
        described = 0

        def __init__(self, **kwargs: object) -> None:
            pass

        async def start(self) -> None:
            pass

        async def close(self) -> None:
            pass

        async def list_topics(self) -> list[str]:
            return []

        async def create_topics(self, topics: list[object]) -> None:
            pass

        async def describe_topics(self, topics: list[str]) -> list[dict[str, object]]:
            Admin.described += 1
            if Admin.described < 3:  # not yet known to the broker's metadata
                return [{"topic": t, "error_code": 3, "partitions": []} for t in topics]
            return [{"topic": t, "error_code": 0, "partitions": [0] * wanted[t]} for t in topics]

    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", Admin)
    created = asyncio.run(ensure_topics(settings, timeout_s=5))
    assert set(created) == set(names.partitions(settings)) and Admin.described == 3


def test_a_fatal_state_error_ends_the_worker_even_if_the_shutdown_hangs() -> None:
    """Seen in CI: after a full disk, Faust's shutdown hung in the consumer's stop, and the
    worker neither exited nor said why. ``exit_later`` exits 1, with the error, anyway."""
    import subprocess
    import sys

    hung = (
        "import logging, time\n"
        "from neardup.kafka.__main__ import exit_later\n"
        "logging.basicConfig()\n"
        "exit_later(RuntimeError('fatal: cannot write the state'), 0.3)\n"
        "time.sleep(30)\n"  # a shutdown that never ends
    )
    done = subprocess.run(
        [sys.executable, "-c", hung], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 1
    assert "fatal: cannot write the state (the shutdown hung for 0 s; exiting)" in done.stderr


def test_the_worker_help_touches_no_broker_and_no_state(tmp_path: Path) -> None:
    """``worker --help`` prints the worker's help and stops: it must not create topics
    (a broker that answers would get them) nor prepare the state directory."""
    import subprocess
    import sys

    env = {
        **os.environ,
        "NEARDUP_STATE_DIR": str(tmp_path / "state"),
        "NEARDUP_BROKERS": "127.0.0.1:1",  # nothing listens: a start would fail on it
    }
    done = subprocess.run(
        [sys.executable, "-m", "neardup.kafka", "worker", "--help"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "NEARDUP_STATE_DIR=" in done.stdout and "cannot connect" not in done.stderr
    assert not (tmp_path / "state" / RUNNING_MARKER).exists()


def _main_until_faust(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    run_using_worker: Callable[..., None],
    argv: Sequence[str] = ("worker",),
    code: int = 0,
    **env: str,
) -> None:
    """``neardup.kafka.__main__.main(argv)`` under ``env``, no broker touched, until Faust's
    worker command would run: ``run_using_worker`` runs instead and ends it (SystemExit
    ``code``)."""
    import sys

    from faust.cli.base import Command

    from neardup.kafka import __main__ as entry

    asyncio.set_event_loop_policy(None)
    monkeypatch.setattr(Command, "run_using_worker", run_using_worker)
    monkeypatch.setattr(entry, "create_topics", lambda settings: None)
    monkeypatch.setattr(entry.identity, "rebuild_if_stale", lambda settings, tabledir: None)
    monkeypatch.setattr(sys, "argv", ["neardup.kafka"])
    monkeypatch.setenv("NEARDUP_STATE_DIR", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        entry.main(list(argv))
    assert (stopped.value.code or 0) == code


@pytest.mark.parametrize(
    ("level", "argv", "faust_level"),
    [
        ("DEBUG", ["worker"], "debug"),
        ("WARNING", ["worker", "--without-web"], "warn"),
        ("ERROR", ["worker", "-l", "info"], "info"),  # the command line wins
        ("DEBUG", ["worker", "--loglevel=error"], "error"),
    ],
)
@pytest.mark.usefixtures("restore_logging", "restore_process")
def test_the_worker_logs_at_neardup_log_level(
    level: str, argv: list[str], faust_level: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust's worker sets the root logger's level from its ``-l`` (WARN by default) when
    it starts: NEARDUP_LOG_LEVEL must reach it, or it governs only the start-up lines."""
    from faust.cli.base import Command

    seen: list[str | None] = []

    def run_using_worker(self: Command, *args: object, **kwargs: object) -> None:
        seen.append(self.loglevel)  # what Faust's worker would call setup_logging with
        raise SystemExit(0)

    _main_until_faust(monkeypatch, tmp_path, run_using_worker, argv, NEARDUP_LOG_LEVEL=level)
    assert seen == [faust_level]


@pytest.mark.usefixtures("restore_logging", "restore_process")
def test_a_consistency_error_has_the_next_start_rebuild_the_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Should Faust still find a table ahead of its changelog, the worker exits 1 saying so,
    and its next start discards the tables instead of meeting the same error again."""
    from faust.cli.base import Command
    from faust.exceptions import ConsistencyError

    def run_using_worker(self: Command, *args: object, **kwargs: object) -> None:
        try:  # as mode does: the crash's reason, then exit 1 from within its except
            raise ConsistencyError("changelog partition TP(x) is higher (9 > -1).")
        except ConsistencyError:
            raise SystemExit(1) from None

    tables = tmp_path / "v1" / "tables"
    tables.mkdir(parents=True)
    with caplog.at_level(logging.CRITICAL, "neardup.kafka"):
        _main_until_faust(monkeypatch, tmp_path, run_using_worker, code=1)
    assert any("rebuilt from the changelog" in r.getMessage() for r in caplog.records)
    prepare_state(str(tmp_path), str(tables))
    assert not tables.exists()


@pytest.fixture
def restore_process() -> Iterator[None]:
    """What ``neardup.kafka.__main__.main`` changes for the whole process, put back as it
    was: the event loop policy (``use_event_loop``) and the loop mode keeps for the thread
    (Faust's app resolves one), the signals' handlers, mode's patched
    ``_schedule_shutdown`` (``arm_stop_deadline``) and ``tablekv``'s hooks."""
    import signal

    import mode.utils.loops
    from mode.worker import Worker as ModeWorker

    from neardup.kafka import tablekv

    policy = asyncio.get_event_loop_policy()
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    }
    schedule = ModeWorker.__dict__["_schedule_shutdown"]
    hooks = (tablekv.on_fatal, tablekv.on_doubt)
    mode.utils.loops._current_loop.loop = None
    yield
    loop = getattr(mode.utils.loops._current_loop, "loop", None)
    if loop is not None and not loop.is_running():
        loop.close()
    mode.utils.loops._current_loop.loop = None
    asyncio.set_event_loop_policy(policy)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    ModeWorker._schedule_shutdown = schedule  # type: ignore[method-assign]
    tablekv.on_fatal, tablekv.on_doubt = hooks


@pytest.mark.parametrize(("setting", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
@pytest.mark.usefixtures("restore_logging", "restore_process")
def test_the_worker_runs_on_the_event_loop_neardup_event_loop_names(
    setting: str, module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust's loop (the one its worker command runs, resolved while the app was made)
    and the loop of Faust's consumer thread are the setting's."""
    import mode.utils.loops
    from faust.cli.base import Command

    from neardup.kafka import app as worker_app

    made: list[Any] = []
    seen: list[str] = []
    init = worker_app.Worker.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    def run_using_worker(self: Command, *args: object, **kwargs: object) -> None:
        (worker,) = made
        for loop in (mode.utils.loops.get_event_loop(), worker.app.consumer._thread.thread_loop):
            seen.append(type(loop).__module__.split(".")[0])
        raise SystemExit(0)

    monkeypatch.setattr(worker_app.Worker, "__init__", keep)
    _main_until_faust(monkeypatch, tmp_path, run_using_worker, NEARDUP_EVENT_LOOP=setting)
    assert seen == [module, module]


@pytest.mark.usefixtures("restore_logging", "restore_process")
def test_the_signals_the_loop_handled_get_their_defaults_back_when_faust_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop leaves its handlers installed once its loop is closed: without the defaults
    put back, SIGTERM and Ctrl-C would do nothing while the worker stops."""
    import signal

    import mode.utils.loops
    from faust.cli.base import Command

    from neardup.kafka import __main__ as entry

    def run_using_worker(self: Command, *args: object, **kwargs: object) -> None:
        loop = mode.utils.loops.get_event_loop()
        for sig in entry.LOOP_SIGNALS:  # as mode's worker and neardup.kafka.dump do
            loop.add_signal_handler(sig, lambda: None)

        async def run() -> None:
            pass

        loop.run_until_complete(run())
        loop.close()
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # uvloop's
        raise SystemExit(0)

    _main_until_faust(monkeypatch, tmp_path, run_using_worker, NEARDUP_EVENT_LOOP="uvloop")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_uvloop_is_the_default_event_loop() -> None:
    assert Settings().event_loop == "uvloop"


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({"NEARDUP_SASL_USERNAME": "neardup"}, "NEARDUP_SASL_PASSWORD"),
        (
            {"NEARDUP_SASL_USERNAME": "neardup", "NEARDUP_SASL_PASSWORD": ""},
            "NEARDUP_SASL_PASSWORD",
        ),
        ({"NEARDUP_SASL_PASSWORD": "s3cret-pw-in-env"}, "NEARDUP_SASL_USERNAME"),
    ],
)
def test_sasl_without_credentials_is_refused_at_start(
    env: dict[str, str], missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not left to aiokafka, whose ValueError (PLAIN) names none of the variables, or
    which tries SCRAM without a password; and the refusal never shows the password."""
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("NEARDUP_SASL_MECHANISM", "SCRAM-SHA-512")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=f"SASL_SSL needs {missing}") as caught:
        Settings()
    assert "s3cret-pw-in-env" not in str(caught.value) + repr(caught.value)
    # PLAINTEXT and SSL need neither
    monkeypatch.delenv("NEARDUP_SASL_USERNAME", raising=False)
    monkeypatch.delenv("NEARDUP_SASL_PASSWORD", raising=False)
    assert Settings(security_protocol="SSL").sasl_password is None  # type: ignore[arg-type]


def test_bad_settings_stop_the_worker_with_a_line_per_variable_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from neardup.kafka import __main__ as entry

    monkeypatch.setenv("NEARDUP_SASL_PASSWORD", "s3cret-pw-in-env")
    monkeypatch.setenv("NEARDUP_PARTITIONS", "abc")
    monkeypatch.setenv("NEARDUP_ENGINE__K3", "1")  # no such engine parameter
    assert entry.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "neardup worker: bad settings:",
        "  NEARDUP_PARTITIONS: Input should be a valid integer, unable to parse string as an "
        "integer (got 'abc')",
        "  NEARDUP_ENGINE__K3: Extra inputs are not permitted (got '1')",
    ]
    # the engine's own checks, across its variables, are settings errors too
    monkeypatch.delenv("NEARDUP_ENGINE__K3")
    monkeypatch.setenv("NEARDUP_PARTITIONS", "2")
    monkeypatch.setenv("NEARDUP_ENGINE__K1", "9")
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "SASL_SSL")  # and no user name
    assert entry.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert "NEARDUP_ENGINE__*: need 0 <= k1 <= k2 <= 32, got k1=9 k2=6" in err
    assert "NEARDUP_SASL_USERNAME: NEARDUP_SECURITY_PROTOCOL=SASL_SSL needs" in err
    assert "s3cret-pw-in-env" not in err and "Traceback" not in err
    # a nested setting given as something other than its JSON: pydantic-settings' own error
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "PLAINTEXT")
    monkeypatch.delenv("NEARDUP_ENGINE__K1")
    monkeypatch.setenv("NEARDUP_ENGINE", "{s3cret-pw-in-env")
    assert entry.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[:2] == [
        "neardup worker: bad settings:",
        '  error parsing value for field "engine" from source "EnvSettingsSource"',
    ]
    assert "s3cret-pw-in-env" not in err and "Traceback" not in err


def test_a_misspelt_variable_is_named_with_the_setting_it_is_closest_to() -> None:
    from neardup.settings import unknown_variables

    environ = {
        "NEARDUP_BROKER": "kafka:9092",  # the setting is NEARDUP_BROKERS
        "neardup_max_backlogg": "10",  # any case, as the settings read them
        "NEARDUP_NONSENSE": "1",
        "NEARDUP_BROKERS": "kafka:9092",
        "NEARDUP_ENGINE__K1": "3",
        "NEARDUP_CACHE_DIR": "/tmp/x",
        "NEARDUP_KAFKA_PORT": "19092",
        "PATH": "/bin",
    }
    assert unknown_variables(environ) == [
        "NEARDUP_BROKER is set but is not a setting of the worker: ignored; did you mean "
        "NEARDUP_BROKERS?",
        "NEARDUP_NONSENSE is set but is not a setting of the worker: ignored",
        "neardup_max_backlogg is set but is not a setting of the worker: ignored; did you "
        "mean NEARDUP_MAX_BACKLOG?",
    ]


def test_every_variable_the_deployments_set_is_a_setting() -> None:
    """The chart's and compose's variables, as the worker would see them: no warning."""
    from neardup.settings import unknown_variables

    root = Path(__file__).resolve().parents[2]
    deployments = [
        root / "docker-compose.yml",
        root / "Dockerfile",
        *(root / "helm").rglob("*.yaml"),
    ]
    text = "".join(p.read_text() for p in deployments)
    names = set(re.findall(r"\bNEARDUP_[A-Z0-9_]+\b", text))
    assert len(names) > 20
    assert unknown_variables(dict.fromkeys(names, "x")) == []


def test_no_variable_the_code_or_ci_reads_is_called_unknown() -> None:
    """A variable the engine reads (NEARDUP_NATIVE), or CI exports (NEARDUP_EXPECT_NATIVE),
    must not be reported as ignored: the warning would be false."""
    from neardup.settings import unknown_variables

    root = Path(__file__).resolve().parents[2]
    sources = [
        *(root / "neardup").rglob("*.py"),
        root / ".ci" / "run",
        *(root / "scripts").glob("*.sh"),
    ]
    names = set()
    for path in sources:
        names |= set(re.findall(r"\bNEARDUP_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert {"NEARDUP_NATIVE", "NEARDUP_EXPECT_NATIVE", "NEARDUP_CACHE_DIR"} <= names
    assert unknown_variables(dict.fromkeys(names, "x")) == []


@pytest.mark.parametrize("content", [None, b"not a certificate\n"])
def test_a_ca_bundle_that_cannot_be_read_is_a_settings_error(
    tmp_path: Path, content: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.pem"
    if content is not None:
        bundle.write_bytes(content)
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("NEARDUP_SSL_CAFILE", str(bundle))
    with pytest.raises(ValueError, match="cannot read a CA bundle"):
        Settings()
