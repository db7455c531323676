"""Bookkeeping shared by the sync and asyncio registrations: what should be registered."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import grpc

from .model import Ack, Instance, InstanceRef, InstanceStatus

log = logging.getLogger("rota")

#: Refusals of a re-announcement worth retrying: the previous lease still holds the instance
#: until rota notices it is gone, or rota was briefly unable to apply the change.
RETRYABLE_REFUSALS = frozenset({grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAVAILABLE})


class Desired:
    """The instances a registration keeps announced, by reference.

    Only changes that rota accepted are recorded, so that after a reconnection the provider
    announces exactly what it had. ``pending`` holds instances whose re-announcement was refused
    for a transient reason; they are announced again until rota accepts them.
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
            self.pending.pop(ref, None)
