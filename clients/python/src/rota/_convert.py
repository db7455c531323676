"""Conversions between rota's protobuf messages and the client's dataclasses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from .model import (
    Ack,
    CallOutcome,
    Instance,
    InstanceList,
    InstanceRef,
    InstanceStatus,
    PickResult,
    Refusal,
    ReportResult,
    ServiceSummary,
    WatchEvent,
)

try:
    from ._pb import rota_pb2 as pb
    from ._pb import rota_pb2_grpc as pb_grpc
except ImportError as error:  # pragma: no cover - only without generated stubs
    raise ImportError(
        "rota's protobuf stubs are missing; generate them with "
        "`python clients/python/scripts/generate_stubs.py` (needs grpcio-tools)"
    ) from error

__all__ = ["pb", "pb_grpc"]

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _enum(value: int) -> Any:
    # The generated .pyi types enum fields as the enum wrapper or its name; a plain number is
    # what protobuf takes at run time, and the client's IntEnums carry the proto's numbers.
    return value


def status_code(number: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` of a numeric ``google.rpc.Code``."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


def instance_to_pb(instance: Instance) -> pb.Instance:
    message = pb.Instance(
        id=instance.id,
        service=instance.service,
        host=instance.host,
        port=instance.port,
        version=instance.version,
        zone=instance.zone,
        metadata=dict(instance.metadata),
        status=_enum(instance.status),
    )
    if instance.weight is not None:
        message.weight = instance.weight
    return message


def instance_from_pb(message: pb.Instance) -> Instance:
    try:
        status = InstanceStatus(message.status)
    except ValueError:
        status = InstanceStatus.UNSPECIFIED
    return Instance(
        service=message.service,
        host=message.host,
        port=message.port,
        id=message.id,
        version=message.version,
        zone=message.zone,
        weight=message.weight if message.HasField("weight") else None,
        metadata=dict(message.metadata),
        status=status,
    )


def ref_to_pb(ref: InstanceRef) -> pb.InstanceRef:
    return pb.InstanceRef(service=ref.service, id=ref.id)


def ref_from_pb(message: pb.InstanceRef) -> InstanceRef:
    return InstanceRef(message.service, message.id)


def pick_request(service: str, rule: str, version: str, key: str, zone: str, exclude: Iterable[str]) -> pb.PickRequest:
    return pb.PickRequest(service=service, rule=rule, version=version, key=key, zone=zone, exclude=list(exclude))


def pick_result(message: pb.PickResponse) -> PickResult:
    return PickResult(
        instance=instance_from_pb(message.instance),
        ticket=message.ticket,
        rule=message.rule,
        fallback=message.fallback,
        epoch=message.epoch,
    )


def ack_from_pb(message: pb.Ack) -> Ack:
    return Ack(
        lease_id=message.lease_id,
        seq=message.seq,
        accepted=tuple(ref_from_pb(r) for r in message.accepted),
        refused=tuple(Refusal(ref_from_pb(r.instance), status_code(r.code), r.message) for r in message.refused),
        heartbeat_timeout=message.heartbeat_timeout_ms / 1000.0,
    )


def outcome_to_pb(outcome: CallOutcome) -> pb.CallOutcome:
    return pb.CallOutcome(
        service=outcome.service,
        instance_id=outcome.instance_id,
        ticket=outcome.ticket,
        rule=outcome.rule,
        latency_us=max(0, int(outcome.latency_us)),
        result=_enum(outcome.result),
    )


def report_request(outcomes: Iterable[CallOutcome]) -> pb.ReportRequest:
    return pb.ReportRequest(outcomes=[outcome_to_pb(o) for o in outcomes])


def report_result(message: pb.ReportResponse) -> ReportResult:
    return ReportResult(message.accepted, message.ignored)


def instance_list(message: pb.ListInstancesResponse) -> InstanceList:
    return InstanceList(tuple(instance_from_pb(i) for i in message.instances), message.epoch)


def service_summaries(message: pb.ListServicesResponse) -> list[ServiceSummary]:
    return [ServiceSummary(s.name, s.instances, s.up, s.epoch) for s in message.services]


def watch_event(message: pb.WatchEvent) -> WatchEvent | None:
    kind = message.WhichOneof("event")
    if kind == "snapshot":
        instances = tuple(instance_from_pb(i) for i in message.snapshot.instances)
        return WatchEvent("snapshot", message.epoch, instances=instances)
    if kind == "added":
        return WatchEvent("added", message.epoch, instance=instance_from_pb(message.added))
    if kind == "updated":
        return WatchEvent("updated", message.epoch, instance=instance_from_pb(message.updated))
    if kind == "removed":
        return WatchEvent("removed", message.epoch, ref=ref_from_pb(message.removed))
    return None  # an event kind newer than these stubs


def announce(instances: Iterable[Instance]) -> pb.RegisterRequest:
    return pb.RegisterRequest(announce=pb.Announce(instances=[instance_to_pb(i) for i in instances]))


def withdraw(refs: Iterable[InstanceRef] = ()) -> pb.RegisterRequest:
    return pb.RegisterRequest(withdraw=pb.Withdraw(instances=[ref_to_pb(r) for r in refs]))


def heartbeat() -> pb.RegisterRequest:
    return pb.RegisterRequest(heartbeat=pb.Heartbeat())


def update(
    ref: InstanceRef,
    weight: int | None,
    status: InstanceStatus | None,
    metadata: dict[str, str] | None,
) -> pb.RegisterRequest:
    message = pb.Update(instance=ref_to_pb(ref), status=_enum(status or InstanceStatus.UNSPECIFIED))
    if weight is not None:
        message.weight = weight
    if metadata is not None:
        message.metadata.CopyFrom(pb.Metadata(entries=metadata))
    return pb.RegisterRequest(update=message)
