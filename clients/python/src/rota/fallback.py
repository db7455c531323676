"""The local fallback: the last instance list seen through ``Watch``, and picks made from it.

When rota cannot be reached, a consumer still has to call someone. For every service it
follows, the client keeps the list that rota last sent through ``Watch`` in an
:class:`InstanceCache`; a pick that fails because rota is unreachable (or is warming up after a
restart) is then answered from it by round robin over the UP instances, with rota's version
isolation:

- version V requested -> UP instances with version V, else UP instances with no version;
- no version requested -> UP instances with no version;
- ``exclude`` then skips inside that subset only.

The rotation is this process's own (rota's shared one is out of reach): tickets 0, 1, 2, ... per
(service, subset), and the result says so with ``local_fallback=True``. The contract is
``clients/conformance/README.md``, "Local fallback".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable

import grpc

from .errors import RotaError
from .model import Instance, InstanceStatus, PickResult, WatchEvent

#: The rule local picks follow, whatever rule the request named.
LOCAL_RULE = "round_robin"
#: Consecutive unreachable failures after which picks go straight to the local fallback ...
SHORTCUT_AFTER = 3
#: ... for this many seconds, before rota is tried again.
SHORTCUT_SECONDS = 1.0
#: A Watch stream that lived this long resets the reconnect backoff; a shorter one does not, so
#: a server that accepts and at once ends streams (one draining) is not hammered.
STABLE_STREAM_SECONDS = 5.0

log = logging.getLogger("rota")


#: Why a pick made during the short-cut did not ask rota.
SHORTCUT_ERROR = RotaError(
    grpc.StatusCode.UNAVAILABLE,
    f"rota failed {SHORTCUT_AFTER} picks in a row; not asked again for {SHORTCUT_SECONDS:g}s",
    unreachable=True,
)


def local_no_eligible(service: str, version: str, error: RotaError) -> RotaError:
    """The error of a local pick with nothing eligible: what rota would answer (not "unreachable")."""
    wanted = f'version "{version}"' if version else "no version"
    return RotaError(
        grpc.StatusCode.UNAVAILABLE,
        f'no eligible instance of "{service}" ({wanted}) in the last list seen; rota unreachable: {error}',
        reason="no_eligible_instance",
    )


def falls_back(error: RotaError) -> bool:
    """Whether a failed pick may be answered locally: rota unreachable, or warming up."""
    return error.unreachable or error.reason == "warming_up"


class OutageState:
    """One client's view of rota's availability: the short-cut and the once-per-outage logs."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._shortcut_until = 0.0
        self._in_outage = False

    def shortcut(self) -> bool:
        """True while picks should skip rota and go local."""
        with self._lock:
            return self._failures >= SHORTCUT_AFTER and self._clock() < self._shortcut_until

    def unreachable(self) -> None:
        with self._lock:
            self._failures += 1
            if self._failures >= SHORTCUT_AFTER:
                self._shortcut_until = self._clock() + SHORTCUT_SECONDS

    def answered(self) -> None:
        """rota answered a pick (with an instance or with its own error)."""
        with self._lock:
            self._failures = 0
            recovered, self._in_outage = self._in_outage, False
        if recovered:
            log.warning("rota answers again; picks are rota's again")

    def picked_locally(self, service: str, reason: str) -> None:
        with self._lock:
            first, self._in_outage = not self._in_outage, True
        if first:
            log.warning(
                "rota unreachable (%s); picking %s and other followed services locally from the last lists seen",
                reason,
                service,
            )


class InstanceCache:
    """One service's instances as last seen through ``Watch``. Thread-safe."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Callable[[], None]] = []
        self._instances: dict[str, Instance] = {}
        self._epoch = 0
        self._generation = 0
        self._synced = False
        self._counters: dict[str, itertools.count[int]] = {}

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def synced(self) -> bool:
        """True once a snapshot has arrived: the cache reflects rota's list at some epoch."""
        return self._synced

    def instances(self) -> list[Instance]:
        """Every cached instance, whatever its status, sorted by id."""
        with self._lock:
            return [self._instances[key] for key in sorted(self._instances)]

    def apply(self, event: WatchEvent) -> None:
        """Folds one watch event into the cache."""
        with self._lock:
            if event.kind == "snapshot":
                # A rota that has not seen the service since it started (epoch 0) knows less
                # than this cache: its empty list never replaces a non-empty one.
                if event.instances or event.epoch > 0 or not self._instances:
                    self._instances = {i.id: i for i in event.instances}
                self._synced = True
            elif event.kind in ("added", "updated") and event.instance is not None:
                self._instances[event.instance.id] = event.instance
            elif event.kind == "removed" and event.ref is not None:
                self._instances.pop(event.ref.id, None)
            self._epoch = event.epoch
            self._generation += 1
            self._changed.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def wait_for(self, predicate: Callable[[InstanceCache], bool], timeout: float) -> bool:
        """Blocks until ``predicate(cache)`` holds, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                seen = self._generation
            if predicate(self):  # reads the cache through its methods, which take the lock
                return True
            with self._lock:
                while self._generation == seen:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._changed.wait(remaining)

    async def wait_for_async(self, predicate: Callable[[InstanceCache], bool], timeout: float) -> bool:
        """:meth:`wait_for` for asyncio code: waits without blocking the event loop."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def listener() -> None:
            loop.call_soon_threadsafe(changed.set)

        with self._lock:
            self._listeners.append(listener)
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self):
                    await changed.wait()
                    changed.clear()
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._listeners.remove(listener)

    def pick(self, version: str = "", exclude: Iterable[str] = ()) -> PickResult | None:
        """Round robin over the eligible cached instances; ``None`` when there is none."""
        excluded = set(exclude)
        with self._lock:
            up = [
                self._instances[key]
                for key in sorted(self._instances)
                if self._instances[key].status in (InstanceStatus.UP, InstanceStatus.UNSPECIFIED)
            ]
            # As rota does: isolate by version first; exclude then skips inside that subset.
            isolated, label, fallback = _isolate(up, version)
            if not [i for i in isolated if i.id not in excluded]:
                return None
            counter = self._counters.setdefault(label, itertools.count())
            ticket = next(counter)
            epoch = self._epoch
        # As rota's round robin: the rotation runs over the candidates that are not excluded.
        accepted = [i for i in isolated if i.id not in excluded]
        chosen = accepted[ticket % len(accepted)]
        return PickResult(
            instance=chosen,
            ticket=ticket,
            rule=LOCAL_RULE,
            fallback=fallback,
            epoch=epoch,
            local_fallback=True,
        )


def _isolate(up: list[Instance], version: str) -> tuple[list[Instance], str, str]:
    """The candidates for ``version``, their rotation label, and the fallback reason if any."""
    unversioned = [i for i in up if not i.version]
    if not version:
        return unversioned, "version=", ""
    matching = [i for i in up if i.version == version]
    if matching:
        return matching, f"version={version}", ""
    reason = f'no instance with version "{version}"; picked from instances with no version'
    return unversioned, "version=", reason
