"""Version propagation: the version a request carries follows it through the whole call chain.

A developer who runs a local instance registered with version ``zlt`` sends requests with the
header ``x-rota-version: zlt``. Each service on the way reads the header into the current
version (a :mod:`contextvars` variable, so it is per thread and per asyncio task), every pick
made while handling the request asks rota for that version, and every outgoing call carries the
header on. Nobody else's traffic reaches the developer's instance.

- :func:`version_from_headers` reads the header from any web framework's headers (a mapping,
  a WSGI environ, ASGI's list of byte pairs, gRPC metadata);
- :func:`use_version` makes a version current for a block;
- :class:`VersionServerInterceptor` / :class:`AsyncVersionServerInterceptor` do both for every
  call a gRPC server handles;
- :meth:`rota.RotaClient.pick` uses :func:`current_version` when given no explicit version;
- :func:`outgoing_headers`, :class:`VersionClientInterceptor` and
  :func:`async_version_client_interceptors` pass the version on.
"""

from __future__ import annotations

import collections
import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import grpc
import grpc.aio

#: The HTTP header / gRPC metadata key that carries the version.
VERSION_HEADER = "x-rota-version"
_WSGI_KEY = "HTTP_X_ROTA_VERSION"

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("rota_version", default=None)


def current_version() -> str | None:
    """The version of the request being handled, or ``None`` for requests without one."""
    return _current.get()


def set_version(version: str | None) -> contextvars.Token[str | None]:
    """Makes ``version`` current until reset with the returned token (prefer :func:`use_version`)."""
    return _current.set(version or None)


def reset_version(token: contextvars.Token[str | None]) -> None:
    _current.reset(token)


@contextmanager
def use_version(version: str | None) -> Iterator[str | None]:
    """Makes ``version`` (``None`` or ``""`` for none) the current version inside the block."""
    token = set_version(version)
    try:
        yield version or None
    finally:
        _current.reset(token)


class _HeaderItems(Protocol):
    def items(self) -> Iterable[tuple[Any, Any]]: ...


#: What :func:`version_from_headers` reads: a mapping, anything else with ``items()``, or pairs.
HeaderSource = Mapping[Any, Any] | _HeaderItems | Iterable[tuple[Any, Any]]


def version_from_headers(headers: HeaderSource) -> str | None:
    """The ``x-rota-version`` of an incoming request, or ``None``.

    Accepts any mapping of header names to values, matched case-insensitively (``http.server``'s
    ``self.headers``, Flask's or Django's ``request.headers``, a plain dict), a WSGI ``environ``
    (``HTTP_X_ROTA_VERSION``), ASGI's ``scope["headers"]`` (a list of ``(bytes, bytes)``) and
    gRPC invocation metadata.
    """
    # Mappings, and header objects that are not quite mappings (http.server's
    # email.message.Message), have items(); ASGI headers and gRPC metadata are pairs already.
    items: Iterable[tuple[Any, Any]]
    if isinstance(headers, Mapping) or callable(getattr(headers, "items", None)):
        items = headers.items()  # type: ignore[union-attr]
    else:
        items = headers  # type: ignore[assignment]
    for name, value in items:
        key = _text(name)
        if key.lower() == VERSION_HEADER or key.upper() == _WSGI_KEY:
            version = _text(value).strip()
            return version or None
    return None


def outgoing_headers(version: str | None = None) -> dict[str, str]:
    """Headers that pass the current version (or ``version``) on to the next service."""
    version = version if version is not None else current_version()
    return {VERSION_HEADER: version} if version else {}


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


# ---------------------------------------------------------------------------------------------
# gRPC servers
# ---------------------------------------------------------------------------------------------


def _in_context(version: str | None) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(_current.set, version)
    return context


def _sync_behaviour(behaviour: Callable[..., Any], streaming_response: bool, version: str | None) -> Callable[..., Any]:
    if streaming_response:

        def stream(request: Any, servicer_context: Any) -> Iterator[Any]:
            context = _in_context(version)
            responses = context.run(behaviour, request, servicer_context)
            if responses is None:
                return
            iterator = iter(responses)
            sentinel = object()
            while (item := context.run(next, iterator, sentinel)) is not sentinel:
                yield item

        return stream

    def unary(request: Any, servicer_context: Any) -> Any:
        return _in_context(version).run(behaviour, request, servicer_context)

    return unary


def _async_behaviour(
    behaviour: Callable[..., Any], streaming_response: bool, version: str | None
) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, servicer_context: Any) -> AsyncIterator[Any]:
            token = _current.set(version)
            try:
                async for item in behaviour(request, servicer_context):
                    yield item
            finally:
                _current.reset(token)

        return stream
    if inspect.iscoroutinefunction(behaviour):

        async def call(request: Any, servicer_context: Any) -> Any:
            token = _current.set(version)
            try:
                return await behaviour(request, servicer_context)
            finally:
                _current.reset(token)

        return call
    # A synchronous handler on an asyncio server runs in an executor thread.
    return _sync_behaviour(behaviour, streaming_response, version)


_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
)


def _wrap_handler(handler: Any, version: str | None, wrap: Callable[..., Any]) -> Any:
    if handler is None:
        return None
    for attribute, make, streaming_response in _KINDS:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return make(
                wrap(behaviour, streaming_response, version),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


class VersionServerInterceptor(grpc.ServerInterceptor):
    """Makes each call's ``x-rota-version`` metadata the current version while it is handled.

    ``grpc.server(executor, interceptors=[VersionServerInterceptor()])``
    """

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        version = version_from_headers(handler_call_details.invocation_metadata or ())
        return _wrap_handler(continuation(handler_call_details), version, _sync_behaviour)


class AsyncVersionServerInterceptor(grpc.aio.ServerInterceptor):
    """:class:`VersionServerInterceptor` for ``grpc.aio`` servers."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any) -> Any:
        version = version_from_headers(handler_call_details.invocation_metadata or ())
        return _wrap_handler(await continuation(handler_call_details), version, _async_behaviour)


# ---------------------------------------------------------------------------------------------
# gRPC clients
# ---------------------------------------------------------------------------------------------


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def _with_version(details: Any) -> Any:
    version = current_version()
    metadata = list(details.metadata or ())
    if not version or any(_text(key).lower() == VERSION_HEADER for key, _ in metadata):
        return details
    metadata.append((VERSION_HEADER, version))
    return _CallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        details.wait_for_ready,
        getattr(details, "compression", None),
    )


class VersionClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the current version as ``x-rota-version`` to every outgoing gRPC call.

    ``channel = grpc.intercept_channel(grpc.insecure_channel(target), VersionClientInterceptor())``
    """

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(_with_version(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(_with_version(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(_with_version(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(_with_version(client_call_details), request_iterator)


def _aio_details(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    version = current_version()
    metadata = grpc.aio.Metadata(*tuple(details.metadata or ()))
    if not version or any(_text(key).lower() == VERSION_HEADER for key, _ in metadata):
        return details
    metadata.add(VERSION_HEADER, version)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _AsyncUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(_aio_details(client_call_details), request)


class _AsyncUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(_aio_details(client_call_details), request)


class _AsyncStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(_aio_details(client_call_details), request_iterator)


class _AsyncStreamStream(grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(_aio_details(client_call_details), request_iterator)


def async_version_client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """:class:`VersionClientInterceptor` for ``grpc.aio`` channels, one per kind of call.

    ``grpc.aio.insecure_channel(target, interceptors=async_version_client_interceptors())``
    (a ``grpc.aio`` interceptor object serves one kind of call only).
    """
    return [_AsyncUnaryUnary(), _AsyncUnaryStream(), _AsyncStreamUnary(), _AsyncStreamStream()]
