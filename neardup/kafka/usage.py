"""The worker's own help (``python -m neardup.kafka --help``, ``worker --help``).

Faust's generic help would describe its defaults, and the worker overrides several of
them: the state directory (NEARDUP_STATE_DIR, not ``--datadir``), the event loop
(NEARDUP_EVENT_LOOP, not ``--loop aio``), the log level (NEARDUP_LOG_LEVEL, not WARN),
the web server (``neardup.kafka.http`` on NEARDUP_HTTP_PORT, not Faust's on 6066). The
defaults shown here are read from the settings model, so they cannot drift from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from neardup.settings import Settings

#: The settings a first run most often needs, in the order a reader meets them.
MAIN_SETTINGS = (
    (
        "brokers",
        "Kafka bootstrap servers, host:port[,host:port...]; scripts/kafka-local.sh env\n"
        "      exports it for the script's broker",
    ),
    ("state_dir", "the worker's RocksDB tables: a directory of its own per worker"),
    ("app_id", "consumer group, and prefix of the worker's internal topics"),
    ("topic_raw", "the pages to decide (JSON: url, fetched_at, content_type, html)"),
    ("topic_decisions", "a decision per page"),
    ("topic_merges", "cluster merges"),
    ("topic_rejects", "dead letters: pages that could not be read, with the reason"),
    ("partitions", "partitions of the topics the worker creates"),
    ("http_host", "where /metrics, /healthz and /readyz are served"),
    ("http_port", "(/readyz answers 200 once the partitions are assigned, tables restored)"),
    ("log_level", "DEBUG, INFO, WARNING or ERROR; -l overrides it"),
    ("event_loop", "uvloop or asyncio; --loop overrides it"),
    ("security_protocol", "with NEARDUP_SASL_* and NEARDUP_SSL_CAFILE for a secured broker"),
)

USAGE = "usage: python -m neardup.kafka [-l LEVEL] worker [-l LEVEL] [-f FILE]"

INTRO = """\
Runs one neardup worker: it reads raw pages from Kafka, decides which are near-duplicates
of earlier ones, in the order of their fetch time, exactly as `neardup dedup` does, and
writes a decision per page, cluster merges and dead letters. Before it starts it creates
its topics if they are missing, and checks its local tables against the brokers' topics
(tables built on topics that no longer exist are discarded and rebuilt from the
changelogs). Workers with the same NEARDUP_APP_ID share the partitions, up to one
worker a partition.

It is configured from NEARDUP_* environment variables, not from options; these matter
most, shown with their defaults (all of them: docs/settings.md):
"""

OPTIONS = """\
options:
  -h, --help            this help
  -l, --loglevel LEVEL  crit, error, warn, info or debug: overrides NEARDUP_LOG_LEVEL
  -f, --logfile FILE    log to FILE rather than standard error
  --loop LOOP           (before `worker`) uvloop or aio: overrides NEARDUP_EVENT_LOOP

Faust runs the worker; its other worker options are passed on. Its web server stays off
unless --with-web is given: the worker's own serves NEARDUP_HTTP_HOST:NEARDUP_HTTP_PORT.
Faust's other commands (agents, tables, ...) run as Faust's, with their own --help.

Exit status: 0 after a stop (SIGTERM, Ctrl-C); 1 on a fatal error, said in one line;
2 on bad settings, a line per variable. A local broker for a first try:
  bash scripts/kafka-local.sh start && eval "$(bash scripts/kafka-local.sh env)"
"""


def _row(name: str, what: str, environ: Mapping[str, str]) -> str:
    variable = f"NEARDUP_{name.upper()}"
    default = Settings.model_fields[name].default
    line = f"  {variable}={'' if default is None else default}"
    given = environ.get(variable)
    if given is not None:  # never a secret: MAIN_SETTINGS holds none
        line += f"  (set here: {given})"
    return f"{line}\n      {what}"


def help_text(environ: Mapping[str, str]) -> str:
    """The help: what the worker runs, its main variables with their defaults (and the
    values ``environ`` sets), the options it takes."""
    rows = "\n".join(_row(name, what, environ) for name, what in MAIN_SETTINGS)
    return f"{USAGE}\n\n{INTRO}\n{rows}\n\n{OPTIONS}"
