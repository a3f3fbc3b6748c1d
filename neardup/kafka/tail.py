"""Print a topic's messages: ``python -m neardup.kafka.tail [TOPIC] [--idle-s S]`` (its
``--help`` says how), for looking at the worker's outputs where Kafka's own console
consumer is not at hand (the jars ``scripts/kafka-local.sh`` fetches do not include it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import IO

from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

from neardup.kafka.security import aiokafka_kwargs, describe, install_log_redaction, why_failed
from neardup.settings import Settings, read_settings

EXIT_OK, EXIT_FATAL, EXIT_USAGE = 0, 1, 2
_SHORT = ("raw", "decisions", "merges", "rejects")


class NoSuchTopicError(Exception):
    pass


async def tail(settings: Settings, topic: str, idle_s: float, out: IO[str]) -> int:
    """Print ``topic`` from its beginning until ``idle_s`` seconds pass without a message;
    the number of messages printed."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.brokers,
        client_id=f"{settings.app_id}-tail",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # what every consumer of the outputs must do: the partitioned worker writes them in
        # transactions, and an aborted one leaves records only read_uncommitted shows
        isolation_level="read_committed",
        **aiokafka_kwargs(settings),
    )
    try:
        await consumer.start()
        # the topics the cluster has (a consumer asks for all of them, creating none)
        if topic not in await consumer.topics():
            raise NoSuchTopicError(topic)
        # without a group, a subscription takes every partition, read from the beginning
        consumer.subscribe([topic])
        printed, last = 0, time.monotonic()
        while time.monotonic() - last < idle_s:
            if not consumer.assignment():  # quiet only counts once there is a partition
                last = time.monotonic()
            batches = await consumer.getmany(timeout_ms=200)
            for tp in sorted(batches):
                for msg in batches[tp]:
                    key = msg.key.decode("utf-8", "replace") if msg.key is not None else ""
                    value = msg.value.decode("utf-8", "replace") if msg.value is not None else ""
                    out.write(f"{key} | {value}\n")
                    printed += 1
            if batches:
                out.flush()
                last = time.monotonic()
        return printed
    finally:
        await consumer.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m neardup.kafka.tail",
        description="Print a topic's messages (key | value), from the beginning, without a "
        "consumer group.",
        epilog="Connection and security come from NEARDUP_* (neardup/settings.py). Exit status: "
        "0 done, 1 the broker cannot be reached or the topic does not exist, 2 usage.",
    )
    p.add_argument(
        "topic",
        nargs="?",
        default="decisions",
        help="a topic name, or raw, decisions, merges or rejects for the topics the settings "
        "name (NEARDUP_TOPIC_*); default: decisions",
    )
    p.add_argument(
        "--idle-s",
        type=float,
        default=10.0,
        help="exit after this many seconds without a new message (default: 10)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.idle_s <= 0:
        print("neardup-tail: --idle-s must be positive", file=sys.stderr)
        return EXIT_USAGE
    settings = read_settings("neardup-tail")
    if settings is None:
        return EXIT_USAGE
    install_log_redaction(settings)
    topic = args.topic  # a topic name, or one of the settings' short names
    name = str(getattr(settings, f"topic_{topic}")) if topic in _SHORT else topic
    return run(settings, name, args.idle_s)


def run(settings: Settings, topic: str, idle_s: float) -> int:
    """``tail`` to standard output; the exit status, the outcome said on standard error."""
    try:
        printed = asyncio.run(tail(settings, topic, idle_s, sys.stdout))
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (so the exit flush is quiet)
        return EXIT_OK
    except NoSuchTopicError:
        print(
            f"neardup-tail: no topic {topic!r} at NEARDUP_BROKERS={describe(settings)}",
            file=sys.stderr,
        )
        return EXIT_FATAL
    except Exception as exc:  # connection or authentication failure: say it once, plainly
        why = why_failed(settings, exc)
        print(
            f"neardup-tail: cannot read from NEARDUP_BROKERS={describe(settings)}: {why}",
            file=sys.stderr,
        )
        return EXIT_FATAL
    print(f"{printed} messages from {topic}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
