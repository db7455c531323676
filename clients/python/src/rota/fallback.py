"""The local fallback: the last instance list seen through ``Watch``, and picks made from it.

When rota cannot be reached, a consumer still has to call someone. For every service it
follows, the client keeps the list that rota last sent through ``Watch`` in an
:class:`InstanceCache`; a pick that fails because rota is unreachable is then answered from it
by round robin over the UP instances, with rota's version isolation:

- version V requested -> UP instances with version V, else UP instances with no version;
- no version requested -> UP instances with no version.

The rotation is this process's own (rota's shared one is out of reach), and the result says so
with ``local_fallback=True``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterable

from .model import Instance, InstanceStatus, PickResult, WatchEvent

#: The rule local picks follow, whatever rule the request named.
LOCAL_RULE = "round_robin"


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
            # As rota does: isolate by version first, then drop the excluded ids.
            isolated, label, fallback = _isolate(up, version)
            candidates = [i for i in isolated if i.id not in excluded]
            if not candidates:
                return None
            counter = self._counters.setdefault(label, itertools.count())
            ticket = next(counter)
            epoch = self._epoch
        return PickResult(
            instance=candidates[ticket % len(candidates)],
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
