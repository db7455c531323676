"""A registration's state, shared by the sync and asyncio registrations: what should be registered
(:class:`Desired`) and what the keeper does next (:class:`RegistrationState`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

import grpc

from . import _convert as convert
from ._convert import pb
from ._settings import heartbeat_interval, reconnect_backoff
from .errors import RegistrationError
from .model import Ack, Instance, InstanceRef, InstanceStatus

log = logging.getLogger("rota")

#: Refusals of a re-announcement worth retrying: the previous lease still holds the instance
#: until rota notices it is gone, or rota was briefly unable to apply the change.
RETRYABLE_REFUSALS = frozenset({grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAVAILABLE})


def check_instances(instances: Iterable[object]) -> None:
    """``register()``'s arguments: Instance values, one each (not a list)."""
    for instance in instances:
        if not isinstance(instance, Instance):
            raise TypeError(f"register() takes Instance arguments (register(*instances) for a list), got {instance!r}")


class Desired:
    """The instances a registration keeps announced, by reference.

    Only changes that rota accepted are recorded, so that after a reconnection the provider
    announces exactly what it had. ``pending`` holds instances whose re-announcement was refused
    for a transient reason; they are announced again until rota accepts them. An instance is
    either registered (:meth:`instances`) or pending, never both.
    """

    def __init__(self) -> None:
        self._instances: dict[InstanceRef, Instance] = {}
        self.pending: dict[InstanceRef, Instance] = {}

    def instances(self) -> list[Instance]:
        return list(self._instances.values())

    def announced(self, instances: Iterable[Instance], ack: Ack) -> None:
        accepted = set(ack.accepted)
        for instance in instances:
            ref = instance.ref
            if ref in accepted:
                self._instances[ref] = dataclasses.replace(instance, id=ref.id)
                self.pending.pop(ref, None)

    def reannounced(self, instances: Iterable[Instance], ack: Ack) -> None:
        """Records the answer to announcing ``instances`` again on a new stream."""
        self.announced(instances, ack)
        by_ref = {instance.ref: instance for instance in instances}
        for refusal in ack.refused:
            instance = by_ref.get(refusal.instance)
            if instance is None:
                continue
            if refusal.code in RETRYABLE_REFUSALS:
                self._instances.pop(refusal.instance, None)
                self.pending[refusal.instance] = instance
                log.warning(
                    "rota refused to re-register %s/%s for now (%s); retrying",
                    refusal.instance.service,
                    refusal.instance.id,
                    refusal.message,
                )
            else:
                self._instances.pop(refusal.instance, None)
                self.pending.pop(refusal.instance, None)
                log.error(
                    "rota refused to re-register %s/%s: %s",
                    refusal.instance.service,
                    refusal.instance.id,
                    refusal.message,
                )

    def updated(
        self,
        ref: InstanceRef,
        ack: Ack,
        weight: int | None,
        status: InstanceStatus | None,
        metadata: dict[str, str] | None,
    ) -> None:
        current = self._instances.get(ref)
        if current is None or ref not in ack.accepted:
            return
        changes: dict[str, object] = {}
        if weight is not None:
            changes["weight"] = weight
        if status is not None and status is not InstanceStatus.UNSPECIFIED:
            changes["status"] = status
        if metadata is not None:
            changes["metadata"] = dict(metadata)
        self._instances[ref] = dataclasses.replace(current, **changes)  # type: ignore[arg-type]

    def withdrawn(self, refs: Iterable[InstanceRef], ack: Ack) -> None:
        refs = list(refs)
        if not refs:
            self._instances.clear()
            self.pending.clear()
            return
        for ref in ack.accepted:
            self._instances.pop(ref, None)
        # rota holds no pending instance on this lease (so it refuses to withdraw one); it is
        # no longer wanted all the same.
        for ref in refs:
            self.pending.pop(ref, None)


@dataclasses.dataclass(frozen=True)
class Change:
    """A request that changes what is registered, and how its acknowledgement is recorded."""

    request: pb.RegisterRequest
    record: Callable[[Ack], None]


def ref_of(instance: Instance | InstanceRef) -> InstanceRef:
    return instance.ref if isinstance(instance, Instance) else instance


#: What the keeper does when it wakes: send a heartbeat, announce the pending instances again, or
#: open a new stream (the current one ended).
HEARTBEAT = "heartbeat"
RETRY_PENDING = "retry_pending"
RECONNECT = "reconnect"


class RegistrationState:
    """Everything a registration decides, for the shell that owns its streams and its keeper.

    The shell records what rota accepted in :attr:`desired`, opens the first stream
    (:meth:`opened`, then :meth:`refusal`), asks :meth:`next_step` each time its
    keeper wakes (every :attr:`interval` seconds, or when a stream ends), waits
    :meth:`reconnect_delay` before each new stream, which announces :meth:`reannouncement`
    and is taken with :meth:`reconnected`, and ends with :meth:`begin_close` and
    :meth:`closed`. Not thread-safe: the sync shell holds its lock around it.
    """

    def __init__(self, ack_timeout: float) -> None:
        self.ack_timeout = ack_timeout
        self.desired = Desired()
        self.backoff = reconnect_backoff()
        #: rota's answer to the first announcement.
        self.ack: Ack | None = None
        self.lease_id = 0
        #: Seconds between heartbeats on the current stream.
        self.interval = 1.0
        self.reconnects = 0
        self.stopping = False
        self.close_ack: Ack | None = None
        #: The withdrawal made by a re-announcement that was answered after close() began.
        self.late_close_ack: Ack | None = None

    # -- requests --------------------------------------------------------------------------

    def timeout(self, timeout: float | None) -> float:
        """How long a request waits for its ack: ``timeout``, else the registration's."""
        return self.ack_timeout if timeout is None else timeout

    def check_open(self) -> None:
        if self.stopping:
            raise RuntimeError("the registration is closed")

    # -- changes ---------------------------------------------------------------------------

    def announce(self, instances: Iterable[Instance]) -> Change:
        """Adds (or replaces) ``instances``."""
        instances = list(instances)
        return Change(convert.announce(instances), lambda ack: self.desired.announced(instances, ack))

    def update(
        self,
        instance: Instance | InstanceRef,
        weight: int | None,
        status: InstanceStatus | None,
        metadata: dict[str, str] | None,
    ) -> Change:
        """Changes one instance; arguments left ``None`` keep their value."""
        ref = ref_of(instance)
        return Change(
            convert.update(ref, weight, status, metadata),
            lambda ack: self.desired.updated(ref, ack, weight, status, metadata),
        )

    def withdraw(self, refs: Iterable[Instance | InstanceRef]) -> Change:
        """Withdraws ``refs``, or every instance when there is none."""
        refs_only = [ref_of(r) for r in refs]
        return Change(convert.withdraw(refs_only), lambda ack: self.desired.withdrawn(refs_only, ack))

    # -- streams ---------------------------------------------------------------------------

    def opened(self, instances: Iterable[Instance], ack: Ack) -> None:
        """The first stream announced ``instances`` and rota answered ``ack``."""
        self.ack = ack
        self.desired.announced(instances, ack)
        self._adopt(ack)

    def refusal(self, strict: bool) -> RegistrationError | None:
        """The error a ``strict`` registration raises (after closing) when rota refused an instance
        of its first announcement."""
        if strict and self.ack is not None and self.ack.refused:
            return RegistrationError(self.ack.refused)
        return None

    def next_step(self, stream_ended: bool, end_reason: str = "") -> str:
        """:data:`RECONNECT`, :data:`RETRY_PENDING` or :data:`HEARTBEAT`."""
        if stream_ended:
            log.warning("lost the rota registration stream (%s); reconnecting", end_reason)
            return RECONNECT
        if self.desired.pending:
            return RETRY_PENDING
        return HEARTBEAT

    def retry(self) -> Change:
        """Announcing again, on the current stream, the instances whose re-announcement rota
        refused for a transient reason."""
        pending = list(self.desired.pending.values())
        return Change(convert.announce(pending), lambda ack: self.desired.reannounced(pending, ack))

    def step_failed(self, error: Exception) -> None:
        """A heartbeat, retry or reconnection failed; the keeper wakes again at once."""
        log.info("rota registration: %s", error)

    def reconnect_delay(self) -> float:
        return self.backoff.next_delay()

    def reannouncement(self) -> list[Instance]:
        """What a new stream announces: every instance registered, then the pending ones (each
        instance once)."""
        return self.desired.instances() + list(self.desired.pending.values())

    def reconnect_failed(self, error: Exception) -> None:
        log.info("reconnecting to rota failed: %s", error)

    def reconnected(self, instances: Iterable[Instance], ack: Ack) -> bool:
        """A new stream announced ``instances`` and rota answered ``ack``; whether it is the
        current stream now. It is not when close() began meanwhile: rota holds the instances on
        the new stream, so the shell withdraws them there (:meth:`withdrawn_late`) and ends it."""
        if self.stopping:
            return False
        self._adopt(ack)
        self.desired.reannounced(instances, ack)
        self.reconnects += 1
        self.backoff.reset()
        log.info("re-registered %d instance(s) with rota (lease %d)", len(ack.accepted), ack.lease_id)
        return True

    def withdrawn_late(self, ack: Ack | None) -> None:
        """The withdrawal on a stream that close() caught in flight was answered ``ack`` (None: not)."""
        self.late_close_ack = ack

    def _adopt(self, ack: Ack) -> None:
        self.lease_id = ack.lease_id
        self.interval = heartbeat_interval(ack)

    # -- closing ---------------------------------------------------------------------------

    def begin_close(self) -> bool:
        """Whether this close is the first (a later one returns :attr:`close_ack`)."""
        if self.stopping:
            return False
        self.stopping = True
        return True

    def withdraw_failed(self, error: Exception) -> None:
        log.info("withdrawing from rota failed (%s); ending the stream", error)

    def closed(self, ack: Ack | None) -> Ack | None:
        """The acknowledgement close() returns: its own withdrawal's, else the one a
        re-announcement caught in flight made on its own stream (the stream in hand had ended)."""
        self.close_ack = ack if ack is not None else self.late_close_ack
        return self.close_ack
