"""The worker's settings as the Kafka clients get them, its topics, and its start-up."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from neardup.kafka.__main__ import RUNNING_MARKER
from neardup.kafka.security import (
    REDACTED,
    aiokafka_kwargs,
    describe,
    install_log_redaction,
    secret_forms,
)
from neardup.kafka.topology import Topics
from neardup.settings import RETIRED_VARIABLES, Settings


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
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "s3cret-pw" not in text


def test_plaintext_has_no_credentials() -> None:
    settings = Settings()
    assert aiokafka_kwargs(settings) == {"security_protocol": "PLAINTEXT"}


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
    from neardup.kafka.topics import INTERNAL_MAX_MESSAGE_BYTES, _configs

    settings = Settings(partitions=3)
    topics = Topics.of(settings)
    raw = int(_configs(topics.raw, topics, settings)["max.message.bytes"])
    assert raw > max_line_bytes(settings.engine.max_bytes) > 1 << 20
    internal = {"max.message.bytes": str(INTERNAL_MAX_MESSAGE_BYTES)}
    for name in (topics.hosts, topics.probes, topics.pages, topics.order):
        assert _configs(name, topics, settings) == internal
    for name in (topics.analyse_changelog, topics.part_changelog, topics.order_changelog):
        assert _configs(name, topics, settings) == {**internal, "cleanup.policy": "compact"}
    assert _configs(topics.decisions, topics, settings) == {}


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


class FakeAdmin:
    """aiokafka's admin client over a broker's topics: ``made`` holds each topic's partition
    count. The first ``unknown_for`` describes answer every topic as not known yet (a
    broker whose metadata lags its CreateTopics); with ``auto_create`` a described topic
    that does not exist is made, with one partition (``auto.create.topics.enable``)."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}
        self.unknown_for = 0
        self.auto_create = False
        self.described = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return list(self.made)

    async def create_topics(self, new: list[Any]) -> object:
        self.made.update((t.name, t.num_partitions) for t in new)

        class Response:  # CreateTopics answers each topic with an error code
            topic_errors = tuple((t.name, 0, None) for t in new)

        return Response()

    async def describe_topics(self, names: list[str]) -> list[dict[str, object]]:
        self.described += 1
        if self.described <= self.unknown_for:
            return [{"topic": t, "error_code": 3, "partitions": []} for t in names]
        if self.auto_create:
            for name in names:
                self.made.setdefault(name, 1)
        return [
            {"topic": t, "error_code": 0, "partitions": [0] * self.made[t]}
            if t in self.made
            else {"topic": t, "error_code": 3, "partitions": []}
            for t in names
        ]


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    """A ``FakeAdmin`` with no topics, which every admin client the worker makes talks to."""
    import aiokafka.admin  # type: ignore[import-untyped]

    fake = FakeAdmin()
    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", lambda **kwargs: fake)
    return fake


def test_topics_created_a_moment_ago_are_awaited_not_taken_for_the_wrong_size(
    admin: FakeAdmin,
) -> None:
    """Seen in CI under load: right after create_topics the broker described the new
    topics with an error and no partitions, and the worker refused to start, saying
    they had the wrong number of partitions (None, not 1)."""
    from neardup.kafka.topics import ensure_topics

    settings = Settings(partitions=2)
    admin.unknown_for = 2
    counts = asyncio.run(ensure_topics(settings, timeout_s=5))
    assert counts == Topics.of(settings).partitions(2, 2) and admin.described == 3


def test_a_stop_that_hangs_ends_the_worker_anyway_saying_why() -> None:
    """``exit_later`` (armed at the first SIGTERM or SIGINT, NEARDUP_STOP_GRACE_S) exits 1
    with the reason when the shutdown has not ended by then."""
    import subprocess
    import sys

    hung = (
        "import logging, time\n"
        "from neardup.kafka.__main__ import exit_later\n"
        "logging.basicConfig()\n"
        "exit_later(RuntimeError('stopping on SIGTERM: not stopped in time'), 0.3)\n"
        "time.sleep(30)\n"  # a shutdown that never ends
    )
    done = subprocess.run(
        [sys.executable, "-c", hung], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 1
    assert "not stopped in time (the shutdown hung for 0 s; exiting)" in done.stderr


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
        "neardup_order_wait_mss": "10",  # any case, as the settings read them
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
        "neardup_order_wait_mss is set but is not a setting of the worker: ignored; did you "
        "mean NEARDUP_ORDER_WAIT_MS?",
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
    # (the retired settings are named in the code that says they are retired)
    assert unknown_variables(dict.fromkeys(names - set(RETIRED_VARIABLES), "x")) == []


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


def test_a_retired_setting_is_named_as_such_and_ignored() -> None:
    from neardup.settings import refused_variables, unknown_variables

    environ = {"NEARDUP_STANDBY_REPLICAS": "1", "neardup_event_loop": "uvloop"}
    assert unknown_variables(environ) == [
        f"{var} is set but is no longer a setting (the worker has one topology, the "
        "partitioned one): ignored"
        for var in ("NEARDUP_STANDBY_REPLICAS", "neardup_event_loop")
    ]
    assert refused_variables(environ) == []
    assert refused_variables({"NEARDUP_TOPOLOGY": " Partitioned "}) == []


@pytest.mark.parametrize("topology", ["routed", "sequential", ""])
def test_another_topology_asked_for_stops_the_worker_with_what_to_do(
    topology: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The routed worker's internal topics (``<app>-probes`` among them) and its group's
    offsets are not the partitioned worker's: it must not start on them."""
    from neardup.kafka import __main__ as entry

    monkeypatch.setenv("NEARDUP_TOPOLOGY", topology)
    monkeypatch.setattr(entry, "run_worker", lambda settings: pytest.fail("started"))
    assert entry.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"neardup worker: NEARDUP_TOPOLOGY={topology}: the worker runs")
    assert "new NEARDUP_APP_ID" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_a_missing_raw_topic_is_created_with_neardup_partitions_not_described_first(
    admin: FakeAdmin,
) -> None:
    """A broker that creates topics on first use (``auto.create.topics.enable``, Kafka's
    default) makes a topic a metadata request names, with its own partition count: the raw
    topic, described before it exists, came out with one partition."""
    from neardup.kafka.topics import ensure_topics

    settings = Settings(partitions=4)
    topics = Topics.of(settings)
    admin.auto_create = True
    counts = asyncio.run(ensure_topics(settings, timeout_s=5))
    assert counts[topics.raw] == 4 and admin.made[topics.raw] == 4
    # a raw topic made before keeps its own count, and the analyse tasks follow it
    admin.made.clear()
    admin.made[topics.raw] = 3
    counts = asyncio.run(ensure_topics(settings, timeout_s=5))
    assert counts[topics.raw] == counts[topics.analyse_changelog] == 3


def test_the_group_instance_id_is_a_setting_checked_at_start() -> None:
    from neardup.settings import settings_problem, unknown_variables

    assert Settings(group_instance_id="neardup-0").group_instance_id == "neardup-0"
    assert Settings().group_instance_id is None
    assert unknown_variables({"NEARDUP_GROUP_INSTANCE_ID": "neardup-0"}) == []
    # Kafka's own rule for the name: a refusal at start, not a broker error at join
    with pytest.raises(ValidationError) as caught:
        Settings(group_instance_id="pod 0")
    assert (
        settings_problem(caught.value).splitlines()[1].startswith("  NEARDUP_GROUP_INSTANCE_ID: ")
    )


def _described(group: str, *members: tuple[str, str]) -> list[dict[str, Any]]:
    """A DescribeGroups answer (``to_object`` form) with these (member id, client id)."""
    return [
        {
            "groups": [
                {
                    "group": group,
                    "members": [
                        {"member_id": m, "client_id": c, "client_host": "/10.0.0.5"}
                        for m, c in members
                    ],
                }
            ]
        }
    ]


def test_a_static_member_tells_its_own_place_from_one_taken_by_another_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from neardup.kafka.membership import StaticMember, holder_of

    member = StaticMember("neardup", "pod-1", "127.0.0.1:1", {})
    assert member.kwargs == {"group_instance_id": "pod-1", "client_id": "neardup-pod-1"}
    answer = _described("neardup", ("pod-0-a", "neardup-pod-0"), ("pod-1-b", "neardup-pod-1"))
    assert holder_of(answer, "neardup", "neardup-pod-1") == "pod-1-b"
    assert holder_of(answer, "other", "neardup-pod-1") is None

    holders = iter(["pod-1-b", "pod-1-b", "pod-1-c", None])

    async def holder() -> str | None:
        return next(holders)

    monkeypatch.setattr(member, "_holder", holder)

    async def run() -> list[str | None]:
        await member.joined()  # assigned: the place is this process's, under pod-1-b
        return [await member.replaced() for _ in range(3)]

    same, taken, expired = asyncio.run(run())
    assert same is None and expired is None  # a rebalance; the session timed out
    assert taken is not None and "NEARDUP_GROUP_INSTANCE_ID=pod-1" in taken
    assert "an id of its own" in taken and "\n" not in taken


def test_a_static_member_that_cannot_ask_the_group_goes_on() -> None:
    """No broker to ask: not known to be replaced, so the rejoin goes ahead."""
    from neardup.kafka.membership import StaticMember

    member = StaticMember("neardup", "pod-1", "127.0.0.1:1", {})
    member.member_id = "pod-1-a"
    assert asyncio.run(member.replaced()) is None
