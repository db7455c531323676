from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InstanceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATUS_UNSPECIFIED: _ClassVar[InstanceStatus]
    UP: _ClassVar[InstanceStatus]
    DRAINING: _ClassVar[InstanceStatus]
    DOWN: _ClassVar[InstanceStatus]

class CallResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_RESULT_UNSPECIFIED: _ClassVar[CallResult]
    CALL_RESULT_OK: _ClassVar[CallResult]
    CALL_RESULT_CONNECT_FAILURE: _ClassVar[CallResult]
    CALL_RESULT_ERROR: _ClassVar[CallResult]

class OverrideAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERRIDE_ACTION_UNSPECIFIED: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_DRAIN: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_DISABLE: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_ENABLE: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_WEIGHT: _ClassVar[OverrideAction]
    OVERRIDE_ACTION_CLEAR: _ClassVar[OverrideAction]

class IsolationFallback(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ISOLATION_FALLBACK_UNSPECIFIED: _ClassVar[IsolationFallback]
    ISOLATION_FALLBACK_FAIL: _ClassVar[IsolationFallback]
    ISOLATION_FALLBACK_ANY: _ClassVar[IsolationFallback]

class PolicySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_SOURCE_UNSPECIFIED: _ClassVar[PolicySource]
    POLICY_SOURCE_DEFAULT: _ClassVar[PolicySource]
    POLICY_SOURCE_FILE: _ClassVar[PolicySource]
    POLICY_SOURCE_RUNTIME: _ClassVar[PolicySource]
INSTANCE_STATUS_UNSPECIFIED: InstanceStatus
UP: InstanceStatus
DRAINING: InstanceStatus
DOWN: InstanceStatus
CALL_RESULT_UNSPECIFIED: CallResult
CALL_RESULT_OK: CallResult
CALL_RESULT_CONNECT_FAILURE: CallResult
CALL_RESULT_ERROR: CallResult
OVERRIDE_ACTION_UNSPECIFIED: OverrideAction
OVERRIDE_ACTION_DRAIN: OverrideAction
OVERRIDE_ACTION_DISABLE: OverrideAction
OVERRIDE_ACTION_ENABLE: OverrideAction
OVERRIDE_ACTION_WEIGHT: OverrideAction
OVERRIDE_ACTION_CLEAR: OverrideAction
ISOLATION_FALLBACK_UNSPECIFIED: IsolationFallback
ISOLATION_FALLBACK_FAIL: IsolationFallback
ISOLATION_FALLBACK_ANY: IsolationFallback
POLICY_SOURCE_UNSPECIFIED: PolicySource
POLICY_SOURCE_DEFAULT: PolicySource
POLICY_SOURCE_FILE: PolicySource
POLICY_SOURCE_RUNTIME: PolicySource

class Instance(_message.Message):
    __slots__ = ("id", "service", "host", "port", "version", "zone", "weight", "metadata", "status", "announced_status", "health", "operator", "source")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCED_STATUS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    service: str
    host: str
    port: int
    version: str
    zone: str
    weight: int
    metadata: _containers.ScalarMap[str, str]
    status: InstanceStatus
    announced_status: InstanceStatus
    health: str
    operator: str
    source: str
    def __init__(self, id: _Optional[str] = ..., service: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., version: _Optional[str] = ..., zone: _Optional[str] = ..., weight: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., status: _Optional[_Union[InstanceStatus, str]] = ..., announced_status: _Optional[_Union[InstanceStatus, str]] = ..., health: _Optional[str] = ..., operator: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class InstanceRef(_message.Message):
    __slots__ = ("service", "id")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    service: str
    id: str
    def __init__(self, service: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("service", "rule", "version", "count", "exclude")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    service: str
    rule: str
    version: str
    count: int
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, service: _Optional[str] = ..., rule: _Optional[str] = ..., version: _Optional[str] = ..., count: _Optional[int] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("first_ticket", "count", "instances", "epoch", "rule", "fallback", "picks", "positions")
    FIRST_TICKET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    PICKS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    first_ticket: int
    count: int
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    epoch: int
    rule: str
    fallback: str
    picks: _containers.RepeatedCompositeFieldContainer[LeasedPick]
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, first_ticket: _Optional[int] = ..., count: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., epoch: _Optional[int] = ..., rule: _Optional[str] = ..., fallback: _Optional[str] = ..., picks: _Optional[_Iterable[_Union[LeasedPick, _Mapping]]] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class LeasedPick(_message.Message):
    __slots__ = ("ticket", "position")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ticket: int
    position: int
    def __init__(self, ticket: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("service", "rule", "version", "key", "zone", "exclude")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    service: str
    rule: str
    version: str
    key: str
    zone: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, service: _Optional[str] = ..., rule: _Optional[str] = ..., version: _Optional[str] = ..., key: _Optional[str] = ..., zone: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("instance", "ticket", "rule", "fallback", "epoch", "error")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    instance: Instance
    ticket: int
    rule: str
    fallback: str
    epoch: int
    error: PickError
    def __init__(self, instance: _Optional[_Union[Instance, _Mapping]] = ..., ticket: _Optional[int] = ..., rule: _Optional[str] = ..., fallback: _Optional[str] = ..., epoch: _Optional[int] = ..., error: _Optional[_Union[PickError, _Mapping]] = ...) -> None: ...

class CallOutcome(_message.Message):
    __slots__ = ("service", "instance_id", "ticket", "rule", "latency_us", "result", "leased")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_US_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    service: str
    instance_id: str
    ticket: int
    rule: str
    latency_us: int
    result: CallResult
    leased: bool
    def __init__(self, service: _Optional[str] = ..., instance_id: _Optional[str] = ..., ticket: _Optional[int] = ..., rule: _Optional[str] = ..., latency_us: _Optional[int] = ..., result: _Optional[_Union[CallResult, str]] = ..., leased: _Optional[bool] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[CallOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[CallOutcome, _Mapping]]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("accepted", "ignored")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    ignored: int
    def __init__(self, accepted: _Optional[int] = ..., ignored: _Optional[int] = ...) -> None: ...

class PickError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SetInstanceOverrideRequest(_message.Message):
    __slots__ = ("service", "id", "action", "weight")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    service: str
    id: str
    action: OverrideAction
    weight: int
    def __init__(self, service: _Optional[str] = ..., id: _Optional[str] = ..., action: _Optional[_Union[OverrideAction, str]] = ..., weight: _Optional[int] = ...) -> None: ...

class InstanceOverride(_message.Message):
    __slots__ = ("service", "id", "status", "weight", "registered")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    service: str
    id: str
    status: str
    weight: int
    registered: bool
    def __init__(self, service: _Optional[str] = ..., id: _Optional[str] = ..., status: _Optional[str] = ..., weight: _Optional[int] = ..., registered: _Optional[bool] = ...) -> None: ...

class ListInstanceOverridesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListInstanceOverridesResponse(_message.Message):
    __slots__ = ("overrides",)
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[InstanceOverride]
    def __init__(self, overrides: _Optional[_Iterable[_Union[InstanceOverride, _Mapping]]] = ...) -> None: ...

class GrayRelease(_message.Message):
    __slots__ = ("unversioned", "versions")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    UNVERSIONED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    unversioned: int
    versions: _containers.ScalarMap[str, int]
    def __init__(self, unversioned: _Optional[int] = ..., versions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Breaker(_message.Message):
    __slots__ = ("failure_threshold", "blackout_base_ms", "blackout_max_ms")
    FAILURE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BLACKOUT_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    BLACKOUT_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    failure_threshold: int
    blackout_base_ms: int
    blackout_max_ms: int
    def __init__(self, failure_threshold: _Optional[int] = ..., blackout_base_ms: _Optional[int] = ..., blackout_max_ms: _Optional[int] = ...) -> None: ...

class Ejection(_message.Message):
    __slots__ = ("disabled", "max_ejected_percent", "failure_rate_percent", "failure_rate_min_calls")
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_EJECTED_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_MIN_CALLS_FIELD_NUMBER: _ClassVar[int]
    disabled: bool
    max_ejected_percent: int
    failure_rate_percent: int
    failure_rate_min_calls: int
    def __init__(self, disabled: _Optional[bool] = ..., max_ejected_percent: _Optional[int] = ..., failure_rate_percent: _Optional[int] = ..., failure_rate_min_calls: _Optional[int] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("service", "rule", "isolation_fallback", "gray", "breaker", "is_default", "source", "ejection", "health_check")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    GRAY_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EJECTION_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_FIELD_NUMBER: _ClassVar[int]
    service: str
    rule: str
    isolation_fallback: IsolationFallback
    gray: GrayRelease
    breaker: Breaker
    is_default: bool
    source: PolicySource
    ejection: Ejection
    health_check: HealthCheck
    def __init__(self, service: _Optional[str] = ..., rule: _Optional[str] = ..., isolation_fallback: _Optional[_Union[IsolationFallback, str]] = ..., gray: _Optional[_Union[GrayRelease, _Mapping]] = ..., breaker: _Optional[_Union[Breaker, _Mapping]] = ..., is_default: _Optional[bool] = ..., source: _Optional[_Union[PolicySource, str]] = ..., ejection: _Optional[_Union[Ejection, _Mapping]] = ..., health_check: _Optional[_Union[HealthCheck, _Mapping]] = ...) -> None: ...

class HealthCheck(_message.Message):
    __slots__ = ("kind", "path", "interval_ms", "timeout_ms", "unhealthy_after", "healthy_after")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_AFTER_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_AFTER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    path: str
    interval_ms: int
    timeout_ms: int
    unhealthy_after: int
    healthy_after: int
    def __init__(self, kind: _Optional[str] = ..., path: _Optional[str] = ..., interval_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., unhealthy_after: _Optional[int] = ..., healthy_after: _Optional[int] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: Policy
    def __init__(self, policy: _Optional[_Union[Policy, _Mapping]] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetPolicyRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("defaults", "services")
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    defaults: Policy
    services: _containers.RepeatedCompositeFieldContainer[Policy]
    def __init__(self, defaults: _Optional[_Union[Policy, _Mapping]] = ..., services: _Optional[_Iterable[_Union[Policy, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("announce", "heartbeat", "update", "withdraw")
    ANNOUNCE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    announce: Announce
    heartbeat: Heartbeat
    update: Update
    withdraw: Withdraw
    def __init__(self, announce: _Optional[_Union[Announce, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., update: _Optional[_Union[Update, _Mapping]] = ..., withdraw: _Optional[_Union[Withdraw, _Mapping]] = ...) -> None: ...

class Announce(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Update(_message.Message):
    __slots__ = ("instance", "weight", "status", "metadata")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceRef
    weight: int
    status: InstanceStatus
    metadata: Metadata
    def __init__(self, instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., weight: _Optional[int] = ..., status: _Optional[_Union[InstanceStatus, str]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.ScalarMap[str, str]
    def __init__(self, entries: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Withdraw(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceRef]
    def __init__(self, instances: _Optional[_Iterable[_Union[InstanceRef, _Mapping]]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("ack", "closing")
    ACK_FIELD_NUMBER: _ClassVar[int]
    CLOSING_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    closing: Closing
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., closing: _Optional[_Union[Closing, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("lease_id", "seq", "accepted", "refused", "heartbeat_timeout_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    seq: int
    accepted: _containers.RepeatedCompositeFieldContainer[InstanceRef]
    refused: _containers.RepeatedCompositeFieldContainer[Refusal]
    heartbeat_timeout_ms: int
    def __init__(self, lease_id: _Optional[int] = ..., seq: _Optional[int] = ..., accepted: _Optional[_Iterable[_Union[InstanceRef, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[Refusal, _Mapping]]] = ..., heartbeat_timeout_ms: _Optional[int] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("instance", "code", "message")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceRef
    code: int
    message: str
    def __init__(self, instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Closing(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ListServicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListServicesResponse(_message.Message):
    __slots__ = ("services",)
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    services: _containers.RepeatedCompositeFieldContainer[ServiceSummary]
    def __init__(self, services: _Optional[_Iterable[_Union[ServiceSummary, _Mapping]]] = ...) -> None: ...

class ServiceSummary(_message.Message):
    __slots__ = ("name", "instances", "up", "epoch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    instances: int
    up: int
    epoch: int
    def __init__(self, name: _Optional[str] = ..., instances: _Optional[int] = ..., up: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "epoch", "sources")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    epoch: int
    sources: _containers.RepeatedCompositeFieldContainer[SourceState]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., epoch: _Optional[int] = ..., sources: _Optional[_Iterable[_Union[SourceState, _Mapping]]] = ...) -> None: ...

class SourceState(_message.Message):
    __slots__ = ("name", "up", "last_read_unix_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    LAST_READ_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    up: bool
    last_read_unix_seconds: int
    def __init__(self, name: _Optional[str] = ..., up: _Optional[bool] = ..., last_read_unix_seconds: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("snapshot", "added", "updated", "removed", "epoch")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    snapshot: InstanceList
    added: Instance
    updated: Instance
    removed: InstanceRef
    epoch: int
    def __init__(self, snapshot: _Optional[_Union[InstanceList, _Mapping]] = ..., added: _Optional[_Union[Instance, _Mapping]] = ..., updated: _Optional[_Union[Instance, _Mapping]] = ..., removed: _Optional[_Union[InstanceRef, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class InstanceList(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ...) -> None: ...
