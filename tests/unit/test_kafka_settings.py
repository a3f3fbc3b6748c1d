"""The worker's settings as the Kafka clients get them, its topics, and its start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.kafka.__main__ import RUNNING_MARKER, prepare_state, release_state
from worker.kafka.security import aiokafka_kwargs, faust_credentials
from worker.kafka.topics import TopicNames
from worker.settings import Settings


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


def test_a_worker_that_did_not_stop_cleanly_loses_its_local_tables(tmp_path: Path) -> None:
    tables = tmp_path / "v1" / "tables"
    tables.mkdir(parents=True)
    (tables / "state-0.db").write_text("x")
    assert not prepare_state(str(tmp_path), str(tables))  # first start: nothing to fear
    assert (tables / "state-0.db").exists() and (tmp_path / RUNNING_MARKER).exists()
    # killed: the marker stays, and the next start discards the local tables
    assert prepare_state(str(tmp_path), str(tables))
    assert not tables.exists()
    release_state(str(tmp_path))  # a clean stop
    assert not (tmp_path / RUNNING_MARKER).exists()
    assert not prepare_state(str(tmp_path), str(tables))


def test_the_sandbox_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_MAX_MB", "512")
    monkeypatch.setenv("NEARDUP_ENGINE__MAX_TEXT_CHARS", "200000")
    cfg = Settings().engine_config()
    assert (cfg.extract_timeout_s, cfg.extract_max_mb, cfg.max_text_chars) == (2.5, 512, 200000)
    monkeypatch.setenv("NEARDUP_ENGINE__EXTRACT_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="extract_timeout_s"):
        Settings().engine_config()


def test_topics_the_worker_creates_take_its_largest_messages() -> None:
    from worker.contract import max_line_bytes
    from worker.kafka.topics import STATE_MAX_MESSAGE_BYTES, _configs

    settings = Settings(partitions=3)
    names = TopicNames.of(settings)
    fixed = names.fixed(settings)
    raw = int(_configs(names.raw, names, fixed, settings)["max.message.bytes"])
    assert raw > max_line_bytes(settings.engine.max_bytes) > 1 << 20
    assert _configs(names.sequence, names, fixed, settings) == {
        "max.message.bytes": str(STATE_MAX_MESSAGE_BYTES)
    }
    assert _configs(names.decisions, names, fixed, settings) == {}
