"""The blocking client against live rota servers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from rota import (
    CallOutcome,
    CallResult,
    Instance,
    InstanceRef,
    InstanceStatus,
    PickResult,
    RegistrationError,
    RotaClient,
    RotaError,
    use_version,
)
from rota.version import VersionServerInterceptor
from rota_harness import RotaServer, wait_until


def instance(service: str, id: str, port: int, version: str = "") -> Instance:
    return Instance(service, "127.0.0.1", port, id=id, version=version)


@pytest.fixture
def rota(rota_server: RotaServer) -> Any:
    with RotaClient(rota_server.address) as client:
        yield client


def test_register_then_pick(rota: RotaClient, service_name: str) -> None:
    with rota.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002)) as registration:
        assert [ref.id for ref in registration.ack.accepted] == ["a", "b"]
        assert registration.ack.refused == ()
        assert registration.ack.seq == 1
        assert registration.ack.heartbeat_timeout == 15.0
        assert registration.lease_id > 0
        first = rota.pick(service_name)
        assert isinstance(first, PickResult)
        assert (
            first.instance.id,
            first.instance.port,
            first.ticket,
            first.rule,
            first.fallback,
            first.local_fallback,
        ) == ("a", 9001, 0, "round_robin", "", False)
        assert first.epoch > 0
        assert first.instance.status is InstanceStatus.UP
        assert first.instance.weight == 100
        assert [rota.pick(service_name).instance.id for _ in range(3)] == ["b", "a", "b"]
        repeat = rota.pick(service_name, rule="repeat")
        assert (repeat.rule, repeat.ticket, repeat.instance.id) == ("repeat(n=3)", 0, "a")


def test_instance_without_id_is_filed_under_host_and_port(rota: RotaClient, service_name: str) -> None:
    with rota.register(Instance(service_name, "127.0.0.1", 9005)) as registration:
        assert registration.ack.accepted == (InstanceRef(service_name, "127.0.0.1:9005"),)
        assert [i.id for i in registration.instances] == ["127.0.0.1:9005"]
        assert rota.pick(service_name).instance.id == "127.0.0.1:9005"


def test_close_withdraws_at_once(rota: RotaClient, service_name: str) -> None:
    registration = rota.register(instance(service_name, "a", 9001))
    assert rota.pick(service_name).instance.id == "a"
    ack = registration.close()
    assert ack is not None
    assert ack.seq == 2
    assert ack.accepted == (InstanceRef(service_name, "a"),)
    # rota acknowledges only once picks see the change: no waiting needed.
    with pytest.raises(RotaError) as raised:
        rota.pick(service_name)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert (raised.value.reason, raised.value.unreachable) == ("no_eligible_instance", False)
    assert rota.list_instances(service_name).instances == ()
    assert registration.closed
    assert registration.close() is ack  # closing twice is harmless


def test_leaving_the_with_block_withdraws(rota: RotaClient, service_name: str) -> None:
    with rota.register(instance(service_name, "a", 9001)):
        assert rota.list_instances(service_name).ids == ["a"]
    assert rota.list_instances(service_name).ids == []


def test_closing_the_client_withdraws_its_registrations(
    rota_server: RotaServer, rota: RotaClient, service_name: str
) -> None:
    provider = RotaClient(rota_server.address)
    provider.register(instance(service_name, "a", 9001))
    assert rota.list_instances(service_name).ids == ["a"]
    provider.close()
    assert rota.list_instances(service_name).ids == []


def test_strict_registration_refuses_and_registers_nothing(rota: RotaClient, service_name: str) -> None:
    with pytest.raises(RegistrationError) as raised:
        rota.register(instance(service_name, "ok", 9001), Instance(service_name, "127.0.0.1", 0, id="bad-port"))
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert [(r.instance.id, r.code) for r in raised.value.refusals] == [("bad-port", grpc.StatusCode.INVALID_ARGUMENT)]
    assert rota.list_instances(service_name).ids == []


def test_lenient_registration_reports_refusals(rota: RotaClient, service_name: str) -> None:
    with (
        rota.register(instance(service_name, "a", 9001)),
        rota.register(instance(service_name, "a", 9009), instance(service_name, "b", 9002), strict=False) as second,
    ):
        assert [r.id for r in second.ack.accepted] == ["b"]
        assert [(r.instance.id, r.code) for r in second.ack.refused] == [("a", grpc.StatusCode.ALREADY_EXISTS)]
        assert [i.id for i in second.instances] == ["b"]


def test_announce_update_and_withdraw_on_an_open_registration(rota: RotaClient, service_name: str) -> None:
    with rota.register(instance(service_name, "a", 9001)) as registration:
        ack = registration.announce(instance(service_name, "b", 9002))
        assert (ack.seq, [r.id for r in ack.accepted]) == (2, ["b"])
        ack = registration.update(
            InstanceRef(service_name, "a"), status=InstanceStatus.DRAINING, weight=5, metadata={"k": "v"}
        )
        assert (ack.seq, [r.id for r in ack.accepted]) == (3, ["a"])
        listed = {i.id: i for i in rota.list_instances(service_name).instances}
        assert (listed["a"].status, listed["a"].weight, dict(listed["a"].metadata)) == (
            InstanceStatus.DRAINING,
            5,
            {"k": "v"},
        )
        assert [rota.pick(service_name).instance.id for _ in range(2)] == ["b", "b"]
        kept = {i.id: i for i in registration.instances}
        assert (kept["a"].status, kept["a"].weight) == (InstanceStatus.DRAINING, 5)
        ack = registration.withdraw(InstanceRef(service_name, "b"))
        assert (ack.seq, [r.id for r in ack.accepted]) == (4, ["b"])
        assert rota.list_instances(service_name).ids == ["a"]
        assert [i.id for i in registration.instances] == ["a"]


def test_pick_errors_carry_the_status(rota: RotaClient) -> None:
    with pytest.raises(RotaError) as raised:
        rota.pick("py-never-registered")
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.NOT_FOUND, "unknown_service")
    assert raised.value.message == 'service "py-never-registered" has never been registered'
    assert str(raised.value) == 'NOT_FOUND: service "py-never-registered" has never been registered'
    with pytest.raises(RotaError) as raised:
        rota.pick("bad name")
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument")
    with pytest.raises(RotaError) as raised:
        rota.pick("py-never-registered", rule="zigzag")
    assert (raised.value.code, raised.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid_rule")


def test_report_returns_accepted_and_ignored_counts(rota: RotaClient, service_name: str) -> None:
    with rota.register(instance(service_name, "a", 9001)):
        picked = rota.pick(service_name)
        result = rota.report(
            [
                CallOutcome.of(picked, CallResult.OK, 1200),
                CallOutcome(service_name, "a", CallResult.ERROR, latency_us=50),
                CallOutcome(service_name, "nobody", CallResult.OK, latency_us=10),
            ]
        )
        assert (result.accepted, result.ignored) == (2, 1)


def _slow_sum(x: int, y: int) -> int:
    threading.Event().wait(0.02)  # a call that takes a known minimum time
    return x + y


def test_timed_call_reports_and_passes_results_and_exceptions_through(rota: RotaClient, service_name: str) -> None:
    reported: list[CallOutcome] = []
    counts: list[tuple[int, int]] = []
    real_report = rota.report

    def spy(outcomes: Any, **kwargs: Any) -> Any:
        outcomes = list(outcomes)
        reported.extend(outcomes)
        result = real_report(outcomes, **kwargs)
        counts.append((result.accepted, result.ignored))
        return result

    rota.report = spy  # type: ignore[method-assign]
    with rota.register(instance(service_name, "a", 9001)):
        picked = rota.pick(service_name)
        assert rota.timed_call(picked, _slow_sum, 2, y=3) == 5
        with pytest.raises(ValueError, match="boom"):
            rota.timed_call(picked, _raise, ValueError("boom"))
        with pytest.raises(ConnectionRefusedError):
            rota.timed_call(picked, _raise, ConnectionRefusedError())
    assert [(o.service, o.instance_id, o.ticket, o.rule, o.result) for o in reported] == [
        (service_name, "a", 0, "round_robin", CallResult.OK),
        (service_name, "a", 0, "round_robin", CallResult.ERROR),
        (service_name, "a", 0, "round_robin", CallResult.CONNECT_FAILURE),
    ]
    # The first call took at least 20 ms, and the latency is reported in microseconds.
    assert reported[0].latency_us >= 20_000
    assert counts == [(1, 0), (1, 0), (1, 0)]


def _raise(error: BaseException) -> None:
    raise error


def test_list_services_and_instances(rota: RotaClient, service_name: str) -> None:
    with rota.register(instance(service_name, "b", 9002), instance(service_name, "a", 9001)) as registration:
        registration.update(InstanceRef(service_name, "b"), status=InstanceStatus.DOWN)
        listed = rota.list_instances(service_name)
        assert listed.ids == ["a", "b"]
        assert listed.epoch > 0
        summary = {s.name: s for s in rota.list_services()}[service_name]
        assert (summary.instances, summary.up, summary.epoch) == (2, 1, listed.epoch)


def test_watch_gives_a_snapshot_then_changes(rota: RotaClient, service_name: str) -> None:
    events = rota.watch(service_name)
    try:
        snapshot = next(events)
        assert (snapshot.kind, snapshot.instances, snapshot.epoch) == ("snapshot", (), 0)
        with rota.register(instance(service_name, "a", 9001)):
            added = next(events)
            assert (added.kind, added.instance.id if added.instance else None) == ("added", "a")
        removed = next(events)
        assert (removed.kind, removed.ref) == ("removed", InstanceRef(service_name, "a"))
        assert removed.epoch > added.epoch
    finally:
        events.close()  # type: ignore[attr-defined]


def test_follow_keeps_a_cache_of_the_service(rota: RotaClient, service_name: str) -> None:
    cache = rota.follow(service_name)
    assert rota.follow(service_name) is cache
    assert cache.wait_for(lambda c: c.synced, timeout=5)
    with rota.register(instance(service_name, "a", 9001), instance(service_name, "v", 9002, version="zlt")):
        assert cache.wait_for(lambda c: [i.id for i in c.instances()] == ["a", "v"], timeout=5)
    assert cache.wait_for(lambda c: c.instances() == [], timeout=5)


def test_server_side_unavailable_is_not_answered_locally(rota: RotaClient, service_name: str) -> None:
    cache = rota.follow(service_name)
    with rota.register(instance(service_name, "a", 9001)):
        assert cache.wait_for(lambda c: [i.id for i in c.instances()] == ["a"], timeout=5)
        with pytest.raises(RotaError) as raised:
            rota.pick(service_name, exclude=["a"])
        assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, False)
        assert "that is not excluded" in raised.value.message


def test_pick_answers_from_the_watched_list_when_rota_is_killed(
    private_server: Callable[..., RotaServer], service_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = private_server()
    with RotaClient(server.address, follow=[service_name]) as consumer, RotaClient(server.address) as provider:
        registration = provider.register(
            instance(service_name, "a", 9001),
            instance(service_name, "b", 9002),
            instance(service_name, "z", 9003, version="zlt"),
        )
        cache = consumer.follow(service_name)
        assert cache.wait_for(lambda c: [i.id for i in c.instances()] == ["a", "b", "z"], timeout=5)
        live = consumer.pick(service_name)
        assert (live.instance.id, live.local_fallback) == ("a", False)

        server.kill()
        with caplog.at_level("WARNING", logger="rota"):
            local = [consumer.pick(service_name) for _ in range(3)]
        assert [(p.instance.id, p.local_fallback, p.rule, p.ticket) for p in local] == [
            ("a", True, "round_robin", 0),
            ("b", True, "round_robin", 1),
            ("a", True, "round_robin", 2),
        ]
        # One warning for the outage, not one per pick.
        assert sum("locally" in r.getMessage() for r in caplog.records) == 1
        with use_version("zlt"):
            assert consumer.pick(service_name).instance.id == "z"
        nobody = consumer.pick(service_name, version="nobody")
        assert (nobody.instance.id, nobody.local_fallback, bool(nobody.fallback)) == ("b", True, True)
        # A service nobody followed has no list to fall back to.
        with pytest.raises(RotaError) as raised:
            consumer.pick("py-not-followed")
        assert (raised.value.code, raised.value.reason, raised.value.unreachable) == (
            grpc.StatusCode.UNAVAILABLE,
            "",
            True,
        )
        # rota is gone: closing does not hang and reports that nothing acknowledged the withdrawal.
        assert registration.close(timeout=1) is None


def test_registration_survives_on_heartbeats(private_server: Callable[..., RotaServer], service_name: str) -> None:
    server = private_server("--heartbeat-timeout", "1s")
    with RotaClient(server.address) as rota, rota.register(instance(service_name, "a", 9001)) as registration:
        assert registration.ack.heartbeat_timeout == 1.0
        lease = registration.lease_id
        # Three heartbeat timeouts pass; heartbeats every third of one keep the lease.
        threading.Event().wait(3.0)
        assert (registration.lease_id, registration.reconnects) == (lease, 0)
        assert rota.pick(service_name).instance.id == "a"


def test_reconnects_and_announces_again_after_rota_drops_the_stream(
    private_server: Callable[..., RotaServer], service_name: str
) -> None:
    server = private_server("--heartbeat-timeout", "1s")
    with RotaClient(server.address) as rota:
        registration = rota.register(instance(service_name, "a", 9001))
        registration.announce(instance(service_name, "b", 9002))
        first_lease = registration.lease_id
        # Silence the heartbeats: rota expires the lease, sends Closing and ends the stream.
        registration._send_heartbeat = lambda stream: None  # type: ignore[method-assign]
        assert wait_until(lambda: registration.reconnects >= 1, timeout=10)
        del registration._send_heartbeat
        assert registration.lease_id != first_lease
        assert rota.list_instances(service_name).ids == ["a", "b"]
        assert [rota.pick(service_name).instance.id for _ in range(2)] == ["a", "b"]
        ack = registration.close()
        assert ack is not None and sorted(r.id for r in ack.accepted) == ["a", "b"]
        assert rota.list_instances(service_name).ids == []


def test_an_instance_taken_meanwhile_is_pending_until_rota_accepts_it(
    private_server: Callable[..., RotaServer], service_name: str
) -> None:
    """The lease expires, another provider takes "b", and the re-announcement is refused "b"
    (ALREADY_EXISTS): the registration lists only "a" until "b" is free and its retry accepted."""
    server = private_server("--heartbeat-timeout", "1s")
    with RotaClient(server.address) as rota, RotaClient(server.address) as other:
        registration = rota.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002))
        reopen = threading.Event()
        open_stream = registration._open

        def gated_open(instances: list[Instance]) -> Any:
            reopen.wait(10)
            return open_stream(instances)

        registration._open = gated_open  # type: ignore[method-assign]
        registration._send_heartbeat = lambda stream: None  # type: ignore[method-assign]
        assert wait_until(lambda: rota.list_instances(service_name).ids == [], timeout=10), server.log()
        del registration._send_heartbeat
        taker = other.register(instance(service_name, "b", 9003))
        reopen.set()
        assert wait_until(lambda: registration.reconnects >= 1, timeout=10)
        assert [i.id for i in registration.instances] == ["a"]
        assert [i.port for i in rota.list_instances(service_name).instances] == [9001, 9003]

        taker.close()
        assert wait_until(lambda: [i.id for i in registration.instances] == ["a", "b"], timeout=10)
        assert [i.port for i in rota.list_instances(service_name).instances] == [9001, 9002]
        ack = registration.close()
        assert ack is not None and sorted(r.id for r in ack.accepted) == ["a", "b"]


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_registers_again_after_rota_restarts_on_the_same_port(
    private_server: Callable[..., RotaServer], service_name: str, stop: str
) -> None:
    """rota stops (SIGTERM: Closing, drain, exit; SIGKILL: the connection drops) and a new
    server starts on the same port: the registration announces its instances again, with the
    changes made since, and closing it withdraws them from the new server."""
    first = private_server("--shutdown-grace", "500ms")
    # The default reconnection schedule, as an application would have it.
    with RotaClient(first.address) as rota:
        registration = rota.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002))
        registration.update(InstanceRef(service_name, "b"), status=InstanceStatus.DRAINING)
        assert rota.pick(service_name).instance.id == "a"

        if stop == "sigterm":
            first.stop()
            assert first.process is not None and first.process.returncode == 0, first.log()
        else:
            first.kill()
        second = private_server("--shutdown-grace", "500ms", listen=first.address)
        assert second.address == first.address

        def registered_again() -> bool:
            try:
                return rota.list_instances(service_name, timeout=1).ids == ["a", "b"]
            except RotaError:
                return False

        # The new server knows only what the registration announces again.
        assert wait_until(registered_again, timeout=15), second.log()
        listed = {i.id: i.status for i in rota.list_instances(service_name).instances}
        assert listed == {"a": InstanceStatus.UP, "b": InstanceStatus.DRAINING}
        picked = rota.pick(service_name)
        assert (picked.instance.id, picked.ticket, picked.local_fallback) == ("a", 0, False)

        ack = registration.close()
        assert ack is not None and sorted(r.id for r in ack.accepted) == ["a", "b"]
        assert rota.list_instances(service_name).ids == []
        with pytest.raises(RotaError) as raised:
            rota.pick(service_name)
        assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, False)


def test_register_fails_fast_when_rota_is_unreachable() -> None:
    with RotaClient("127.0.0.1:1") as rota, pytest.raises(RotaError) as raised:
        rota.register(Instance("py-nowhere", "127.0.0.1", 9001))
    assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, True)


def test_version_follows_an_incoming_grpc_call_into_the_pick(rota: RotaClient, service_name: str) -> None:
    """A service behind VersionServerInterceptor picks with the caller's x-rota-version."""

    def handle(request: bytes, context: Any) -> bytes:
        return rota.pick(service_name).instance.id.encode()

    server = grpc.server(ThreadPoolExecutor(max_workers=2), interceptors=[VersionServerInterceptor()])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Gateway", {"Call": grpc.unary_unary_rpc_method_handler(handle)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with (
            rota.register(
                instance(service_name, "plain-1", 9001), instance(service_name, "zlt-1", 9002, version="zlt")
            ),
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Gateway/Call")
            assert call(b"", metadata=(("x-rota-version", "zlt"),), timeout=5) == b"zlt-1"
            assert call(b"", timeout=5) == b"plain-1"
            assert call(b"", metadata=(("x-rota-version", "nobody"),), timeout=5) == b"plain-1"
    finally:
        server.stop(grace=None).wait(5)


def test_register_takes_instances_not_a_list() -> None:
    with RotaClient("127.0.0.1:1") as rota, pytest.raises(TypeError, match=r"register\(\*instances\) for a list"):
        rota.register([Instance("py-x", "127.0.0.1", 9001)])  # type: ignore[arg-type]
