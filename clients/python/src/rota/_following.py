"""The watch loop behind :meth:`RotaClient.follow`, less its I/O: what each stream and each end of one means.

One :class:`Following` per followed service. Per ``Watch`` stream the shell calls
:meth:`~Following.opened`, hands every message to :meth:`~Following.received` (events go into
the service's :class:`~rota.fallback.InstanceCache`; a snapshot tells the outage state rota is
reachable), and, when the stream fails, :meth:`~Following.interrupted` says whether to watch
again. :meth:`~Following.next_delay` is the wait before the next stream: the reconnect backoff,
reset only after a stream that lived :data:`~rota.fallback.STABLE_STREAM_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from . import _convert as convert
from ._convert import pb
from ._settings import reconnect_backoff
from .backoff import Backoff
from .errors import RotaError
from .fallback import STABLE_STREAM_SECONDS, InstanceCache, OutageState

log = logging.getLogger("rota")


class Following:
    """One followed service's watch state: its cache, the reconnect backoff, when the stream opened."""

    def __init__(
        self,
        cache: InstanceCache,
        outage: OutageState,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
    ) -> None:
        self.cache = cache
        self._outage = outage
        self._clock = clock
        self._backoff = backoff or reconnect_backoff()
        self._opened = clock()

    @property
    def request(self) -> pb.WatchRequest:
        return pb.WatchRequest(service=self.cache.service)

    def opened(self) -> None:
        """A new stream was opened."""
        self._opened = self._clock()

    def received(self, message: pb.WatchEvent) -> None:
        event = convert.watch_event(message)
        if event is not None:
            self.cache.apply(event)
            if event.kind == "snapshot":
                self._outage.answered()  # rota is reachable again

    def interrupted(self, rpc_error: grpc.RpcError) -> bool:
        """The stream failed; whether to watch again (not for a service name rota refuses)."""
        error = RotaError.from_rpc_error(rpc_error)
        if error.code is grpc.StatusCode.INVALID_ARGUMENT:
            log.error("cannot watch %r: %s", self.cache.service, error)
            return False
        log.info("watch of %r interrupted (%s); keeping the last list", self.cache.service, error)
        return True

    def ended(self) -> None:
        """The stream ended, however: a stream that lived long enough starts the backoff over."""
        if self._clock() - self._opened >= STABLE_STREAM_SECONDS:
            self._backoff.reset()

    def next_delay(self) -> float:
        """Seconds to wait before the next stream."""
        return self._backoff.next_delay()
