"""neardup.produce without a broker: line reading, producer arguments, the command end to end
against a stand-in producer."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
from pathlib import Path
from typing import Any

import certifi
import pytest
from aiokafka.errors import KafkaError

from neardup import produce
from neardup.produce import InputError, Line, check_inputs, iter_lines, message_key
from neardup.settings import Settings

SECRET = "s3cret-Пароль-do-not-print"
PAGE = {
    "url": "https://news.example.cn/a.html",
    "fetched_at": "2026-03-01T08:00:00Z",
    "content_type": "text/html; charset=utf-8",
    "html": "<p>地铁三号线今日开通</p>",
}


def _collect(paths: list[str], limit: int = 1 << 20) -> tuple[list[Line], list[str], list[str]]:
    too_large: list[str] = []
    broken: list[str] = []
    lines = list(iter_lines(paths, limit, too_large.append, broken.append))
    return lines, too_large, broken


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"NEARDUP_{name.upper()}", raising=False)


def _lines_file(tmp_path: Path, raw: bytes, gz: bool = False) -> str:
    path = tmp_path / ("in.jsonl.gz" if gz else "in.jsonl")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return str(path)


@pytest.mark.parametrize("gz", [False, True])
def test_lines_are_sent_byte_for_byte(tmp_path: Path, gz: bool) -> None:
    # ensure_ascii escapes, odd spacing and key order must all survive: the worker validates
    # the original, so the producer never re-encodes.
    first = json.dumps(PAGE, ensure_ascii=True).encode()
    second = b'{ "html":"<p>\xe4\xbd\xa0\xe5\xa5\xbd</p>",  "url" : "https://b.example.cn/x" }'
    raw = first + b"\n\n   \n" + second + b"\r\nnot json at all\n[1, 2]\n"
    lines, too_large, broken = _collect([_lines_file(tmp_path, raw, gz)])
    assert [x.value for x in lines] == [first, second, b"not json at all", b"[1, 2]"]
    assert [x.key for x in lines] == [PAGE["url"].encode(), b"https://b.example.cn/x", None, None]
    assert [x.source.rsplit(":", 1)[1] for x in lines] == ["1", "4", "5", "6"]
    assert too_large == [] and broken == []


def test_last_line_without_newline(tmp_path: Path) -> None:
    lines, _, _ = _collect([_lines_file(tmp_path, b'{"url": "u1"}\n{"url": "u2"}')])
    assert [x.value for x in lines] == [b'{"url": "u1"}', b'{"url": "u2"}']


@pytest.mark.parametrize("newline_at_end", [True, False])
def test_too_long_line_is_reported_and_skipped(tmp_path: Path, newline_at_end: bool) -> None:
    long_line = b'{"url": "big", "html": "' + b"x" * 500 + b'"}'
    raw = (
        b'{"url": "a"}\n' + long_line + b"\n" + b'{"url": "b"}' + (b"\n" if newline_at_end else b"")
    )
    lines, too_large, _ = _collect([_lines_file(tmp_path, raw)], limit=100)
    assert [x.key for x in lines] == [b"a", b"b"]
    assert too_large == [f"{tmp_path / 'in.jsonl'}:2"]


def test_line_of_exactly_the_limit_is_sent(tmp_path: Path) -> None:
    line = b'{"url": "u"}'.ljust(100, b" ")
    lines, too_large, _ = _collect([_lines_file(tmp_path, line + b"\r\n")], limit=100)
    assert [x.value for x in lines] == [line] and too_large == []


def test_broken_gzip_stops_that_file_only(tmp_path: Path) -> None:
    whole = gzip.compress(b'{"url": "a"}\n' * 2000)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(whole[: len(whole) // 2])
    good = _lines_file(tmp_path, b'{"url": "z"}\n')
    lines, _, broken = _collect([str(bad), good])
    assert lines[-1].key == b"z"
    assert len(broken) == 1 and "rest of file skipped" in broken[0]


@pytest.mark.parametrize("gz", [False, True])
def test_a_fifo_is_read_once_and_a_leading_bom_dropped(tmp_path: Path, gz: bool) -> None:
    """A pipe gives its bytes once: checking the inputs must not drain it, and the lines
    come out whole (the worker's reader skips a leading BOM too)."""
    import os
    import signal
    import threading

    raw = b"\xef\xbb\xbf" + json.dumps(PAGE).encode() + b'\n{"url": "u2"}\n'
    fifo = tmp_path / "pages.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(gzip.compress(raw) if gz else raw,))
    writer.start()

    def stuck(*_: object) -> None:  # a second open would wait for a writer for ever
        raise TimeoutError("the FIFO was opened twice")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        check_inputs([str(fifo)])
        lines, too_large, broken = _collect([str(fifo)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    writer.join(timeout=10)
    assert [x.key for x in lines] == [PAGE["url"].encode(), b"u2"]
    assert lines[0].value == json.dumps(PAGE).encode() and too_large == broken == []


def test_inputs_checked_before_sending(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such input file"):
        check_inputs([str(tmp_path / "nope.jsonl")])
    warc = tmp_path / "a.warc.gz"
    warc.write_bytes(gzip.compress(b"WARC/1.1\r\nWARC-Type: warcinfo\r\n\r\n"))
    with pytest.raises(InputError, match="WARC"):
        check_inputs([str(warc)])
    check_inputs([_lines_file(tmp_path, b"{}\n"), "-"])


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (b'{"url": "https://a.cn/\\u4e2d"}', "https://a.cn/中".encode()),
        (b'{"url": ""}', None),
        (b'{"url": 5}', None),
        (b'{"url": "\\ud800"}', None),
        (b'"just a string"', None),
        (b"\xff\xfe", None),
    ],
)
def test_message_key(value: bytes, key: bytes | None) -> None:
    assert message_key(value) == key


def test_kwargs_plaintext() -> None:
    kwargs = produce.producer_kwargs(Settings(brokers="k1:9092, k2:9092"), max_request_size=1234)
    assert kwargs == {
        "bootstrap_servers": "k1:9092,k2:9092",
        "client_id": "neardup-producer",
        "acks": "all",
        "enable_idempotence": True,
        "max_request_size": 1234,
        "linger_ms": 5,
        "security_protocol": "PLAINTEXT",
    }


def test_kwargs_sasl_ssl_scram(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    real = ssl.create_default_context

    def fake_context(purpose: ssl.Purpose, *, cafile: str | None = None) -> ssl.SSLContext:
        seen.append(cafile)
        return real(purpose)

    monkeypatch.setattr(ssl, "create_default_context", fake_context)
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("NEARDUP_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("NEARDUP_SASL_USERNAME", "crawler")
    monkeypatch.setenv("NEARDUP_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("NEARDUP_SSL_CAFILE", certifi.where())
    settings = Settings()
    assert SECRET not in repr(settings)
    kwargs = produce.producer_kwargs(settings, max_request_size=1)
    assert seen[-1] == certifi.where()  # the settings read it once, then the client
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "crawler"
    assert kwargs["sasl_plain_password"] == SECRET


def test_kwargs_ssl_without_ca_uses_system_store() -> None:
    kwargs = produce.producer_kwargs(Settings(security_protocol="SSL"), max_request_size=1)
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert "sasl_mechanism" not in kwargs


class FakeProducer:
    """Stands in for AIOKafkaProducer; a value containing b"FAIL" is not delivered."""

    last: FakeProducer | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.stopped = False
        FakeProducer.last = self

    async def start(self) -> None:
        if self.kwargs["bootstrap_servers"].startswith("down:"):
            raise KafkaError("Unable to bootstrap from down:9092")

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.sent.append((topic, key, value))
        if b"FAIL" in value:
            future.set_exception(KafkaError("MessageSizeTooLargeError"))
        else:
            future.set_result(None)
        return future

    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def sasl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(produce, "AIOKafkaProducer", FakeProducer)
    monkeypatch.setenv("NEARDUP_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("NEARDUP_SASL_USERNAME", "crawler")
    monkeypatch.setenv("NEARDUP_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("NEARDUP_TOPIC_RAW", "raw.from-env")


def test_main_sends_counts_and_never_prints_the_password(
    tmp_path: Path, sasl_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.dumps(PAGE, ensure_ascii=False).encode()
    path = _lines_file(tmp_path, good + b"\n" + b'{"url": "x", "html": "FAIL"}\n' + good + b"\n")
    code = produce.main([path, "--brokers", "kafka:19092"])
    out, err = capsys.readouterr()
    fake = FakeProducer.last
    assert fake is not None and fake.stopped
    assert fake.kwargs["sasl_plain_password"] == SECRET
    assert fake.kwargs["bootstrap_servers"] == "kafka:19092"
    assert fake.sent[0][0] == "raw.from-env" and fake.sent[0][2] == good
    assert code == produce.EXIT_FATAL
    assert "sent 2 messages to raw.from-env at kafka:19092 (0 too large, 1 failed" in out
    assert f"{path}:2: not delivered" in err
    assert SECRET not in out + err


def test_main_reports_an_unreachable_broker(
    tmp_path: Path, sasl_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _lines_file(tmp_path, b'{"url": "a"}\n')
    assert produce.main([path, "--brokers", "down:9092", "--topic", "t"]) == produce.EXIT_FATAL
    out, err = capsys.readouterr()
    assert "cannot produce to NEARDUP_BROKERS=down:9092" in err and SECRET not in out + err


def test_main_too_large_exit_status(
    tmp_path: Path, sasl_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _lines_file(tmp_path, b'{"url": "a"}\n{"url": "' + b"b" * 200 + b'"}\n')
    assert produce.main([path, "--max-message-bytes", "50"]) == produce.EXIT_NOT_SENT
    assert "sent 1 messages" in capsys.readouterr().out


def test_main_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert produce.main([str(tmp_path / "missing.jsonl")]) == produce.EXIT_USAGE
    assert produce.main([_lines_file(tmp_path, b"{}\n"), "--brokers", "nohostport"]) == (
        produce.EXIT_USAGE
    )
    assert "NEARDUP_BROKERS" in capsys.readouterr().err
