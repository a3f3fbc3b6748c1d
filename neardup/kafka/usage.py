"""The worker's own help (``python -m neardup.kafka --help``, ``worker --help``).

The defaults shown are read from the settings model, so they cannot drift from it.
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
    ("state_dir", "the stores of the worker's tasks: a directory of its own per worker"),
    ("app_id", "consumer group, prefix of the internal topics and transactional ids"),
    ("topic_raw", "the pages to decide (JSON: url, fetched_at, content_type, html)"),
    ("topic_decisions", "a decision per page"),
    ("topic_merges", "cluster merges"),
    ("topic_rejects", "dead letters: pages that could not be read, with the reason"),
    ("partitions", "partitions of the topics the worker creates"),
    ("http_host", "where /metrics, /healthz and /readyz are served"),
    ("http_port", "(/readyz answers 200 once every task dealt to the worker is open)"),
    ("log_level", "DEBUG, INFO, WARNING or ERROR; -l overrides it"),
    ("security_protocol", "with NEARDUP_SASL_* and NEARDUP_SSL_CAFILE for a secured broker"),
)

USAGE = "usage: python -m neardup.kafka worker [-l LEVEL] [-f FILE]"

INTRO = """\
Runs one neardup worker: it reads raw pages from Kafka, decides which are near-duplicates
of earlier ones, in the order of their fetch time, exactly as `neardup dedup` does, and
writes a decision per page, cluster merges and dead letters, in Kafka transactions:
read them with isolation.level=read_committed. Before it starts it creates its topics if
they are missing. Workers with the same NEARDUP_APP_ID share the tasks: one for each raw
partition, one for each of the NEARDUP_PARTITIONS internal partitions, and the ordered
step.

It is configured from NEARDUP_* environment variables, not from options; these matter
most, shown with their defaults (all of them: docs/settings.md):
"""

OPTIONS = """\
options:
  -h, --help            this help
  -l, --loglevel LEVEL  critical, error, warning, info or debug: overrides
                        NEARDUP_LOG_LEVEL
  -f, --logfile FILE    log to FILE rather than standard error
  --version             the version of neardup

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
