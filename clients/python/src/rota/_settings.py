"""The client's timeouts, channel settings and reconnect schedule, the same for both flavours."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .backoff import Backoff
from .model import Ack

#: Seconds a unary call (pick, report, listing) may take unless the client is told otherwise.
DEFAULT_TIMEOUT = 2.0
#: Seconds to wait for the acknowledgement of an Announce, Update or Withdraw.
ACK_TIMEOUT = 5.0
#: Seconds :meth:`Registration.close` waits for the acknowledgement of its Withdraw.
CLOSE_TIMEOUT = 2.0
#: Heartbeats go out at this fraction of rota's timeout, so two in a row may be lost.
HEARTBEATS_PER_TIMEOUT = 3
#: The shortest interval between heartbeats, whatever rota's timeout.
MIN_HEARTBEAT_INTERVAL = 0.01

#: Channel settings: reconnect to rota quickly once it is back, and notice dead connections.
#: ``grpc.min_reconnect_backoff_ms`` is not set: grpc-core takes it as the time one connection
#: attempt has for TCP, the TLS handshake and rota's HTTP/2 settings, and its default of 20 s
#: lets a TLS handshake with a busy or distant rota finish.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 10_000),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def channel_options(extra: Iterable[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """The options of a client's channel to rota: :data:`CHANNEL_OPTIONS`, then the caller's."""
    return [*CHANNEL_OPTIONS, *extra]


def reconnect_backoff() -> Backoff:
    """The schedule of a registration's or a watch's reconnections: 100 ms doubling to 10 s."""
    return Backoff(initial=0.1, cap=10.0)


def heartbeat_interval(ack: Ack) -> float:
    """Seconds between heartbeats on the stream that ``ack`` opened."""
    return max(ack.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT, MIN_HEARTBEAT_INTERVAL)


def timeout_or(default: float | None, timeout: float | None) -> float | None:
    """A call's timeout: the one it was given, else the client's."""
    return default if timeout is None else timeout
