"""Worker settings: one frozen object read from NEARDUP_* environment variables.

Every field's variable is ``NEARDUP_`` + its name in upper case (``NEARDUP_BROKERS``...).
Engine parameters are ``NEARDUP_ENGINE__<FIELD>`` (e.g. ``NEARDUP_ENGINE__K1=3``). The Helm
chart's values map one to one onto these variables. Secrets are ``SecretStr``: their
values never appear in ``repr``, logs or metrics.
"""

from __future__ import annotations

import difflib
import ssl
import sys
from collections.abc import Mapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from neardup.config import EngineConfig

_DEFAULT = EngineConfig()


class EngineSettings(BaseModel):
    """Engine parameters that may be set from the environment (see ``EngineConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    extractor: str = _DEFAULT.extractor
    k1: int = _DEFAULT.k1
    k2: int = _DEFAULT.k2
    blocks: int = _DEFAULT.blocks
    bucket_cap: int = _DEFAULT.bucket_cap
    retention_days: int = _DEFAULT.retention_days
    template_idle_days: int = _DEFAULT.template_idle_days
    max_bytes: int = _DEFAULT.max_bytes
    max_text_chars: int = _DEFAULT.max_text_chars
    extract_timeout_s: float = _DEFAULT.extract_timeout_s
    extract_max_mb: int = _DEFAULT.extract_max_mb

    @model_validator(mode="after")
    def _consistent(self) -> EngineSettings:
        # EngineConfig's own checks (k1 <= k2, a known extractor ...), at start-up, as a
        # settings error naming the variables rather than a traceback from the engine
        self.config()
        return self

    def config(self) -> EngineConfig:
        return EngineConfig(**self.model_dump())


class Settings(BaseSettings):
    """Everything the worker reads at start-up, validated once."""

    model_config = SettingsConfigDict(
        env_prefix="NEARDUP_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    #: Kafka bootstrap servers, comma-separated host:port (NEARDUP_BROKERS).
    brokers: str = "127.0.0.1:19092"
    #: Application id: the consumer group, and the prefix of the internal topics and of
    #: the transactional ids (NEARDUP_APP_ID).
    app_id: str = "neardup"
    #: Topics (NEARDUP_TOPIC_RAW, ..._DECISIONS, ..._MERGES, ..._REJECTS).
    topic_raw: str = "neardup.raw-pages"
    topic_decisions: str = "neardup.decisions"
    topic_merges: str = "neardup.cluster-merges"
    topic_rejects: str = "neardup.rejected-pages"
    #: Partitions of the topics the worker creates (NEARDUP_PARTITIONS); the internal
    #: topics' count is fixed once their state exists.
    partitions: int = Field(default=6, ge=1, le=1024)
    #: Replication factor of the topics the worker creates (NEARDUP_REPLICATION).
    replication: int = Field(default=1, ge=1)
    #: RocksDB state directory (NEARDUP_STATE_DIR).
    state_dir: str = "/var/lib/neardup"
    #: RocksDB memory of the worker, MiB (NEARDUP_CACHE_MB): one block cache shared by all
    #: the task stores it owns, however many, into which their memtables are charged too
    #: (flushed once they hold half of it). Count it on top of the process's own memory;
    #: more keeps more of the index's blocks in memory.
    cache_mb: int = Field(default=256, ge=16, le=1 << 20)
    #: How often a task that has read all its input sends its mark again
    #: (NEARDUP_MARK_INTERVAL_MS); it also sends it whenever it changes.
    mark_interval_ms: int = Field(default=500, ge=50, le=60_000)
    #: How long a page waits, at most, for a mark made after it arrived from each
    #: upstream task before that task's last mark is taken for it
    #: (NEARDUP_ORDER_WAIT_MS; 0: wait as long as it takes). A worker that died sends no
    #: marks until its tasks have a new owner; this bounds the stall.
    order_wait_ms: int = Field(default=60_000, ge=0, le=86_400_000)
    #: How far the raw topic's partitions may be out of step (NEARDUP_RAW_SKEW_MS): a page
    #: may be written up to this long after a page with a later fetch time on another
    #: partition, and the workers' clocks may differ by up to this much, together. At the
    #: hosts stage, an analyse task that has read all of its partition vouches only for
    #: pages that came this long before; a page waits that much longer for an idle raw
    #: partition.
    raw_skew_ms: int = Field(default=2_000, ge=0, le=3_600_000)
    #: A worker that stops heartbeating leaves its group after this long, and its
    #: tasks move (NEARDUP_SESSION_TIMEOUT_MS).
    session_timeout_ms: int = Field(default=10_000, ge=6_000, le=300_000)
    #: This worker's static member name in the group, unique to it and kept across its
    #: restarts (NEARDUP_GROUP_INSTANCE_ID; the chart sets the pod's name). A worker that
    #: comes back within the session timeout gets its tasks back and the others are not
    #: rebalanced; one that stops, even on SIGTERM, holds its tasks until then. Unset: a
    #: dynamic member, whose tasks move at once on SIGTERM.
    group_instance_id: str | None = Field(
        default=None, min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$"
    )
    #: Seconds a stop (SIGTERM, SIGINT) may take before the worker exits anyway, status 1
    #: (NEARDUP_STOP_GRACE_S): a Kafka client that stops waits on its broker, so a worker
    #: told to stop while the broker is away could otherwise run until SIGKILL. Keep it
    #: under the orchestrator's own grace (the chart's 60 s).
    stop_grace_s: float = Field(default=45.0, ge=1, le=3600)
    #: Metrics and health endpoint (NEARDUP_HTTP_HOST, NEARDUP_HTTP_PORT).
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    #: Broker security: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (NEARDUP_SECURITY_PROTOCOL).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: SASL mechanism and credentials (NEARDUP_SASL_MECHANISM, _USERNAME, _PASSWORD); a
    #: SASL protocol needs both user name and password.
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = Field(default=None, validate_default=True)
    sasl_password: SecretStr | None = Field(default=None, validate_default=True)
    #: CA bundle for TLS (NEARDUP_SSL_CAFILE).
    ssl_cafile: str | None = None
    #: Log level (NEARDUP_LOG_LEVEL).
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: Engine parameters (NEARDUP_ENGINE__K1, ...).
    engine: EngineSettings = EngineSettings()

    @field_validator("brokers")
    @classmethod
    def _brokers(cls, value: str) -> str:
        hosts = [h.strip() for h in value.split(",") if h.strip()]
        if not hosts or any(":" not in h for h in hosts):
            raise ValueError("NEARDUP_BROKERS must be host:port[,host:port...]")
        return ",".join(hosts)

    @field_validator("sasl_username", "sasl_password")
    @classmethod
    def _sasl_credentials(
        cls, value: str | SecretStr | None, info: ValidationInfo
    ) -> str | SecretStr | None:
        # Refused here rather than by a model validator: pydantic's error would print the
        # whole input, password included. This one's input is empty, so shows nothing.
        protocol = str(info.data.get("security_protocol", ""))
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if protocol.startswith("SASL_") and not text:
            variable = f"NEARDUP_{info.field_name or ''}".upper()
            raise ValueError(f"NEARDUP_SECURITY_PROTOCOL={protocol} needs {variable}")
        return value

    @field_validator("ssl_cafile")
    @classmethod
    def _ca_bundle(cls, value: str | None) -> str | None:
        # read once here, so that a missing or unreadable bundle is a settings error at
        # start rather than a traceback when the first client connects
        if value:
            try:
                ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=value)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot read a CA bundle: {exc}") from exc
        return value

    def engine_config(self) -> EngineConfig:
        return self.engine.config()


#: Settings whose values are never shown, not even in an error about them.
_SECRET_FIELDS = frozenset({"sasl_password"})


def settings_problem(exc: ValidationError | SettingsError) -> str:
    """What is wrong with the settings, a line per problem, naming each variable: pydantic's
    own text is a paragraph per error with a documentation link. A secret's value is never
    shown; any other value is, shortened. (A SettingsError, a variable that is not the JSON
    a nested setting such as NEARDUP_ENGINE needs, names the field and never the value.)"""
    if isinstance(exc, SettingsError):
        return f"bad settings:\n  {exc}"
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        # the engine's own checks concern several of its variables at once
        variable = "NEARDUP_" + "__".join(loc).upper() if loc else "NEARDUP_*"
        if loc == ["engine"]:
            variable = "NEARDUP_ENGINE__*"
        msg = str(err["msg"]).removeprefix("Value error, ")
        shown = ""
        if loc and loc[0] not in _SECRET_FIELDS and isinstance(err.get("input"), str | int | float):
            value = repr(err["input"])
            shown = f" (got {value[:80]}{'...' if len(value) > 80 else ''})"
        lines.append(f"{variable}: {msg}{shown}")
    return "bad settings:\n  " + "\n  ".join(lines)


def read_settings(command: str, **overrides: object) -> Settings | None:
    """The settings from the environment (and ``overrides``), or None after saying on
    standard error, as ``command``, what is wrong with them (``settings_problem``)."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except (ValidationError, SettingsError) as exc:
        print(f"{command}: {settings_problem(exc)}", file=sys.stderr)
        return None


#: NEARDUP_* variables that other parts of the project read: the lexicon cache and the
#: native fingerprint stage's switch (``neardup.fingerprint``), CI's demand for that stage
#: (``.ci/run``), scripts/get-helm.sh's, the fault tests' seed, and every NEARDUP_KAFKA_*
#: of scripts/kafka-local.sh. Not settings, and not typos of one.
OTHER_VARIABLES = ("NEARDUP_CACHE_DIR", "NEARDUP_NATIVE", "NEARDUP_EXPECT_NATIVE",
                   "NEARDUP_TOOLS", "NEARDUP_HELM_VERSION", "NEARDUP_FAULT_SEED")  # fmt: skip
OTHER_PREFIXES = ("NEARDUP_KAFKA_",)

#: Settings of the Faust worker, removed with it: set, each is named as no longer read.
RETIRED_VARIABLES = ("NEARDUP_TOPOLOGY", "NEARDUP_PROCESSING_GUARANTEE",
                     "NEARDUP_COMMIT_INTERVAL_MS", "NEARDUP_MAX_BACKLOG",
                     "NEARDUP_SEQUENCER_WEIGHT", "NEARDUP_ROCKSDB_MEMORY_MB",
                     "NEARDUP_STANDBY_REPLICAS", "NEARDUP_EVENT_LOOP")  # fmt: skip


def refused_variables(environ: Mapping[str, str]) -> list[str]:
    """Why the worker must not start under ``environ``, a line each: a topology other than
    the partitioned one asked for. Its internal topics, consumer group offsets and state
    are not the partitioned worker's, which must not start on them."""
    out = []
    for var, value in sorted(environ.items()):
        if var.upper() == "NEARDUP_TOPOLOGY" and value.strip().lower() != "partitioned":
            out.append(
                f"{var}={value}: the worker runs the partitioned topology only, the routed "
                "and sequential ones are gone. Unset it, and start the partitioned worker on "
                "a new NEARDUP_APP_ID and an empty NEARDUP_STATE_DIR: it cannot read the "
                "internal topics and state of another topology (docs/kafka.md)"
            )
    return out


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each NEARDUP_* variable in ``environ`` that no setting reads, naming
    the setting it is closest to: a misspelt one is otherwise ignored without a word, and
    the worker runs on the default. (A misspelt NEARDUP_ENGINE__* is refused at start.)"""
    known = {f"NEARDUP_{name.upper()}" for name in Settings.model_fields}
    names = sorted(known | set(OTHER_VARIABLES))
    out = []
    for var in sorted(environ):
        name = var.upper()  # the settings read their variables in any case
        if (
            not name.startswith("NEARDUP_")
            or name in names
            or name.startswith(("NEARDUP_ENGINE__", *OTHER_PREFIXES))
        ):
            continue
        if name in RETIRED_VARIABLES:
            out.append(
                f"{var} is set but is no longer a setting (the worker has one topology, "
                "the partitioned one): ignored"
            )
            continue
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
        hint = f"; did you mean {near[0]}?" if near else ""
        out.append(f"{var} is set but is not a setting of the worker: ignored{hint}")
    return out
