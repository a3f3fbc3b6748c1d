"""The worker and the producer against a broker that wants SASL, with and without TLS, and
grants by ACL.

A session fixture makes a throwaway CA and a broker certificate for 127.0.0.1 with the
``openssl`` command line (present wherever Python's ssl module is built, and needing no new
Python dependency; the keystore is PKCS12, which the JDK reads natively, so keytool is not
needed either), and starts its own broker with ``scripts/kafka-local.sh`` in secured mode
with an authorizer: SASL_PLAINTEXT and SASL_SSL listeners, PLAIN and SCRAM users, who may
do only what ACLs grant them. The test grants them over the PLAINTEXT listener, whose
clients are super users. Then the real worker process, with the ACLs docs/kafka.md lists
and no others, and ``python -m neardup.produce``, as a crawler allowed to write the raw
topic only, run over each listener: pages in, decisions out, the password nowhere in what
they print or serve. Without its transactional or group ACL the worker stops in one line
naming what to grant.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from neardup.kafka.security import connection_problem, describe
from neardup.settings import Settings
from tests.integration.conftest import _no_broker
from tests.integration.helpers import (
    ROOT,
    Collector,
    LocalBroker,
    Names,
    WorkerProcess,
    fold,
    free_port,
    listening,
    reference,
    stable,
    stream,
    wait_for,
)

pytestmark = pytest.mark.integration

USER = "neardup-it"
#: Distinctive, so that finding it anywhere can only be a leak.
PASSWORD = "Zq7-canary-9fK2x-pw"
WRONG = "Wv4-wrong-3hT8y-pw"
#: The crawler's user: it may write the raw topic, nothing else.
CRAWLER = "crawler-it"
CRAWLER_PASSWORD = "Kc3-canary-5mR7q-pw"
DEADLINE = 120.0


@dataclass(frozen=True)
class SecureBroker:
    sasl_plaintext: str
    sasl_ssl: str
    cafile: str
    #: The PLAINTEXT listener: its clients are super users (granting ACLs, reading outputs).
    plaintext: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(where: Path, keystore_password: str) -> tuple[Path, Path]:
    """A CA (valid for 2 days) and a broker certificate for IP 127.0.0.1 signed by it, in
    a PKCS12 keystore with the CA in its chain; returns (CA certificate, keystore)."""
    where.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=neardup throwaway test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=where,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=127.0.0.1",
        cwd=where,
    )  # fmt: skip
    (where / "broker.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "broker.ext", "-out", "broker.crt",
        cwd=where,
    )  # fmt: skip
    _openssl(
        "pkcs12", "-export", "-in", "broker.crt", "-inkey", "broker.key", "-certfile", "ca.crt",
        "-name", "broker", "-out", "broker.p12", "-passout", f"pass:{keystore_password}",
        cwd=where,
    )  # fmt: skip
    return where / "ca.crt", where / "broker.p12"


@pytest.fixture(scope="session")
def secure_broker() -> Iterator[SecureBroker]:
    """A broker of its own in secured mode with an authorizer, whatever
    KAFKA_BOOTSTRAP_SERVERS says."""
    missing = [tool for tool in ("java", "mvn", "openssl") if not shutil.which(tool)]
    if missing:
        _no_broker(f"the secured broker needs {', '.join(missing)}")
    run_dir = Path(tempfile.mkdtemp(prefix="neardup-kafka-secure-"))
    cafile, keystore = make_pki(run_dir / "pki", "ks-pw-throwaway")
    sasl_port, ssl_port = free_port(), free_port()
    broker = LocalBroker(
        run_dir / "kafka",
        {
            "NEARDUP_KAFKA_SECURE": "1",
            "NEARDUP_KAFKA_ACLS": "1",
            "NEARDUP_KAFKA_SASL_PORT": str(sasl_port),
            "NEARDUP_KAFKA_SASL_SSL_PORT": str(ssl_port),
            "NEARDUP_KAFKA_SASL_USERS": f"{USER}:{PASSWORD},{CRAWLER}:{CRAWLER_PASSWORD}",
            "NEARDUP_KAFKA_SSL_KEYSTORE": str(keystore),
            "NEARDUP_KAFKA_SSL_KEYSTORE_PASSWORD": "ks-pw-throwaway",
        },
    )
    while len({broker.port, broker.port + 1, sasl_port, ssl_port}) < 4:
        sasl_port, ssl_port = free_port(), free_port()
        broker.env["NEARDUP_KAFKA_SASL_PORT"] = str(sasl_port)
        broker.env["NEARDUP_KAFKA_SASL_SSL_PORT"] = str(ssl_port)
    started = broker.run("start", check=False)
    if started.returncode != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        _no_broker(f"kafka-local.sh start (secured) failed:\n{started.stderr[-2000:]}")
    assert f"KAFKA_SASL_SSL_SERVERS=127.0.0.1:{ssl_port}" in started.stdout
    try:
        yield SecureBroker(
            f"127.0.0.1:{sasl_port}", f"127.0.0.1:{ssl_port}", str(cafile), broker.bootstrap
        )
    finally:
        broker.run("stop", check=False)
        shutil.rmtree(run_dir, ignore_errors=True)


# -- ACLs ------------------------------------------------------------------------------------

#: Kafka's codes (org.apache.kafka.common.acl and .resource).
_RESOURCE = {"Topic": 2, "Group": 3, "Cluster": 4, "TransactionalId": 5}
_PATTERN = {"literal": 3, "prefixed": 4}
_OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8}
_ALLOW = 3

Acl = tuple[str, str, str, str]  # resource type, name, pattern, operation


def worker_acls(names: Names) -> list[Acl]:
    """What the worker's user is granted: the table in docs/kafka.md, Security."""
    app = names.app_id
    return [
        ("Topic", names.raw, "literal", "Read"),
        ("Topic", names.raw, "literal", "Create"),
        *(("Topic", f"{app}-", "prefixed", op) for op in ("Read", "Write", "Create")),
        *(
            ("Topic", topic, "literal", op)
            for topic in (names.decisions, names.merges, names.rejects)
            for op in ("Write", "Create")
        ),
        ("Group", app, "literal", "Read"),
        ("TransactionalId", f"{app}-", "prefixed", "Write"),
    ]


def grant(broker: SecureBroker, user: str, acls: list[Acl]) -> None:
    """Allow ``user`` each of ``acls``, from any host (CreateAcls over the PLAINTEXT
    listener: aiokafka's admin client has no ACL call, its protocol has the request)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.admin import CreateAclsRequest

    async def create() -> None:
        client = AIOKafkaClient(bootstrap_servers=broker.plaintext)
        await client.bootstrap()
        try:
            node = client.get_random_node()
            for kind, name, pattern, op in acls:
                request = CreateAclsRequest(
                    _RESOURCE[kind], name, _PATTERN[pattern], f"User:{user}", "*",
                    _OPERATION[op], _ALLOW,
                )  # fmt: skip
                response = await client.send(node, request)
                assert [e for e, _ in response.creation_responses] == [0], response
        finally:
            await client.close()

    asyncio.run(create())


# -- the clients -----------------------------------------------------------------------------


def _settings(
    broker: SecureBroker, protocol: str, mechanism: str, password: str, user: str = USER
) -> Settings:
    return Settings(
        brokers=broker.sasl_ssl if protocol == "SASL_SSL" else broker.sasl_plaintext,
        security_protocol=protocol,  # type: ignore[arg-type]
        sasl_mechanism=mechanism,  # type: ignore[arg-type]
        sasl_username=user,
        sasl_password=password,  # type: ignore[arg-type]
        ssl_cafile=broker.cafile if protocol == "SASL_SSL" else None,
    )


def _env(settings: Settings) -> dict[str, str]:
    """The NEARDUP_* variables of the connection, as an operator would set them."""
    assert settings.sasl_password is not None and settings.sasl_username is not None
    env = {
        "NEARDUP_BROKERS": settings.brokers,
        "NEARDUP_SECURITY_PROTOCOL": settings.security_protocol,
        "NEARDUP_SASL_MECHANISM": settings.sasl_mechanism,
        "NEARDUP_SASL_USERNAME": settings.sasl_username,
        "NEARDUP_SASL_PASSWORD": settings.sasl_password.get_secret_value(),
        "NEARDUP_LOG_LEVEL": "DEBUG",
    }
    if settings.ssl_cafile:
        env["NEARDUP_SSL_CAFILE"] = settings.ssl_cafile
    return env


def _assert_no_secret(texts: dict[str, str]) -> None:
    for what, text in texts.items():
        for secret in (PASSWORD, WRONG, CRAWLER_PASSWORD):
            assert secret not in text, f"a SASL password is in {what}"


def _produce(names: Names, env: dict[str, str], pages: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neardup.produce", str(pages)],
        env={**os.environ, **env, "NEARDUP_TOPIC_RAW": names.raw},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _worker(settings: Settings, names: Names, tmp_path: Path) -> WorkerProcess:
    return WorkerProcess(
        settings.brokers,
        names,
        2,
        tmp_path / "state",
        tmp_path / "worker.log",
        env={**_env(settings), "NEARDUP_HTTP_HOST": "127.0.0.1"},
        loglevel="debug",
    )


CASES = [
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_SSL", "SCRAM-SHA-256"),
]


@pytest.mark.parametrize(("protocol", "mechanism"), CASES)
def test_pages_in_decisions_out(
    secure_broker: SecureBroker, tmp_path: Path, protocol: str, mechanism: str
) -> None:
    """The worker, granted the ACLs of docs/kafka.md and no others, and a crawler allowed
    to write the raw topic only, over a SASL listener: the sample is decided exactly as
    ``neardup dedup`` decides it; the worker's whole DEBUG log, its endpoint's answers and
    the producer's output never show a password; the endpoint listens where configured."""
    settings = _settings(secure_broker, protocol, mechanism, PASSWORD)
    crawler = _settings(secure_broker, protocol, mechanism, CRAWLER_PASSWORD, CRAWLER)
    values = stream(seeds=())  # the bundled sample, in decision order
    pages = tmp_path / "pages.jsonl"
    pages.write_bytes(b"".join(v + b"\n" for v in values))
    ref = reference(values, tmp_path)

    names = Names()
    grant(secure_broker, USER, worker_acls(names))
    grant(secure_broker, CRAWLER, [("Topic", names.raw, "literal", "Write")])
    worker = _worker(settings, names, tmp_path).start()
    # a downstream reader of its own, on the super user's listener, read_committed
    collector = Collector(secure_broker.plaintext, [names.decisions, names.merges, names.rejects])
    try:

        def ready() -> bool:
            if not worker.alive():
                raise AssertionError(f"the worker died:\n{worker.tail(40)}")
            return worker.get("/readyz") == 200

        wait_for(ready, DEADLINE, "the worker to be ready")
        # the endpoint: one listening socket, on the configured address and port
        assert worker.proc is not None
        assert listening(worker.proc.pid) == {("127.0.0.1", worker.port)}

        produced = _produce(names, _env(crawler), pages)
        assert produced.returncode == 0, produced.stderr
        assert f"sent {len(values)} messages" in produced.stdout

        want = {d["page_id"] for d in ref.decisions}

        def all_out() -> bool:
            if not worker.alive():
                raise AssertionError(f"the worker died:\n{worker.tail(40)}")
            decided = {d["page_id"] for d in collector.get(names.decisions)}
            return decided >= want and len(collector.get(names.rejects)) >= len(ref.rejects)

        wait_for(all_out, DEADLINE, "every page's decision or dead letter")
        decisions = {d["page_id"]: d for d in collector.get(names.decisions)}
        assert len(collector.get(names.decisions)) == len(ref.decisions)  # exactly once
        assert {stable(d) for d in decisions.values()} == {stable(d) for d in ref.decisions}
        assert fold(decisions.values(), collector.get(names.merges)) == ref.clusters
        assert sorted(r["reason"] for r in collector.get(names.rejects)) == sorted(
            r["reason"] for r in ref.rejects
        )
        # the worker counts a commit when it sees it end, which the reader may see first
        published = f'neardup_published_total{{topic="decisions"}} {len(ref.decisions)}.0'
        wait_for(lambda: published in worker.fetch("/metrics")[1], DEADLINE, "the count")
        served = {path: worker.fetch(path) for path in ("/metrics", "/healthz", "/readyz")}
        assert all(status == 200 for status, _ in served.values()), served
        assert published in served["/metrics"][1]
    finally:
        worker.stop()
        collector.close()
    log = worker.log.read_text(errors="replace")
    _assert_no_secret(
        {
            "the worker's log": log,
            "the producer's output": produced.stdout + produced.stderr,
            **{f"GET {path}": body for path, (_, body) in served.items()},
        }
    )
    # the clients did authenticate with the mechanism asked for (aiokafka's DEBUG lines)
    assert f"SaslHandShakeRequest_v1(mechanism='{mechanism}')" in log
    assert "SaslAuthenticate (payload redacted)" in log
    assert "AuthorizationFailed" not in log


@pytest.mark.parametrize(
    ("left_out", "said"),
    [
        ("TransactionalId", f"refuse user '{USER}' the transactional ids {{app}}-*: grant it "
         "Write on TransactionalId prefix '{app}-'"),
        ("Group", f"refuse user '{USER}' the consumer group '{{app}}': grant it Read on Group "
         "'{app}'"),
        ("Create", "Grant the worker's user Create on them"),
    ],
    ids=["transactional-id", "group", "create"],
)  # fmt: skip
def test_a_missing_acl_stops_the_worker_in_one_line(
    secure_broker: SecureBroker, tmp_path: Path, left_out: str, said: str
) -> None:
    """Granted everything but its transactional ids, its group, or the creation of its
    topics, the worker would fail every task, every fetch, or wait for topics that never
    come; it stops at start instead, status 1, in one line naming the ACL to grant, and no
    traceback."""
    settings = _settings(secure_broker, "SASL_PLAINTEXT", "SCRAM-SHA-512", PASSWORD)
    names = Names()
    grant(secure_broker, USER, [a for a in worker_acls(names) if left_out not in (a[0], a[3])])
    worker = _worker(settings, names, tmp_path).start()
    try:
        wait_for(lambda: not worker.alive(), 60, "the worker to give up")
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 1
    log = worker.log.read_text(errors="replace")
    lines = [line for line in log.splitlines() if said.format(app=names.app_id) in line]
    assert len(lines) == 1, log[-3000:]
    assert lines[0].startswith("neardup worker: the brokers refuse"), lines[0]
    assert "Traceback" not in log and "did not open" not in log, log[-3000:]
    _assert_no_secret({"the worker's log": log})


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_fails_at_once_and_says_why(
    secure_broker: SecureBroker, tmp_path: Path, mechanism: str
) -> None:
    settings = _settings(secure_broker, "SASL_PLAINTEXT", mechanism, WRONG)
    env = _env(settings)
    names = Names()
    worker = WorkerProcess(
        settings.brokers, names, 1, tmp_path / "state", tmp_path / "worker.log",
        env=env, loglevel="debug",
    ).start()  # fmt: skip
    started = time.monotonic()
    try:
        wait_for(lambda: not worker.alive(), 60, "the worker to give up")
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 1
    took = time.monotonic() - started
    log = worker.log.read_text(errors="replace")
    assert "neardup worker: cannot connect to the brokers" in log, log[-3000:]
    assert (
        "Authentication failed" in log
        and "check NEARDUP_SASL_USERNAME, NEARDUP_SASL_PASSWORD" in log
    )
    assert f"as user '{USER}'" in log

    pages = tmp_path / "pages.jsonl"
    pages.write_bytes(stream(seeds=())[0] + b"\n")
    produced = _produce(names, env, pages)
    assert produced.returncode == 1
    assert "SaslAuthenticationFailed" in produced.stderr
    assert "Unclosed AIOKafkaProducer" not in produced.stderr
    _assert_no_secret(
        {"the worker's log": log, "the producer's output": produced.stdout + produced.stderr}
    )
    print(f"worker with a wrong {mechanism} password exited after {took:.1f} s")


def test_errors_and_objects_never_show_the_password(secure_broker: SecureBroker) -> None:
    """What an operator may see of a failed connection, in this process: the explanation,
    the exception aiokafka raises with its traceback, and the settings objects."""
    import traceback

    from neardup.kafka.topics import ensure_topics

    texts: dict[str, str] = {}
    for password in (WRONG, PASSWORD):
        settings = _settings(secure_broker, "SASL_SSL", "PLAIN", password)
        texts[f"repr(settings) {password}"] = repr(settings) + str(settings)
        texts[f"settings as JSON {password}"] = settings.model_dump_json()
        texts[f"describe {password}"] = describe(settings)
    wrong = _settings(secure_broker, "SASL_SSL", "PLAIN", WRONG)
    problem = asyncio.run(connection_problem(wrong))
    assert "Authentication failed" in problem
    texts["connection_problem"] = problem
    with pytest.raises(Exception) as caught:
        asyncio.run(ensure_topics(wrong, timeout_s=10))
    texts["the exception"] = repr(caught.value) + str(caught.value)
    texts["its traceback"] = "".join(traceback.format_exception(caught.value))

    # without the test CA the broker's certificate is refused, and the message says so
    untrusting = _settings(secure_broker, "SASL_SSL", "PLAIN", PASSWORD).model_copy(
        update={"ssl_cafile": None}
    )
    refused = asyncio.run(connection_problem(untrusting))
    assert "CERTIFICATE_VERIFY_FAILED" in refused and "NEARDUP_SSL_CAFILE" in refused
    texts["refused certificate"] = refused
    _assert_no_secret(texts)
