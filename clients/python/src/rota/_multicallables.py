"""The multicallables of a rota channel, shared by ``rota.channel`` and ``rota.aio.channel``.

A grpc channel offers four kinds of multicallable (:data:`KINDS`); :class:`MultiCallableKinds`
gives a rota channel all four, each made by the channel's ``_multicallable(kind, ...)``, and
:class:`RoutedChannel` adds what both rota channels hold: the router, the routing of their calls
and the settings of their instance channels. A rota
multicallable sends each call through the multicallable of one instance channel:
:class:`InstanceMultiCallables` makes those once per instance channel (grpcio's are costly to
make) and makes a new one when the instance's channel was replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc

from ._router import Router
from ._routing import CallRouting
from ._tickets import Member

#: The multicallable kinds of a grpc channel, named as its factory methods.
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

#: The channel type of one instance: grpc.Channel or grpc.aio.Channel.
C = TypeVar("C")


#: A call's arguments passed on as they are to the instance channel's multicallable.
CallOptions = dict[str, Any]


def call_options(credentials: Any, wait_for_ready: bool | None, compression: Any) -> CallOptions:
    return {"credentials": credentials, "wait_for_ready": wait_for_ready, "compression": compression}


def _factory(kind: str) -> Callable[..., Any]:
    def make(
        self: MultiCallableKinds,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self._multicallable(kind, method, request_serializer, response_deserializer)

    make.__name__, make.__qualname__ = kind, f"MultiCallableKinds.{kind}"
    make.__doc__ = f"A {kind.replace('_', '-')} multicallable for ``method``, routed by rota."
    return make


class MultiCallableKinds:
    """The four multicallable factories of a channel, all through :meth:`_multicallable`."""

    def _multicallable(self, kind: str, method: str, serializer: Any, deserializer: Any) -> Any:
        raise NotImplementedError

    unary_unary = _factory("unary_unary")
    unary_stream = _factory("unary_stream")
    stream_unary = _factory("stream_unary")
    stream_stream = _factory("stream_stream")


class RoutedChannel(MultiCallableKinds, Generic[C]):
    """A rota channel: ``router``'s calls routed over instance channels of type ``C``, which
    :meth:`_open` makes with the ``options`` and ``credentials`` given and :meth:`_close_instance`
    closes. A channel that polls its instance channels' state (instead of being told it) says how
    to read it in :meth:`_state_of` (see :class:`~rota._routing.CallRouting`)."""

    #: Whether :meth:`_state_of` reads the instance channels' state.
    polls_state = False

    def __init__(
        self,
        router: Router,
        ticket_header: bool,
        options: Sequence[tuple[str, Any]] | None,
        credentials: grpc.ChannelCredentials | None,
    ) -> None:
        self.router = router
        self._options = list(options or ())
        self._credentials = credentials
        state_of = self._state_of if self.polls_state else None
        self.routing: CallRouting[C] = CallRouting(
            router, ticket_header, self._open, self._close_instance, state_of=state_of
        )
        self.instances = self.routing.instances

    def _open(self, member: Member) -> C:
        raise NotImplementedError

    def _close_instance(self, channel: C) -> None:
        raise NotImplementedError

    def _state_of(self, channel: C) -> grpc.ChannelConnectivity:
        raise NotImplementedError


class InstanceMultiCallables(Generic[C]):
    """One method's multicallables of kind ``kind`` on the instance channels, by instance id."""

    def __init__(self, kind: str, method: str, serializer: Any, deserializer: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"not a multicallable kind: {kind!r}")
        self.kind = kind
        self.method = method
        self._serializer = serializer
        self._deserializer = deserializer
        self._made: dict[str, tuple[C, Any]] = {}

    @property
    def streams_requests(self) -> bool:
        """Whether calls of this kind take a request iterator (stream-unary, stream-stream)."""
        return self.kind.startswith("stream")

    def on(self, member_id: str, channel: C) -> Any:
        """The multicallable on ``channel``, the channel of instance ``member_id``."""
        made = self._made.get(member_id)
        if made is not None and made[0] is channel:
            return made[1]
        factory = getattr(channel, self.kind)
        call = factory(self.method, request_serializer=self._serializer, response_deserializer=self._deserializer)
        self._made[member_id] = (channel, call)
        return call
