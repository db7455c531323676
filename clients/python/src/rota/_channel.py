"""``rota.channel("rota:///orders")``: a :class:`grpc.Channel` that routes each call by rota.

grpcio has no pluggable load-balancing policy, so the channel is a :class:`grpc.Channel` of its
own: one plain channel per instance of the service (followed through ``Watch``), and per call the
next ticket of a leased block of rota's shared rotation, sent to the instance rota positioned it
on. Every multicallable kind is offered, so generated stubs and :func:`grpc.intercept_channel`
work unchanged.

- Per call version: the ``x-rota-version`` metadata entry, else the version of the request
  being handled (:func:`rota.use_version`), else the channel's ``version``.
- An instance the channel cannot use (its channel in TRANSIENT_FAILURE, a call to it that could
  not connect in the last second, or held out after 3 timeouts in a row) takes no call: the call
  takes the next ticket whose instance is usable (the ones passed over are gaps), so that the
  usable ones keep the rule's shares, and the next leases name it in ``exclude``. A unary call
  that could not connect is sent again on the next ticket.
- Outcomes (status, latency) are reported to rota in batches, off the call's path.
- rota unreachable: calls go on over the last known instances by a local rotation (one call
  each, in id order).

The routing itself (version, ticket, instance, outcome, whether to send a call again) is
:mod:`rota._routing`, the multicallables :mod:`rota._multicallables`, both shared with the
asyncio channel; this module adapts them to grpcio's synchronous API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from ._dial import dial
from ._multicallables import CallOptions, InstanceMultiCallables, RoutedChannel, call_options
from ._rota_connection import PathArg
from ._routing import Attempt, Deadline, Metadata, open_router, retries_on_next_ticket
from ._tickets import Member


def channel(
    target: str,
    *,
    server: str | None = None,
    rule: str | None = None,
    version: str | None = None,
    ticket_header: bool = False,
    options: Sequence[tuple[str, Any]] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
    tls_ca: PathArg | None = None,
    tls_cert: PathArg | None = None,
    tls_key: PathArg | None = None,
) -> RotaChannel:
    """A channel for ``rota:///SERVICE`` (or ``rota://ROTA_HOST:PORT/SERVICE?rule=..&version=..``).

    ``server`` is rota's ``host:port`` (else the target's authority, ``ROTA_SERVER``,
    ``127.0.0.1:50051``); ``rule`` a rule rota can lease (``round_robin``, ``repeat(n=N)``,
    ``weighted``; default: the service's policy rule; rota refuses others, and the calls fail
    with its answer); ``version`` the version of calls without
    an ``x-rota-version`` entry. ``ticket_header`` adds each call's ticket as ``x-rota-ticket``
    (``L<n>`` for a local pick); it is off by default because it adds bytes to every call.
    ``options`` and ``credentials`` apply to the instance channels.

    ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key`` apply to the connection to rota, each
    defaulting to its environment variable (``ROTA_TOKEN``, ``ROTA_TLS_CA``, ``ROTA_TLS_CERT``,
    ``ROTA_TLS_KEY``): the bearer token rota's ``[auth]`` asks for, the PEM CA that signed rota's
    certificate (rota is reached over TLS with a CA, or when ``server`` is ``https://HOST:PORT``),
    and a PEM client certificate and key for a rota that requires mTLS. A call the channel cannot
    route because rota refused its token fails with rota's status and message
    (``UNAUTHENTICATED``, ``PERMISSION_DENIED``).
    """
    router = open_router(target, server, rule, version, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
    return RotaChannel(router, ticket_header, options, credentials)


class RotaChannel(RoutedChannel[grpc.Channel], grpc.Channel):
    """A :class:`grpc.Channel` whose calls are routed by rota; see :func:`channel`."""

    def _open(self, member: Member) -> grpc.Channel:
        ch: grpc.Channel = dial(grpc, member.address, self._credentials, self._options)
        ch.subscribe(lambda state: self.instances.set_state(member.id, state), try_to_connect=True)
        return ch

    def _close_instance(self, channel: grpc.Channel) -> None:
        channel.close()

    def _multicallable(self, kind: str, method: str, serializer: Any, deserializer: Any) -> Any:
        if kind == "unary_unary":
            return _UnaryUnary(self, kind, method, serializer, deserializer)
        if kind == "stream_unary":
            return _StreamUnary(self, kind, method, serializer, deserializer)
        return _Streaming(self, kind, method, serializer, deserializer)

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        callback(self.routing.connectivity())

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        pass

    def close(self) -> None:
        self.routing.close()

    def __enter__(self) -> RotaChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Callable:
    def __init__(self, channel: RotaChannel, kind: str, method: str, serializer: Any, deserializer: Any) -> None:
        self._routing = channel.routing
        self._kind = kind
        self._calls: InstanceMultiCallables[grpc.Channel] = InstanceMultiCallables(
            kind, method, serializer, deserializer
        )

    def _start(self, metadata: Metadata | None, timeout: float | None) -> tuple[Attempt, Any, Metadata | None]:
        """Routes a call: its attempt, the instance channel's multicallable, the metadata to send."""
        draw, md = self._routing.route(metadata, timeout)
        inner = self._calls.on(draw.member.id, self._routing.channel_for(draw))
        return self._routing.start(draw), inner, md

    def _with_call(self, request: Any, timeout: float | None, metadata: Metadata | None, extra: CallOptions) -> Any:
        deadline = Deadline(timeout)
        while True:
            left = deadline.left()
            attempt, inner, md = self._start(metadata, left)
            try:
                result = inner.with_call(request, timeout=left, metadata=md, **extra)
            except grpc.RpcError as error:
                code, details = error.code(), error.details()
                self._routing.finish(attempt, code, details)
                if retries_on_next_ticket(self._kind, code, details, deadline):
                    continue  # never reached the instance: the next ticket
                raise
            self._routing.finish(attempt, grpc.StatusCode.OK, None, answered=True)
            return result

    def _tracked(
        self, factory: str, request: Any, timeout: float | None, metadata: Metadata | None, extra: CallOptions
    ) -> Any:
        """A call whose outcome is reported when it is done (``factory``: ``future`` or ``__call__``)."""
        attempt, inner, md = self._start(metadata, timeout)
        call = getattr(inner, factory)(request, timeout=timeout, metadata=md, **extra)

        def done(_: object = None) -> None:
            self._routing.finish(attempt, call.code(), call.details())

        call.add_done_callback(done) if hasattr(call, "add_done_callback") else call.add_callback(done)
        return call


class _UnaryUnary(_Callable, grpc.UnaryUnaryMultiCallable):  # type: ignore[type-arg]
    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        response, _ = self._with_call(
            request, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )
        return response

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._with_call(request, timeout, metadata, call_options(credentials, wait_for_ready, compression))

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._tracked(
            "future", request, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )


class _StreamUnary(_Callable, grpc.StreamUnaryMultiCallable):  # type: ignore[type-arg]
    def __call__(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        response, _ = self._with_call(
            request_iterator, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )
        return response

    def with_call(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._with_call(
            request_iterator, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )

    def future(
        self,
        request_iterator: Iterator[Any],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._tracked(
            "future", request_iterator, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )


class _Streaming(_Callable, grpc.UnaryStreamMultiCallable, grpc.StreamStreamMultiCallable):  # type: ignore[type-arg]
    """unary-stream and stream-stream: the call object of the instance channel, its outcome reported when done."""

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._tracked(
            "__call__", request, timeout, metadata, call_options(credentials, wait_for_ready, compression)
        )
