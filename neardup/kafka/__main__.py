"""``python -m neardup.kafka worker``: run one worker, configured from NEARDUP_*.

The worker (``neardup.kafka.partitioned``) creates its topics if missing, then runs its
share of the tasks on the exactly-once runtime. This module is its command line: the
options, the settings read and checked, the state directory claimed, and every way it
can stop said in one line (``fatal_message``, ``broker_errors``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NoReturn

from neardup import __version__
from neardup.kafka.security import connection_problem, describe, install_log_redaction
from neardup.kafka.usage import USAGE, help_text
from neardup.settings import Settings, read_settings, refused_variables, unknown_variables
from neardup.store import StateError

log = logging.getLogger("neardup.kafka")

RUNNING_MARKER = "neardup-worker.running"

#: ``-l``'s levels: the logging module's names, and the short ones earlier releases took.
LOG_LEVELS = {"crit": "CRITICAL", "critical": "CRITICAL", "error": "ERROR", "warn": "WARNING",
              "warning": "WARNING", "info": "INFO", "debug": "DEBUG"}  # fmt: skip


def refuse_if_in_use(state_dir: str) -> None:
    """Exit, saying so, if another live worker runs on ``state_dir``: its stores must
    never be opened or rewritten under it."""
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
    from neardup.kafka.membership import InstanceFencedError
    from neardup.kafka.taskstate import StateFormatError

    text = str(exc)
    if "IO error" in text and "lock" in text.lower():
        return (
            f"fatal: a RocksDB store under {state_dir} is locked by another process "
            f"({text}). Stop that process, or give each worker a state directory of its "
            "own (NEARDUP_STATE_DIR), then restart: nothing is lost, the pages not yet "
            "decided are read again"
        )
    if isinstance(exc, (StateFormatError, InstanceFencedError)):
        return f"fatal: {text}"  # what to do is in it; a restart alone would not help
    return (
        f"fatal: the worker stopped on {type(exc).__name__}: {text}. The pages not yet "
        "decided are read again at the next start"
    )


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


def exit_later(error: BaseException, grace_s: float) -> threading.Timer:
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


def run_worker(settings: Settings) -> int:
    """The worker (``neardup.kafka.partitioned``): refused on a state directory another
    worker runs on; a fatal error said in one line; a stop that hangs (a client waiting
    for a broker that is away) ends ``stop_grace_s`` after the signal."""
    from neardup.kafka import partitioned
    from neardup.kafka.membership import InstanceFencedError

    refuse_if_in_use(settings.state_dir)
    Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
    marker = Path(settings.state_dir) / RUNNING_MARKER
    marker.write_text(f"{os.getpid()}\n")

    def on_stop(sig: signal.Signals) -> None:
        exit_later(
            RuntimeError(f"stopping on {sig.name}: not stopped in time"), settings.stop_grace_s
        )

    try:
        with broker_errors(settings):
            return partitioned.run(settings, on_stop)
    except (OSError, StateError, InstanceFencedError) as exc:
        log.critical("%s", fatal_message(exc, settings.state_dir))
        return 1
    finally:
        marker.unlink(missing_ok=True)


class UsageError(Exception):
    """A command line the worker does not take."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own would exit the process
        raise UsageError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: ``worker``, and the options before or after it."""
    parser = _Parser(prog="python -m neardup.kafka", add_help=False)
    parser.add_argument("command", nargs="?")
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("-l", "--loglevel", type=str.lower, choices=sorted(LOG_LEVELS))
    parser.add_argument("-f", "--logfile")
    args = parser.parse_args(argv)
    if args.command not in (None, "worker"):
        raise UsageError(f"no command {args.command!r}: the one command is worker")
    return args


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 - one return per way out
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"{USAGE}\nneardup worker: {exc} (--help lists the options)", file=sys.stderr)
        return 2
    # before the settings are read, so that the help is shown whatever they are
    if args.help:
        print(help_text(os.environ))
        return 0
    if args.version:
        print(f"neardup {__version__}")
        return 0
    if args.command is None:
        print(help_text(os.environ), file=sys.stderr)
        return 2
    # A file size limit (RLIMIT_FSIZE) would kill the worker with SIGXFSZ at the first
    # write past it, with no word said; ignored, the write fails (EFBIG) as on a full
    # disk, and the worker stops with a message saying so.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    settings = read_settings("neardup worker")
    if settings is None:
        return 2
    if refused := refused_variables(os.environ):
        print("neardup worker: " + "\n  ".join(refused), file=sys.stderr)
        return 2
    install_log_redaction(settings)
    level = LOG_LEVELS[args.loglevel] if args.loglevel else settings.log_level
    try:
        handlers = [logging.FileHandler(args.logfile)] if args.logfile else None
    except OSError as exc:
        print(f"neardup worker: cannot write the log file: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=level, handlers=handlers, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    return run_worker(settings)


if __name__ == "__main__":
    sys.exit(main())
