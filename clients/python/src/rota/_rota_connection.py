"""How a client or a channel reaches rota: plaintext or TLS, with or without a bearer token.

The settings are those of the ``rota`` command line: an explicit argument wins over its
environment variable (``ROTA_TOKEN``, ``ROTA_TLS_CA``, ``ROTA_TLS_CERT``, ``ROTA_TLS_KEY``; an empty
variable counts as unset), a client certificate and its key go together, and an ``https://``
server needs a CA. rota is reached over TLS when its address is ``https://HOST:PORT``, or a bare
``HOST:PORT`` with a CA; ``http://HOST:PORT`` is plaintext. The token goes as
``authorization: Bearer TOKEN`` on every call, over TLS and plaintext alike (rota accepts a
plaintext connection with tokens, on loopback or not).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
import grpc.aio

TOKEN_ENV = "ROTA_TOKEN"
TLS_CA_ENV = "ROTA_TLS_CA"
TLS_CERT_ENV = "ROTA_TLS_CERT"
TLS_KEY_ENV = "ROTA_TLS_KEY"

#: A file path as the TLS arguments take it.
PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class RotaConnection:
    """Where and how to reach rota: the gRPC target, TLS credentials (None: plaintext), the token."""

    target: str
    credentials: grpc.ChannelCredentials | None
    token: str | None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call to rota carries: the token, when there is one."""
        return () if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def dial(self, flavour: ModuleType, options: Sequence[tuple[str, Any]]) -> Any:
        """A channel to rota: ``flavour`` is :mod:`grpc` or :mod:`grpc.aio`."""
        opts = list(options)
        if flavour is grpc.aio:
            interceptors = [] if self.token is None else _aio_bearer(self.metadata())
            if self.credentials is None:
                return grpc.aio.insecure_channel(self.target, options=opts, interceptors=interceptors)
            return grpc.aio.secure_channel(self.target, self.credentials, options=opts, interceptors=interceptors)
        if self.credentials is None:
            channel = grpc.insecure_channel(self.target, options=opts)
        else:
            channel = grpc.secure_channel(self.target, self.credentials, options=opts)
        if self.token is None:
            return channel
        return grpc.intercept_channel(channel, _BearerToken(self.metadata()))


def rota_connection(
    address: str,
    *,
    token: str | None = None,
    tls_ca: PathArg | None = None,
    tls_cert: PathArg | None = None,
    tls_key: PathArg | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    env: Mapping[str, str] | None = None,
) -> RotaConnection:
    """The connection to rota at ``address`` (``HOST:PORT``, ``http://…`` or ``https://…``).

    ``credentials`` (a :class:`grpc.ChannelCredentials` of the caller's) replaces the TLS
    arguments and variables; giving both is an error. Raises :class:`ValueError` naming the
    argument for a lone certificate or key, an ``https://`` address without a CA, or a TLS file
    that cannot be read.
    """
    environ = os.environ if env is None else env

    def chosen(value: PathArg | None, name: str) -> str | None:
        picked = os.fspath(value) if value is not None else environ.get(name, "")
        return picked or None

    chosen_token = chosen(token, TOKEN_ENV)
    if credentials is not None:
        if (tls_ca, tls_cert, tls_key) != (None, None, None):
            raise ValueError("give either credentials or tls_ca/tls_cert/tls_key, not both")
        return RotaConnection(_bare(address), credentials, chosen_token)
    ca, cert, key = chosen(tls_ca, TLS_CA_ENV), chosen(tls_cert, TLS_CERT_ENV), chosen(tls_key, TLS_KEY_ENV)
    if (cert is None) != (key is None):
        raise ValueError(f"tls_cert and tls_key go together (or {TLS_CERT_ENV} and {TLS_KEY_ENV})")
    if address.startswith("https://"):
        if ca is None:
            raise ValueError(f"an https:// server needs tls_ca (or {TLS_CA_ENV})")
    elif address.startswith("http://") or ca is None:
        return RotaConnection(_bare(address), None, chosen_token)
    tls = grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "tls_ca"),
        private_key=None if key is None else _read(key, "tls_key"),
        certificate_chain=None if cert is None else _read(cert, "tls_cert"),
    )
    return RotaConnection(_bare(address), tls, chosen_token)


def _bare(address: str) -> str:
    """The gRPC target of ``address``: without its scheme and trailing slashes."""
    for scheme in ("https://", "http://", "grpc://"):
        if address.startswith(scheme):
            return address[len(scheme) :].rstrip("/")
    return address


def _read(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"cannot read {name} {path}: {error.strerror or error}") from None


class _SyncCallDetails(grpc.ClientCallDetails):
    """A call's details with the token added to its metadata."""

    def __init__(self, details: grpc.ClientCallDetails, token: Sequence[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = (*(details.metadata or ()), *token)
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token to every call of a :mod:`grpc` channel."""

    def __init__(self, token: Sequence[tuple[str, str]]) -> None:
        self._token = token

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _SyncCallDetails(details, self._token)

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def _aio_details(details: grpc.aio.ClientCallDetails, token: Sequence[tuple[str, str]]) -> grpc.aio.ClientCallDetails:
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        grpc.aio.Metadata(*(details.metadata or ()), *token),
        details.credentials,
        details.wait_for_ready,
    )


def _aio_bearer(token: Sequence[tuple[str, str]]) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors adding the token to every call of a :mod:`grpc.aio` channel, one per call kind."""

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(_aio_details(details, token), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(_aio_details(details, token), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
            return await continuation(_aio_details(details, token), requests)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
            return await continuation(_aio_details(details, token), requests)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
