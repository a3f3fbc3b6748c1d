"""``python -m neardup.kafka worker``: run one worker, configured from NEARDUP_*.

It logs at NEARDUP_LOG_LEVEL; Faust's ``-l``/``--loglevel``, given, overrides it.

Before Faust starts, the worker's topics are created if missing, and the local table state
is checked. A worker killed without shutting down (SIGKILL, OOM) may have written to its
RocksDB what never reached the changelog: those writes are undone from their undo records
(``neardup.kafka.undo``) and Faust's recovery reads them again from the changelog, which
is the state every other worker would see; so are those of a flush whose records did
not all reach the broker. A worker that stopped because its local tables were in doubt
(a failed local write, an inconsistency found) leaves a mark, and its tables are
discarded and restored from the changelogs whole. So are tables built on topics that no
longer exist, a cluster since replaced or changelogs deleted and made again
(``neardup.kafka.identity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from neardup.kafka import freshness, identity, timerlog, undo
from neardup.kafka.security import connection_problem, describe, install_log_redaction
from neardup.kafka.topics import ensure_topics_sync, tombstone_retention_ms
from neardup.kafka.usage import help_text
from neardup.settings import Settings, read_settings, unknown_variables
from neardup.store import StateError

if TYPE_CHECKING:  # the app imports Faust, which must come after ``use_event_loop``
    from neardup.kafka.app import Worker

log = logging.getLogger("neardup.kafka")

RUNNING_MARKER = "neardup-worker.running"
#: Left by a worker whose local tables came into doubt: the next start discards them.
DISCARD_MARKER = "neardup-worker.discard"
#: Says that the worker writing these tables writes undo records with them. A worker
#: build from before them (killed, its tables hold writes no undo record covers) did not.
UNDO_MARKER = "neardup-worker.undo-v1"


def prepare_state(state_dir: str, tabledir: str, max_age_s: float | None = None) -> bool:
    """Mark the state directory as in use; returns True if the previous run did not stop
    cleanly (its writes not known to be in the changelogs are then undone, or its local
    tables removed if it said they were in doubt). Tables last caught up with their
    changelogs longer than ``max_age_s`` ago (``freshness.MAX_AGE_S``) are removed first,
    however the previous run stopped."""
    os.makedirs(state_dir, exist_ok=True)
    marker = Path(state_dir) / RUNNING_MARKER
    discard = Path(state_dir) / DISCARD_MARKER
    unclean = marker.exists()
    # killed under a build without undo records: nothing says what its tables lack
    doubt = discard.exists() or (unclean and not (Path(state_dir) / UNDO_MARKER).exists())
    refuse_if_in_use(state_dir)
    if doubt and os.path.isdir(tabledir):
        log.warning(
            "the previous worker on %s did not stop cleanly, and its local tables were in "
            "doubt: discarding them (%s); they are restored from the changelog topics",
            state_dir,
            tabledir,
        )
        shutil.rmtree(tabledir)
    elif os.path.isdir(tabledir):
        # the changelog may have dropped deletions these missed: catching up would not do
        freshness.discard_stale(tabledir, max_age_s)
        # after a clean stop every write had reached the changelog: undo records left (a
        # partition's database closed before its acknowledgement came) are only dropped
        touched, undone = undo.revert(tabledir, undo=unclean)
        if unclean:
            log.warning(
                "the previous worker on %s did not stop cleanly: %d write batches in %d "
                "local tables were not known to be in the changelog; they were undone, and "
                "the tables catch up from the changelog topics",
                state_dir,
                undone,
                touched,
            )
    discard.unlink(missing_ok=True)
    (Path(state_dir) / UNDO_MARKER).write_text("tables written with undo records\n")
    marker.write_text(f"{os.getpid()}\n")
    return unclean


def refuse_if_in_use(state_dir: str) -> None:
    """Exit, saying so, if another live worker runs on ``state_dir``: its tables must
    never be discarded or rewritten under it."""
    marker = Path(state_dir) / RUNNING_MARKER
    if marker.exists() and (owner := _live_owner(marker)) is not None:
        raise SystemExit(
            f"neardup worker: fatal: the state directory {state_dir} is in use by another "
            f"worker (pid {owner}). Give each worker a state directory of its own "
            "(NEARDUP_STATE_DIR)."
        )


def _live_owner(marker: Path) -> int | None:
    """The pid in ``marker`` if it is another live worker process (a marker left by a
    killed worker may name a pid since reused by anything else)."""
    try:
        pid = int(marker.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid != os.getpid() and b"neardup.kafka" in cmdline else None


def fatal_message(exc: BaseException, state_dir: str) -> str:
    """One line for the operator: what stopped the worker, and what to do."""
    text = str(exc)
    if text.startswith("fatal:"):  # neardup.kafka.tablekv.StateWriteError says it all
        return text
    if type(exc).__name__ == "ConsistencyError":  # Faust's: a table ahead of its changelog
        first = " ".join(text.split()).split(". Most likely")[0]
        return (
            f"fatal: a local table under {state_dir} has applied more of its changelog than "
            f"the changelog holds ({first}): its topics were deleted or the broker's data "
            "lost since. The local tables are discarded and rebuilt from the changelog "
            "topics at the next start: start the worker again"
        )
    if "IO error" in text and "lock" in text.lower():
        return (
            f"fatal: a RocksDB table under {state_dir} is locked by another process "
            f"({text}). Stop that process, or give each worker a state directory of its "
            "own (NEARDUP_STATE_DIR), then restart: nothing is lost, the pages not yet "
            "decided are read again"
        )
    return (
        f"fatal: the worker stopped on {type(exc).__name__}: {text}. The pages not yet "
        "decided are read again at the next start"
    )


def release_state(state_dir: str) -> None:
    (Path(state_dir) / RUNNING_MARKER).unlink(missing_ok=True)


def doubt_state(state_dir: str) -> None:
    """The local tables may differ from their changelogs in ways undo records do not
    cover: the next start discards them."""
    (Path(state_dir) / DISCARD_MARKER).write_text("local tables in doubt\n")


@contextlib.contextmanager
def broker_errors(settings: Settings) -> Iterator[None]:
    """A broker that cannot be reached, or does not answer, ends the worker with one line
    naming the variable read, its value and the cause, instead of a traceback."""
    from aiokafka.errors import (  # type: ignore[import-untyped]
        KafkaConnectionError,
        KafkaError,
    )

    try:
        yield
    except KafkaConnectionError:
        problem = asyncio.run(connection_problem(settings))
        raise SystemExit(
            f"neardup worker: cannot connect to the brokers, NEARDUP_BROKERS="
            f"{describe(settings)}: {problem}{brokers_hint(os.environ)}"
        ) from None
    except KafkaError as exc:  # a timeout, say
        raise SystemExit(
            f"neardup worker: the brokers did not answer the worker's requests, "
            f"NEARDUP_BROKERS={describe(settings)}: {type(exc).__name__}: {exc}"
            f"{brokers_hint(os.environ)}"
        ) from None


def brokers_hint(environ: Mapping[str, str]) -> str:
    """What to add to an error about the brokers the worker tried: that NEARDUP_BROKERS,
    the one variable it reads, is unset; that KAFKA_BOOTSTRAP_SERVERS (the test suite's
    variable) names others."""
    given = next((environ[k] for k in environ if k.upper() == "NEARDUP_BROKERS"), None)
    out = "" if given is not None else ". NEARDUP_BROKERS is unset: the default was tried"
    other = environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if other and other != given:
        out += (
            f". KAFKA_BOOTSTRAP_SERVERS={other} is set, but the worker reads NEARDUP_BROKERS "
            'only: `eval "$(bash scripts/kafka-local.sh env)"` sets both'
        )
    return out


def create_topics(settings: Settings) -> None:
    """Create the worker's missing topics and read how long the changelogs keep
    deletions (``freshness.MAX_AGE_S``); a broker that cannot be reached (a wrong
    password, an untrusted certificate) or does not answer ends the worker with a
    message naming the cause."""
    with broker_errors(settings):
        ensure_topics_sync(settings)
        # no guess if the brokers do not say: a guess could trust stale tables
        retention_ms = asyncio.run(tombstone_retention_ms(settings))
    freshness.MAX_AGE_S = freshness.max_age_s(retention_ms)
    log.info(
        "the changelogs keep deletions for %.1f hours: local tables last caught up more "
        "than %.1f hours ago are restored whole",
        retention_ms / 3.6e6,
        freshness.MAX_AGE_S / 3600,
    )


#: How long the worker may take to shut down after a fatal state error before it exits
#: anyway. Faust's shutdown after the crash was seen to hang in the consumer's stop (CI,
#: the full-disk test, 1 run in 5); the worker must still end, and say why.
FATAL_GRACE_S = 30.0


def exit_later(error: BaseException, grace_s: float = FATAL_GRACE_S) -> threading.Timer:
    """Exit with status 1, saying ``error``, unless the process has ended ``grace_s``
    from now (a daemon timer: a shutdown that completes is not waited for)."""

    def end() -> None:
        log.critical("%s (the shutdown hung for %.0f s; exiting)", error, grace_s)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    timer = threading.Timer(grace_s, end)
    timer.daemon = True
    timer.start()
    return timer


def arm_stop_deadline(grace_s: float) -> None:
    """From the first stop signal on (SIGTERM, SIGINT), exit with status 1 unless the
    shutdown has ended ``grace_s`` later.

    mode's worker stops on a signal by stopping every service in turn, and Faust's consumer
    stops by leaving its group, which waits for the broker without end: told to stop
    while the broker was away, the worker logged a connection error 40 times a second and
    ignored further signals until SIGKILL. Exiting instead is what SIGKILL would do (the
    next start undoes table writes its changelogs lack), with the reason said first."""
    from mode.worker import Worker as ModeWorker

    original = ModeWorker._schedule_shutdown

    def schedule(self: ModeWorker, sig: signal.Signals) -> None:
        if not self._signal_stop_time:  # the first signal: mode starts stopping now
            exit_later(RuntimeError(f"stopping on {sig.name}: not stopped in time"), grace_s)
        original(self, sig)

    ModeWorker._schedule_shutdown = schedule  # type: ignore[method-assign,assignment]


def use_event_loop(name: str) -> None:
    """Make the event loops created from now on, the worker's and the one of Faust's
    consumer thread, ``name``'s (NEARDUP_EVENT_LOOP): for uvloop, its policy, as mode's own
    switch does (``mode.loop.use``, Faust's ``--loop``), though that one only the first
    time; for asyncio, Python's default."""
    if name != "uvloop":
        asyncio.set_event_loop_policy(None)
        return
    try:
        import uvloop

        policy = uvloop.EventLoopPolicy()
    except (ImportError, AttributeError) as exc:  # no wheel for the platform; a uvloop
        # without policies (they are deprecated): the same, slower
        log.warning("NEARDUP_EVENT_LOOP=uvloop, but uvloop cannot be used (%s): asyncio", exc)
        return
    asyncio.set_event_loop_policy(policy)


#: The signals the worker's event loop handles while it runs: mode's stop signals, and
#: ``neardup.kafka.dump``'s.
LOOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def run_faust(worker: Worker) -> None:
    """Faust's command line; then the signals its event loop handled get their default
    handlers back. uvloop leaves its own installed once its loop is closed (its
    ``remove_signal_handler`` does nothing when the loop is not running), which would
    have the process ignore SIGTERM and Ctrl-C while it releases its state and stops its
    sandbox; asyncio's loop puts the defaults back itself."""
    try:
        worker.main()
    finally:
        for sig in LOOP_SIGNALS:
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, default)


#: NEARDUP_LOG_LEVEL as Faust's ``--loglevel`` spells it (it has no "warning").
FAUST_LOGLEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}


def with_log_level(argv: list[str], log_level: str) -> list[str]:
    """Faust's command line, logging at ``log_level`` unless it names a level itself.

    Faust sets the root logger's level when its worker starts, from ``-l`` or its own
    default (WARN): without this, NEARDUP_LOG_LEVEL would only govern the lines logged
    before that."""
    if any(a == "--loglevel" or a.startswith(("--loglevel=", "-l")) for a in argv):
        return argv
    # a top-level option: every command takes it, and it comes before the command's own
    return ["--loglevel", FAUST_LOGLEVELS[log_level], *argv]


def ready_state(settings: Settings, worker: Worker) -> bool:
    """Before Faust starts: what a fatal or doubtful table write does, the topics, and the
    local tables checked against the brokers' topics and against how the previous run
    stopped. False after saying why the worker cannot start."""
    from neardup.kafka import tablekv

    armed: list[threading.Timer] = []

    def on_fatal(error: BaseException) -> None:
        if not armed:  # once: each failing write raises it again
            armed.append(exit_later(error))

    tablekv.on_fatal = on_fatal
    # at once, not at the end: a kill that follows must not leave the tables trusted
    tablekv.on_doubt = functools.partial(doubt_state, settings.state_dir)
    create_topics(settings)
    tabledir = str(worker.app.conf.tabledir)
    try:
        refuse_if_in_use(settings.state_dir)
        with broker_errors(settings):
            identity.rebuild_if_stale(settings, tabledir)
        prepare_state(settings.state_dir, tabledir)
    except Exception as exc:  # a table locked by another process, an unreadable one
        # undone or not at all: a table whose undo records were skipped would keep
        # writes its changelog may lack
        log.critical("%s", fatal_message(exc, settings.state_dir))
        return False
    return True


#: Faust's options before the command that take a value.
_VALUE_OPTIONS = frozenset(("-l", "--loglevel", "-f", "--logfile", "-L", "--loop", "-D",
                            "--datadir", "-W", "--workdir", "-A", "--app", "--console-port",
                            "--blocking-timeout"))  # fmt: skip


def run_partitioned(settings: Settings) -> int:
    """The partitioned worker (``neardup.kafka.partitioned``): refused on a state directory
    another worker runs on; a fatal error said in one line; a stop that hangs (the broker
    away) ends ``stop_grace_s`` after the signal."""
    from neardup.kafka import partitioned

    refuse_if_in_use(settings.state_dir)
    Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
    (Path(settings.state_dir) / RUNNING_MARKER).write_text(f"{os.getpid()}\n")

    def on_stop(sig: signal.Signals) -> None:
        exit_later(
            RuntimeError(f"stopping on {sig.name}: not stopped in time"), settings.stop_grace_s
        )

    try:
        with broker_errors(settings):
            return partitioned.run(settings, on_stop)
    except (OSError, StateError) as exc:
        log.critical("%s", fatal_message(exc, settings.state_dir))
        return 1
    finally:
        release_state(settings.state_dir)


def command_of(argv: list[str]) -> str | None:
    """The command in Faust's command line (``--loop aio worker``: worker), or None."""
    skip = False
    for arg in argv:
        if skip or arg in _VALUE_OPTIONS:
            skip = not skip
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 - one return per way out
    argv = sys.argv[1:] if argv is None else argv
    command = command_of(argv)
    # the worker's own help, not Faust's, whose defaults the worker overrides; before the
    # settings are read, so that it is shown whatever they are
    if command in (None, "worker") and {"-h", "--help"} & set(argv):
        print(help_text(os.environ))
        return 0
    if command is None and "--version" not in argv:
        print(help_text(os.environ), file=sys.stderr)
        return 2
    # A file size limit (RLIMIT_FSIZE) would kill the worker with SIGXFSZ at the first
    # write past it, with no word said; ignored, the write fails (EFBIG) as on a full
    # disk, and the worker stops with a message saying so.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    settings = read_settings("neardup worker")
    if settings is None:
        return 2
    install_log_redaction(settings)
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    if settings.topology == "partitioned" and command == "worker":
        return run_partitioned(settings)
    use_event_loop(settings.event_loop)
    from neardup.kafka.app import Worker

    worker = Worker(settings)
    if command == "worker":
        if not ready_state(settings, worker):
            return 1
        arm_stop_deadline(settings.stop_grace_s)
        timerlog.explain_overlaps()
        if not {"--with-web", "--without-web"} & set(argv):
            # Faust's own web server would bind 0.0.0.0:6066; ours is neardup.kafka.http
            argv = [*argv, "--without-web"]
        sys.argv = [sys.argv[0], *with_log_level(argv, settings.log_level)]
        try:
            run_faust(worker)
        except SystemExit as exc:
            # a crash: mode re-raises its reason, then exits 1 from within that except
            if exc.code not in (0, None):
                reason = exc.__context__ or exc
                if type(reason).__name__ == "ConsistencyError":
                    doubt_state(settings.state_dir)  # so that the next start rebuilds them
                log.critical("%s", fatal_message(reason, settings.state_dir))
            raise
        finally:
            # Reached on a stop (SIGTERM, SIGINT) and on a crash Faust shut down from; never
            # after SIGKILL. The local tables are kept only if their changelogs have all of
            # them: an agent stopped halfway through a batch leaves the marker behind.
            if worker.changelog.clean:
                release_state(settings.state_dir)
            elif worker.changelog.failed:  # marked already (tablekv.on_doubt, above)
                log.warning(
                    "stopped with the local tables in doubt: they will be restored from "
                    "the changelog at the next start"
                )
            else:
                log.warning(
                    "stopped with table writes not in the changelog: they will be undone "
                    "at the next start, and the tables catch up from the changelog"
                )
        return 0
    sys.argv = [sys.argv[0], *with_log_level(argv, settings.log_level)]
    run_faust(worker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
