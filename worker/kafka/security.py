"""The broker connection's security settings, for Faust and for plain aiokafka clients.

Secrets come from ``Settings`` as ``SecretStr`` and are unwrapped only here, into the
client objects; Faust's credentials print the user name only.
"""

from __future__ import annotations

import ssl
from typing import Any

from worker.settings import Settings


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """A TLS context when the protocol uses TLS, verifying against ``ssl_cafile`` if set."""
    if settings.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    return ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=settings.ssl_cafile)


def _password(settings: Settings) -> str | None:
    return None if settings.sasl_password is None else settings.sasl_password.get_secret_value()


def aiokafka_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of aiokafka's clients (admin, producer, consumer)."""
    out: dict[str, Any] = {"security_protocol": settings.security_protocol}
    ctx = ssl_context(settings)
    if ctx is not None:
        out["ssl_context"] = ctx
    if settings.security_protocol.startswith("SASL"):
        out["sasl_mechanism"] = settings.sasl_mechanism
        out["sasl_plain_username"] = settings.sasl_username
        out["sasl_plain_password"] = _password(settings)
    return out


def faust_credentials(settings: Settings) -> Any | None:
    """Faust's ``broker_credentials`` for the settings (None for PLAINTEXT)."""
    import faust

    ctx = ssl_context(settings)
    if settings.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=_password(settings),
            ssl_context=ctx,
            mechanism=settings.sasl_mechanism,
        )
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None
