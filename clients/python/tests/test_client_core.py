"""The I/O-free core of the sync and asyncio clients, without a server: a pick and its fallback
(rota._picking), errors and timed calls (rota._calls), the watch behind follow()
(rota._following), a Register stream's acks (rota._register_stream), a registration's state
(rota._registry_state) and the client's settings (rota._settings)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from rota import (
    CallOutcome,
    CallResult,
    Instance,
    InstanceCache,
    InstanceRef,
    PickResult,
    RegistrationError,
    ReportResult,
    RotaError,
    WatchEvent,
    use_version,
)
from rota._calls import (
    BALANCER,
    REGISTRY,
    TimedCall,
    failure_result,
    list_instances_call,
    list_services_call,
    pick_call,
    report_call,
    rota_errors,
)
from rota._convert import pb
from rota._following import Following
from rota._picking import PickAttempt
from rota._register_stream import CANCELLED, ENDED_BY_ROTA, StreamAcks, broken, no_ack
from rota._registry_state import HEARTBEAT, RECONNECT, RETRY_PENDING, RegistrationState, check_instances
from rota._settings import CHANNEL_OPTIONS, channel_options, heartbeat_interval, reconnect_backoff, timeout_or
from rota.fallback import SHORTCUT_AFTER, OutageState
from rota.model import Ack, Refusal

SERVICE = "svc"


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(details)
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers


REFUSED = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
NOTHING_ELIGIBLE = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "nothing", (("rota-error", "no_eligible_instance"),))
NOT_FOUND = FakeRpcError(grpc.StatusCode.NOT_FOUND, "never registered", (("rota-error", "unknown_service"),))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def inst(id: str, version: str = "") -> Instance:
    return Instance(SERVICE, "127.0.0.1", 9000, id=id, version=version)


def synced_cache(*instances: Instance) -> InstanceCache:
    cache = InstanceCache(SERVICE)
    cache.apply(WatchEvent("snapshot", 4, instances=instances))
    return cache


def attempt(outage: OutageState, cache: InstanceCache | None, version: str | None = "", **kw: Any) -> PickAttempt:
    return PickAttempt(outage, cache, SERVICE, kw.get("rule", ""), version, "", "", kw.get("exclude", ()))


# -- a pick ------------------------------------------------------------------------------------


def test_a_pick_asks_for_the_current_version_unless_told_one() -> None:
    outage = OutageState()
    with use_version("canary"):
        assert attempt(outage, None, version=None).request.version == "canary"
        assert attempt(outage, None, version="").request.version == ""
        assert attempt(outage, None, version="dev").request.version == "dev"
    asked = PickAttempt(outage, None, SERVICE, "repeat(n=3)", "", "k", "z", iter(["a", "b"]))
    assert (asked.request.rule, asked.request.key, asked.request.zone) == ("repeat(n=3)", "k", "z")
    assert list(asked.request.exclude) == ["a", "b"] and asked.local is None


def test_rotas_answer_is_the_result_and_ends_the_outage() -> None:
    outage = OutageState()
    for _ in range(SHORTCUT_AFTER):
        outage.unreachable()
    response = pb.PickResponse(instance=pb.Instance(id="a", service=SERVICE, host="h", port=1), ticket=9, rule="r")
    picked = attempt(outage, None).answered(response)
    assert (picked.instance.id, picked.ticket, picked.local_fallback) == ("a", 9, False)
    assert not outage.shortcut()


def test_unreachable_rota_falls_back_to_a_synced_cache_only() -> None:
    outage = OutageState()
    with pytest.raises(RotaError) as raised:
        attempt(outage, None).failed(REFUSED)
    assert raised.value.unreachable and raised.value.__suppress_context__
    with pytest.raises(RotaError):
        attempt(outage, InstanceCache(SERVICE)).failed(REFUSED)  # no snapshot yet
    cache = synced_cache(inst("a"), inst("b"))
    picked = [attempt(OutageState(), cache).failed(REFUSED) for _ in range(3)]
    assert [(p.instance.id, p.ticket, p.local_fallback) for p in picked] == [
        ("a", 0, True),
        ("b", 1, True),
        ("a", 2, True),
    ]


def test_rotas_own_errors_are_raised_and_reset_the_failures() -> None:
    clock = FakeClock()
    outage = OutageState(clock)
    cache = synced_cache(inst("a"))
    for _ in range(SHORTCUT_AFTER - 1):
        attempt(outage, cache).failed(REFUSED)
    for error in (NOTHING_ELIGIBLE, NOT_FOUND):
        with pytest.raises(RotaError) as raised:
            attempt(outage, cache).failed(error)
        assert raised.value.code is error.code() and not raised.value.unreachable
    attempt(outage, cache).failed(REFUSED)
    assert not outage.shortcut(), "the count started over"


def test_the_short_cut_answers_followed_services_without_a_request() -> None:
    clock = FakeClock()
    outage = OutageState(clock)
    cache = synced_cache(inst("a"), inst("b"))
    for _ in range(SHORTCUT_AFTER):
        attempt(outage, cache).failed(REFUSED)
    local = attempt(outage, cache).local
    assert local is not None and local.local_fallback and local.instance.id == "b"
    assert attempt(outage, None).local is None, "a service not followed still asks rota"
    clock.now += 1.0
    assert attempt(outage, cache).local is None, "after a second rota is asked again"


def test_nothing_eligible_locally_is_rotas_kind_of_answer() -> None:
    cache = synced_cache(inst("a"), inst("v", "dev"))
    with pytest.raises(RotaError) as raised:
        attempt(OutageState(), cache, version="dev", exclude=["v"]).failed(REFUSED)
    assert (raised.value.reason, raised.value.unreachable) == ("no_eligible_instance", False)
    assert 'version "dev"' in raised.value.message


# -- errors and timed calls --------------------------------------------------------------------


def test_rota_errors_turns_grpc_errors_into_rota_errors_only() -> None:
    with pytest.raises(RotaError) as raised, rota_errors():
        raise NOT_FOUND
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.NOT_FOUND, "unknown_service")
    assert raised.value.__suppress_context__
    with pytest.raises(ValueError), rota_errors():
        raise ValueError("not grpc's")


def test_the_unary_calls_to_rota() -> None:
    outcome = CallOutcome(SERVICE, "a", CallResult.OK, 12, ticket=4, rule="round_robin")
    report = report_call([outcome])
    assert (report.stub, report.method, report.local) == (BALANCER, "Report", None)
    assert [(o.instance_id, o.latency_us, o.ticket) for o in report.request.outcomes] == [("a", 12, 4)]
    assert report.answered(pb.ReportResponse(accepted=1, ignored=2)) == ReportResult(1, 2)
    with pytest.raises(RotaError) as raised:
        report.failed(NOT_FOUND)
    assert raised.value.reason == "unknown_service" and raised.value.__suppress_context__

    listing = list_instances_call(SERVICE)
    assert (listing.stub, listing.method, listing.request.service) == (REGISTRY, "ListInstances", SERVICE)
    answer = pb.ListInstancesResponse(instances=[pb.Instance(id="a", service=SERVICE)], epoch=6)
    assert (listing.answered(answer).ids, listing.answered(answer).epoch) == (["a"], 6)
    services = list_services_call()
    assert (services.stub, services.method) == (REGISTRY, "ListServices")
    summary = services.answered(pb.ListServicesResponse(services=[pb.ServiceSummary(name=SERVICE, instances=2, up=1)]))
    assert [(s.name, s.instances, s.up) for s in summary] == [(SERVICE, 2, 1)]

    outage = OutageState()
    pick = pick_call(attempt(outage, synced_cache(inst("a"))))
    assert (pick.stub, pick.method, pick.request.service, pick.local) == (BALANCER, "Pick", SERVICE, None)
    assert pick.failed(REFUSED).local_fallback, "a pick falls back where other calls raise"


def picked(local: bool = False) -> PickResult:
    return PickResult(inst("a"), ticket=5, rule="round_robin", fallback="", epoch=1, local_fallback=local)


def test_a_timed_call_reports_its_latency_and_result() -> None:
    timed = TimedCall(picked(), started_ns=1_000_000)
    outcome = timed.outcome(CallResult.OK, ended_ns=3_500_000)
    assert outcome is not None
    assert (outcome.service, outcome.instance_id, outcome.ticket, outcome.rule) == (SERVICE, "a", 5, "round_robin")
    assert (outcome.result, outcome.latency_us) == (CallResult.OK, 2500)
    assert failure_result(ConnectionRefusedError()) is CallResult.CONNECT_FAILURE
    assert failure_result(ValueError()) is CallResult.ERROR
    failed = TimedCall(picked()).failed(ConnectionResetError())
    assert failed is not None and failed.result is CallResult.CONNECT_FAILURE and failed.latency_us >= 0


def test_a_locally_picked_call_reports_nothing() -> None:
    assert TimedCall(picked(local=True)).outcome(CallResult.OK) is None
    assert TimedCall(picked(local=True)).failed(ValueError()) is None


# -- following ---------------------------------------------------------------------------------


class RecordingBackoff:
    def __init__(self) -> None:
        self.resets = 0
        self.delays = 0

    def next_delay(self) -> float:
        self.delays += 1
        return 0.25

    def reset(self) -> None:
        self.resets += 1


def following(clock: FakeClock, outage: OutageState | None = None) -> tuple[Following, RecordingBackoff]:
    backoff = RecordingBackoff()
    return Following(InstanceCache(SERVICE), outage or OutageState(clock), clock, backoff), backoff  # type: ignore[arg-type]


def test_watch_events_go_into_the_cache_and_a_snapshot_ends_the_outage() -> None:
    clock = FakeClock()
    outage = OutageState(clock)
    for _ in range(SHORTCUT_AFTER):
        outage.unreachable()
    watch, _ = following(clock, outage)
    assert watch.request.service == SERVICE
    watch.received(pb.WatchEvent(added=pb.Instance(id="x", service=SERVICE, host="h", port=1), epoch=2))
    assert outage.shortcut() and not watch.cache.synced, "only a snapshot says rota is back"
    watch.received(pb.WatchEvent(snapshot=pb.InstanceList(instances=[pb.Instance(id="a", service=SERVICE)]), epoch=3))
    assert not outage.shortcut() and watch.cache.synced
    assert [i.id for i in watch.cache.instances()] == ["a"] and watch.cache.epoch == 3
    watch.received(pb.WatchEvent(epoch=4))  # an event kind newer than the stubs
    assert watch.cache.epoch == 3


def test_a_refused_service_name_stops_the_watch_other_failures_do_not() -> None:
    watch, _ = following(FakeClock())
    assert not watch.interrupted(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad name"))
    assert watch.interrupted(REFUSED)
    assert watch.interrupted(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "rota is shutting down"))


@pytest.mark.parametrize(("lived", "resets"), [(4.99, 0), (5.0, 1)])
def test_the_backoff_starts_over_only_after_a_stable_stream(lived: float, resets: int) -> None:
    clock = FakeClock()
    watch, backoff = following(clock)
    watch.opened()
    clock.now += lived
    watch.ended()
    assert backoff.resets == resets
    assert watch.next_delay() == 0.25 and backoff.delays == 1


# -- a Register stream -------------------------------------------------------------------------


def ack_message(lease: int, *accepted: str) -> pb.RegisterResponse:
    refs = [pb.InstanceRef(service=SERVICE, id=i) for i in accepted]
    return pb.RegisterResponse(ack=pb.Ack(lease_id=lease, accepted=refs, heartbeat_timeout_ms=15_000))


def test_acks_answer_their_requests_in_order() -> None:
    acks: StreamAcks[str] = StreamAcks()
    acks.expect("first")
    acks.expect("second")
    answered = acks.received(ack_message(7, "a"))
    assert answered is not None and answered[0] == "first"
    assert (answered[1].lease_id, answered[1].accepted, answered[1].heartbeat_timeout) == (
        7,
        (InstanceRef(SERVICE, "a"),),
        15.0,
    )
    second = acks.received(ack_message(7))
    assert second is not None and second[0] == "second"
    assert acks.received(ack_message(7)) is None, "an ack nobody waits for"


def test_a_stream_ends_with_the_reason_rota_gave() -> None:
    acks: StreamAcks[str] = StreamAcks()
    acks.expect("left")
    acks.expect("forgotten")
    assert acks.forget("forgotten") and not acks.forget("forgotten")
    assert acks.received(pb.RegisterResponse(closing=pb.Closing(reason="lease expired"))) is None
    waiting, error = acks.end()
    assert waiting == ["left"]
    assert (error.code, error.unreachable, error.message) == (
        grpc.StatusCode.UNAVAILABLE,
        True,
        "rota closed the stream: lease expired",
    )
    assert acks.end_reason == "rota closed the stream: lease expired"
    assert acks.gone().message == "registration stream ended: rota closed the stream: lease expired"


def test_why_a_stream_ended_otherwise() -> None:
    quiet: StreamAcks[str] = StreamAcks()
    waiting, error = quiet.end()
    assert (waiting, error.message, quiet.end_reason) == ([], ENDED_BY_ROTA, ENDED_BY_ROTA)
    failed: StreamAcks[str] = StreamAcks()
    failed.broke(REFUSED)
    failed.end()
    assert failed.end_reason == "UNAVAILABLE: failed to connect to all addresses"
    cancelled: StreamAcks[str] = StreamAcks()
    cancelled.cancelled()
    cancelled.end()
    assert cancelled.end_reason == CANCELLED
    assert no_ack(2.5).code is grpc.StatusCode.DEADLINE_EXCEEDED and "2.5s" in no_ack(2.5).message
    assert broken(OSError("reset")).message == "registration stream broken: reset"


# -- a registration ----------------------------------------------------------------------------


def ack(lease: int, accepted: Sequence[str] = (), refused: Sequence[tuple[str, grpc.StatusCode]] = ()) -> Ack:
    return Ack(
        lease_id=lease,
        seq=1,
        accepted=tuple(InstanceRef(SERVICE, i) for i in accepted),
        refused=tuple(Refusal(InstanceRef(SERVICE, i), code, "no") for i, code in refused),
        heartbeat_timeout=15.0,
    )


def test_a_registration_heartbeats_retries_and_reconnects() -> None:
    state = RegistrationState(ack_timeout=5.0)
    state.opened([inst("a"), inst("b")], ack(1, ["a", "b"]))
    assert (state.lease_id, state.interval, state.ack is not None) == (1, 5.0, True)
    assert state.next_step(stream_ended=False) == HEARTBEAT
    assert state.next_step(stream_ended=True, end_reason="gone") == RECONNECT
    assert [i.id for i in state.reannouncement()] == ["a", "b"]

    # rota still holds "b" on the lost lease: it is retried, "a" is registered again.
    state.backoff.next_delay()
    assert state.reconnected(state.reannouncement(), ack(2, ["a"], [("b", grpc.StatusCode.ALREADY_EXISTS)]))
    assert (state.lease_id, state.reconnects, state.backoff.attempt) == (2, 1, 0)
    assert state.next_step(stream_ended=False) == RETRY_PENDING
    assert [i.id for i in state.reannouncement()] == ["a", "b"], "a new stream announces the pending too"
    retry = state.retry()
    assert [i.id for i in retry.request.announce.instances] == ["b"]
    retry.record(ack(2, ["b"]))
    assert state.next_step(stream_ended=False) == HEARTBEAT
    assert [i.id for i in state.desired.instances()] == ["a", "b"]


def test_an_instance_refused_for_now_is_pending_not_registered() -> None:
    state = RegistrationState(ack_timeout=5.0)
    state.opened([inst("a"), inst("b"), inst("c")], ack(1, ["a", "b", "c"]))
    announced = state.reannouncement()
    assert state.reconnected(
        announced, ack(2, ["a"], [("b", grpc.StatusCode.UNAVAILABLE), ("c", grpc.StatusCode.ALREADY_EXISTS)])
    )
    assert [i.id for i in state.desired.instances()] == ["a"], "only what rota acknowledged"
    assert [i.id for i in state.desired.pending.values()] == ["b", "c"]
    assert [i.id for i in state.reannouncement()] == ["a", "b", "c"], "each instance once"

    # The next stream is refused "b" again: it stays pending, and is still announced once.
    assert state.reconnected(state.reannouncement(), ack(3, ["a", "c"], [("b", grpc.StatusCode.UNAVAILABLE)]))
    assert [i.id for i in state.desired.instances()] == ["a", "c"]
    assert [i.id for i in state.desired.pending.values()] == ["b"]
    assert [i.id for i in state.reannouncement()] == ["a", "c", "b"]
    retry = state.retry()
    assert [i.id for i in retry.request.announce.instances] == ["b"]
    retry.record(ack(3, [], [("b", grpc.StatusCode.ALREADY_EXISTS)]))
    assert [i.id for i in state.desired.instances()] == ["a", "c"] and list(state.desired.pending) == [
        InstanceRef(SERVICE, "b")
    ]
    retry.record(ack(3, ["b"]))
    assert [i.id for i in state.desired.instances()] == ["a", "c", "b"] and not state.desired.pending

    # Refused for good after being pending: neither registered nor retried.
    state.reconnected(state.reannouncement(), ack(4, ["a", "b"], [("c", grpc.StatusCode.UNAVAILABLE)]))
    state.retry().record(ack(4, [], [("c", grpc.StatusCode.PERMISSION_DENIED)]))
    assert [i.id for i in state.desired.instances()] == ["a", "b"] and not state.desired.pending
    assert state.next_step(stream_ended=False) == HEARTBEAT


def test_withdrawing_a_pending_instance_stops_its_retries() -> None:
    state = RegistrationState(ack_timeout=5.0)
    state.opened([inst("a"), inst("b")], ack(1, ["a", "b"]))
    state.reconnected(state.reannouncement(), ack(2, ["a"], [("b", grpc.StatusCode.ALREADY_EXISTS)]))
    # rota does not hold "b" on this lease, so it refuses to withdraw it.
    state.withdraw([InstanceRef(SERVICE, "b")]).record(ack(2, [], [("b", grpc.StatusCode.NOT_FOUND)]))
    assert not state.desired.pending and state.next_step(stream_ended=False) == HEARTBEAT
    assert [i.id for i in state.reannouncement()] == ["a"]


def test_changes_are_recorded_only_as_rota_accepted_them() -> None:
    state = RegistrationState(ack_timeout=5.0)
    state.opened([inst("a")], ack(1, ["a"]))
    announce = state.announce([inst("b"), inst("c")])
    assert [i.id for i in announce.request.announce.instances] == ["b", "c"]
    announce.record(ack(1, ["b"], [("c", grpc.StatusCode.INVALID_ARGUMENT)]))
    assert [i.id for i in state.desired.instances()] == ["a", "b"]

    update = state.update(inst("a"), 7, None, {"k": "v"})
    assert (update.request.update.instance.id, update.request.update.weight) == ("a", 7)
    update.record(ack(1, ["a"]))
    assert (state.desired.instances()[0].weight, state.desired.instances()[0].metadata) == (7, {"k": "v"})
    refused_update = state.update(InstanceRef(SERVICE, "b"), 9, None, None)
    refused_update.record(ack(1, [], [("b", grpc.StatusCode.NOT_FOUND)]))
    assert state.desired.instances()[1].weight is None

    withdraw = state.withdraw([inst("b")])
    assert [r.id for r in withdraw.request.withdraw.instances] == ["b"]
    withdraw.record(ack(1, ["b"]))
    assert [i.id for i in state.desired.instances()] == ["a"]
    everything = state.withdraw([])
    assert list(everything.request.withdraw.instances) == []
    everything.record(ack(1))
    assert state.desired.instances() == []


def test_a_strict_registration_fails_on_a_refusal() -> None:
    state = RegistrationState(ack_timeout=5.0)
    assert state.refusal(strict=True) is None, "not open yet"
    state.opened([inst("a"), inst("b")], ack(1, ["a"], [("b", grpc.StatusCode.INVALID_ARGUMENT)]))
    error = state.refusal(strict=True)
    assert isinstance(error, RegistrationError) and [r.instance.id for r in error.refusals] == ["b"]
    assert state.refusal(strict=False) is None
    clean = RegistrationState(ack_timeout=5.0)
    clean.opened([inst("a")], ack(1, ["a"]))
    assert clean.refusal(strict=True) is None


def test_a_registration_closes_once_with_the_ack_it_got() -> None:
    state = RegistrationState(ack_timeout=5.0)
    assert state.timeout(None) == 5.0 and state.timeout(1.0) == 1.0
    state.check_open()
    assert state.begin_close() and not state.begin_close()
    with pytest.raises(RuntimeError, match="closed"):
        state.check_open()
    # A re-announcement answered after close() began: its stream is not taken, its withdrawal counts.
    assert not state.reconnected([inst("a")], ack(3, ["a"]))
    assert (state.lease_id, state.reconnects) == (0, 0)
    late = ack(3, ["a"])
    state.withdrawn_late(late)
    assert state.closed(None) is late, "the withdrawal a re-announcement made"
    own = ack(2, ["a"])
    assert state.closed(own) is own and state.close_ack is own


def test_register_takes_instances_not_a_list() -> None:
    check_instances((inst("a"),))
    with pytest.raises(TypeError, match=r"register\(\*instances\)"):
        check_instances(([inst("a")],))


# -- settings ----------------------------------------------------------------------------------


def test_settings() -> None:
    assert channel_options([("grpc.x", 1)]) == [*CHANNEL_OPTIONS, ("grpc.x", 1)]
    assert (timeout_or(2.0, None), timeout_or(2.0, 0.5), timeout_or(None, None)) == (2.0, 0.5, None)
    assert heartbeat_interval(ack(1)) == 5.0
    assert heartbeat_interval(Ack(1, 1, (), (), 0.0)) == 0.01
    backoff = reconnect_backoff()
    assert (backoff.initial, backoff.cap) == (0.1, 10.0)
