"""The broker connection's security settings, for the aiokafka clients.

Secrets come from ``Settings`` as ``SecretStr`` and are unwrapped only here, into the
client objects. The process's log records are scrubbed of the password
(``install_log_redaction``), and a refused connection is explained without it
(``connection_problem``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from neardup.settings import Settings


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """A TLS context when the protocol uses TLS, verifying against ``ssl_cafile`` if set."""
    if settings.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    return ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=settings.ssl_cafile)


def aiokafka_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of aiokafka's clients (admin, producer, consumer)."""
    out: dict[str, Any] = {"security_protocol": settings.security_protocol}
    ctx = ssl_context(settings)
    if ctx is not None:
        out["ssl_context"] = ctx
    if settings.security_protocol.startswith("SASL"):
        out["sasl_mechanism"] = settings.sasl_mechanism
        out["sasl_plain_username"] = settings.sasl_username
        password = settings.sasl_password
        out["sasl_plain_password"] = None if password is None else password.get_secret_value()
    return out


# -- keeping the password out of logs and messages -----------------------------------------

#: What replaces a secret in a log record.
REDACTED = "**********"
#: A secret shorter than this cannot be told from ordinary words in a log line, so it is not
#: searched for (the SASL filter below still hides the one place clients would print it).
_MIN_SECRET_LEN = 4


def secret_forms(secret: str) -> set[str]:
    """The ways ``secret`` can show up in text: as it is, and escaped the way ``repr`` of a
    str or of its UTF-8 bytes writes it (aiokafka logs the PLAIN payload as bytes)."""
    forms = {secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]}
    return {f for f in forms if len(f) >= _MIN_SECRET_LEN}


class _SaslPayloadFilter(logging.Filter):
    """aiokafka logs every request at DEBUG, and a SASL PLAIN request carries the password
    in clear (``SaslAuthenticateRequest_v1(sasl_auth_bytes=b'user\\x00user\\x00password')``);
    SCRAM's carry a proof derived from it. Such records keep their first words only."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cut = message.find("SaslAuthenticate")
        if cut >= 0:
            record.msg, record.args = message[:cut] + "SaslAuthenticate (payload redacted)", ()
        return True


#: Every form of every secret being masked, longest first. Process-wide on purpose: log
#: records are.
_SECRETS: list[str] = []


def _scrub(text: str) -> str:
    for form in _SECRETS:
        text = text.replace(form, REDACTED)
    return text


def _redacting_factory(
    previous: Callable[..., logging.LogRecord],
) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        message = record.getMessage()
        clean = _scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            # formatted now, so that every handler prints this redacted text
            record.exc_text = _scrub(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = _scrub(record.stack_info)
        return record

    factory.neardup_redacting = True  # type: ignore[attr-defined]
    return factory


def install_log_redaction(settings: Settings) -> None:
    """Mask the SASL password in every log record of this process, whatever logger or handler
    writes it (handlers may be replaced later, so this wraps the record factory),
    and drop the SASL payloads aiokafka logs at DEBUG. Calling it again adds a secret."""
    conn_log = logging.getLogger("aiokafka.conn")
    if not any(isinstance(f, _SaslPayloadFilter) for f in conn_log.filters):
        conn_log.addFilter(_SaslPayloadFilter())
    if settings.sasl_password is None:
        return
    forms = secret_forms(settings.sasl_password.get_secret_value())
    _SECRETS[:] = sorted(set(_SECRETS) | forms, key=len, reverse=True)
    current = logging.getLogRecordFactory()
    if _SECRETS and not getattr(current, "neardup_redacting", False):
        logging.setLogRecordFactory(_redacting_factory(current))


# -- saying why the brokers refuse us --------------------------------------------------------


def describe(settings: Settings) -> str:
    """The connection as an operator needs to see it: brokers, protocol, mechanism and user
    (never the password)."""
    out = f"{settings.brokers} over {settings.security_protocol}"
    if settings.security_protocol.startswith("SASL"):
        out += f" (SASL {settings.sasl_mechanism} as user {settings.sasl_username!r})"
    if settings.security_protocol.endswith("SSL"):
        out += f", CA file {settings.ssl_cafile or '(system trust store)'}"
    return out


def why_failed(settings: Settings, exc: BaseException) -> str:
    """What to say of a Kafka client that failed with ``exc`` (outside an event loop): the
    exception, or, for aiokafka's cause-less KafkaConnectionError, ``connection_problem``."""
    if type(exc).__name__ == "KafkaConnectionError":  # aiokafka names no cause: find it
        return asyncio.run(connection_problem(settings))
    return f"{type(exc).__name__}: {exc}"


async def connection_problem(settings: Settings, timeout_s: float = 10.0) -> str:
    """Why no broker can be reached: each one tried once, directly, and its error.

    aiokafka's clients only say "Unable to bootstrap" and log the cause; this opens one
    connection per broker, with the same security, to name it (an authentication failure,
    a certificate the CA file does not trust, a refused connection)."""
    from aiokafka.conn import create_conn  # type: ignore[import-untyped]

    kwargs = aiokafka_kwargs(settings)
    reasons = []
    for broker in settings.brokers.split(","):
        host, _, port = broker.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **kwargs),
                timeout_s,
            )
        except Exception as exc:  # the reason is the answer, whatever it is
            reasons.append(f"{broker}: {_reason(exc)}")
        else:
            conn.close()
            reasons.append(f"{broker}: connects now")
    return "; ".join(reasons)


def _reason(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc) if name in str(exc) else f"{name}: {exc}"  # aiokafka names itself
    if name == "SaslAuthenticationFailed":
        text += " (check NEARDUP_SASL_USERNAME, NEARDUP_SASL_PASSWORD, NEARDUP_SASL_MECHANISM)"
    elif isinstance(exc, ssl.SSLCertVerificationError):
        text += " (check NEARDUP_SSL_CAFILE)"
    elif isinstance(exc, TimeoutError):
        text = "no answer in time"
    if isinstance(exc, ConnectionResetError | TimeoutError) or "closed" in text:
        text += " (does NEARDUP_SECURITY_PROTOCOL match the listener's?)"
    return text


# -- saying which ACL is missing -------------------------------------------------------------


async def check_transactions(settings: Settings, group: str, topic: str) -> None:
    """End the worker, in one line naming the ACL to grant, if its user may not use the
    transactional ids ``<app>-*`` (TransactionalId Write) or the consumer group ``group``
    (Group Read; checked by reading its offset of ``topic``'s partition 0). Without them
    every task fails to open, or the consumer to join, again and again, in a log line
    each. The transaction is one of its own id, ``<app>-access-check``, and empty."""
    from aiokafka import (  # type: ignore[import-untyped]
        AIOKafkaConsumer,
        AIOKafkaProducer,
        TopicPartition,
    )
    from aiokafka.errors import (  # type: ignore[import-untyped]
        GroupAuthorizationFailedError,
        ProducerFenced,
        TransactionalIdAuthorizationFailed,
    )

    user = f"user {settings.sasl_username!r}" if settings.sasl_username else "the worker's user"
    kwargs = {"bootstrap_servers": settings.brokers, **aiokafka_kwargs(settings)}
    producer = AIOKafkaProducer(transactional_id=f"{settings.app_id}-access-check", **kwargs)
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **kwargs)
    try:
        await producer.start()
        try:
            await producer.begin_transaction()  # waits for InitProducerId
            await producer.commit_transaction()
        except ProducerFenced:
            pass  # another worker's check took the id after this one's was granted
        await consumer.start()
        await consumer.committed(TopicPartition(topic, 0))
    except TransactionalIdAuthorizationFailed:
        raise SystemExit(
            f"neardup worker: the brokers refuse {user} the transactional ids "
            f"{settings.app_id}-*: grant it Write on TransactionalId prefix "
            f"'{settings.app_id}-' (docs/kafka.md, Security)"
        ) from None
    except GroupAuthorizationFailedError:
        raise SystemExit(
            f"neardup worker: the brokers refuse {user} the consumer group {group!r}: "
            f"grant it Read on Group '{group}' (docs/kafka.md, Security)"
        ) from None
    finally:
        await producer.stop()
        await consumer.stop()
