"""Optional TLS for the emulator link (stdlib :mod:`ssl`).

The server serves TLS when given a certificate chain and its key (``cs_emulator --tls-cert
--tls-key``); the key file must be private to its owner. A client speaks TLS when
``CSRUN_EMULATOR_CA`` names a CA file (PEM) it trusts; it verifies the server's certificate and
that the certificate names the host of ``--cs_ip`` (or ``CSRUN_EMULATOR_TLS_NAME`` when set).
TLS 1.2 is the oldest version either side accepts. The hello's challenge-response runs inside
TLS as well, so the token is never sent even to a server whose certificate was trusted wrongly.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from csrun.env_settings import env_name, env_settings
from csrun.emulator.remote.auth_token import check_private_file
from csrun.errors import UserError

CA_ENV = env_name("emulator_ca")
NAME_ENV = env_name("emulator_tls_name")


def _readable(path: str, what: str, flag: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{flag}: the {what} {p} does not exist or is not a file")
    return p


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context from a PEM certificate chain and its private key (private to its owner)."""
    cert = _readable(cert_file, "certificate", "--tls-cert")
    key = _readable(key_file, "key", "--tls-key")
    check_private_file(key, "TLS key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.num_tickets = 0  # no session tickets: nothing but records after the handshake
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise UserError(f"cannot use the TLS certificate {cert} with the key {key}: {_reason(exc)}") from None
    return ctx


def client_context(ca_file: str) -> ssl.SSLContext:
    """A client context trusting the CA(s) in ``ca_file``; verifies certificate and host name."""
    ca = Path(ca_file).expanduser()
    if not ca.is_file():
        raise UserError(f"{CA_ENV}: the CA file {ca} does not exist or is not a file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise UserError(f"{CA_ENV}: cannot read CA certificates from {ca}: {_reason(exc)}") from None
    return ctx


@dataclass(frozen=True)
class ClientTLS:
    """How a client wraps its connection: the context and the name to verify (None: the host)."""

    context: ssl.SSLContext
    server_name: str | None = None


def client_tls_from_env() -> ClientTLS | None:
    """TLS settings from ``CSRUN_EMULATOR_CA`` / ``CSRUN_EMULATOR_TLS_NAME``; None for plain TCP."""
    settings = env_settings()
    ca = settings.emulator_ca.strip()
    if not ca:
        return None
    return ClientTLS(client_context(ca), settings.emulator_tls_name.strip() or None)


def _reason(exc: BaseException) -> str:
    """One line from an ssl/OS error."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(getattr(exc, "verify_message", None) or exc.reason)
    return str(getattr(exc, "strerror", None) or exc).splitlines()[0]


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed TLS handshake (the certificate check's message when there is one)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason)
    return _reason(exc)
