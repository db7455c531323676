"""One ``Register`` stream, less its I/O: which request each ack answers, and why the stream ended.

rota answers a stream's Announce, Update and Withdraw requests in order, one ``Ack`` each, so a
:class:`StreamAcks` keeps the waiters of the acknowledged requests sent (a
:class:`concurrent.futures.Future` or an :class:`asyncio.Future`: whatever the shell waits on)
in a queue, hands each ``Ack`` to the oldest, and, when the stream ends, gives back the ones
still waiting with the error to fail them with.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import grpc

from . import _convert as convert
from ._convert import pb
from .errors import RotaError
from .model import Ack

W = TypeVar("W")

#: Why a stream ended when rota ended it without saying more.
ENDED_BY_ROTA = "rota ended the stream"
#: Why a stream ended when it was cancelled on this side.
CANCELLED = "registration stream cancelled"


class StreamAcks(Generic[W]):
    """The waiters of one stream's acknowledged requests, oldest first, and the stream's end."""

    def __init__(self) -> None:
        self._waiting: deque[W] = deque()
        self._reason = ENDED_BY_ROTA
        #: Why the stream ended; set by :meth:`end`.
        self.end_reason = ""

    def gone(self) -> RotaError:
        """The error of a request sent on the stream after it ended."""
        return RotaError(grpc.StatusCode.UNAVAILABLE, f"registration stream ended: {self.end_reason}", unreachable=True)

    def expect(self, waiter: W) -> None:
        """``waiter`` waits for the ack of the request about to be sent."""
        self._waiting.append(waiter)

    def forget(self, waiter: W) -> bool:
        """``waiter``'s request was never sent; whether it was still waiting."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            return True
        return False

    def received(self, response: pb.RegisterResponse) -> tuple[W, Ack] | None:
        """The waiter an ``Ack`` answers and the ack; a ``Closing`` is recorded as the reason to come."""
        kind = response.WhichOneof("msg")
        if kind == "ack":
            if self._waiting:
                return self._waiting.popleft(), convert.ack_from_pb(response.ack)
        elif kind == "closing":
            self._reason = f"rota closed the stream: {response.closing.reason}"
        return None

    def broke(self, rpc_error: grpc.RpcError) -> None:
        """The stream failed with ``rpc_error``."""
        self._reason = str(RotaError.from_rpc_error(rpc_error))

    def cancelled(self) -> None:
        self._reason = CANCELLED

    def end(self) -> tuple[list[W], RotaError]:
        """The stream is over: the waiters left and the error each of them fails with."""
        self.end_reason = self._reason
        waiting, self._waiting = list(self._waiting), deque()
        return waiting, RotaError(grpc.StatusCode.UNAVAILABLE, self._reason, unreachable=True)


def no_ack(timeout: float) -> RotaError:
    """The error of a request rota did not acknowledge within ``timeout`` seconds."""
    return RotaError(
        grpc.StatusCode.DEADLINE_EXCEEDED, f"no acknowledgement from rota within {timeout:g}s", unreachable=True
    )


def broken(error: BaseException) -> RotaError:
    """The error of a request the stream could not send."""
    return RotaError(grpc.StatusCode.UNAVAILABLE, f"registration stream broken: {error}", unreachable=True)
