"""The asyncio client against live rota servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from rota import (
    AsyncRegistration,
    AsyncRotaClient,
    CallOutcome,
    CallResult,
    Instance,
    InstanceRef,
    InstanceStatus,
    RegistrationError,
    RotaError,
)
from rota.version import AsyncVersionServerInterceptor
from rota_harness import RotaServer


def instance(service: str, id: str, port: int, version: str = "") -> Instance:
    return Instance(service, "127.0.0.1", port, id=id, version=version)


@pytest.fixture
async def rota(rota_server: RotaServer) -> AsyncIterator[AsyncRotaClient]:
    async with AsyncRotaClient(rota_server.address) as client:
        yield client


async def test_register_then_pick(rota: AsyncRotaClient, service_name: str) -> None:
    async with rota.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002)) as registration:
        assert isinstance(registration, AsyncRegistration)
        assert registration.ack is not None
        assert [ref.id for ref in registration.ack.accepted] == ["a", "b"]
        assert registration.ack.heartbeat_timeout == 15.0
        picks = [await rota.pick(service_name) for _ in range(3)]
        assert [(p.instance.id, p.ticket, p.rule, p.local_fallback) for p in picks] == [
            ("a", 0, "round_robin", False),
            ("b", 1, "round_robin", False),
            ("a", 2, "round_robin", False),
        ]
    with pytest.raises(RotaError) as raised:
        await rota.pick(service_name)
    assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, False)


async def test_await_register_and_close_withdraws(rota: AsyncRotaClient, service_name: str) -> None:
    registration = await rota.register(instance(service_name, "a", 9001))
    assert (await rota.list_instances(service_name)).ids == ["a"]
    ack = await registration.close()
    assert ack is not None and ack.accepted == (InstanceRef(service_name, "a"),)
    assert (await rota.list_instances(service_name)).ids == []
    assert await registration.close() is ack


async def test_closing_the_client_withdraws_its_registrations(
    rota_server: RotaServer, rota: AsyncRotaClient, service_name: str
) -> None:
    provider = AsyncRotaClient(rota_server.address)
    await provider.register(instance(service_name, "a", 9001))
    assert (await rota.list_instances(service_name)).ids == ["a"]
    await provider.close()
    assert (await rota.list_instances(service_name)).ids == []


async def test_strict_registration_refuses(rota: AsyncRotaClient, service_name: str) -> None:
    with pytest.raises(RegistrationError) as raised:
        await rota.register(instance(service_name, "ok", 9001), Instance(service_name, "127.0.0.1", 0, id="bad-port"))
    assert [(r.instance.id, r.code) for r in raised.value.refusals] == [("bad-port", grpc.StatusCode.INVALID_ARGUMENT)]
    assert (await rota.list_instances(service_name)).ids == []


async def test_announce_update_withdraw(rota: AsyncRotaClient, service_name: str) -> None:
    async with rota.register(instance(service_name, "a", 9001)) as registration:
        ack = await registration.announce(instance(service_name, "b", 9002))
        assert (ack.seq, [r.id for r in ack.accepted]) == (2, ["b"])
        ack = await registration.update(instance(service_name, "a", 9001), status=InstanceStatus.DRAINING)
        assert (ack.seq, [r.id for r in ack.accepted]) == (3, ["a"])
        assert [(await rota.pick(service_name)).instance.id for _ in range(2)] == ["b", "b"]
        ack = await registration.withdraw(InstanceRef(service_name, "b"))
        assert [r.id for r in ack.accepted] == ["b"]
        assert [(i.id, i.status) for i in registration.instances] == [("a", InstanceStatus.DRAINING)]


async def test_report_and_timed_call(rota: AsyncRotaClient, service_name: str) -> None:
    async with rota.register(instance(service_name, "a", 9001)):
        picked = await rota.pick(service_name)
        result = await rota.report(
            [CallOutcome.of(picked, CallResult.OK, 900), CallOutcome("py-nobody", "x", CallResult.OK)]
        )
        assert (result.accepted, result.ignored) == (1, 1)

        reported: list[CallResult] = []
        real_report = rota.report

        async def spy(outcomes: Any, **kwargs: Any) -> Any:
            outcomes = list(outcomes)
            reported.extend(o.result for o in outcomes)
            answer = await real_report(outcomes, **kwargs)
            assert (answer.accepted, answer.ignored) == (1, 0)
            return answer

        rota.report = spy  # type: ignore[method-assign]

        async def double(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        async def fail() -> None:
            raise ConnectionResetError("reset")

        assert await rota.timed_call(picked, double, 21) == 42
        with pytest.raises(ConnectionResetError):
            await rota.timed_call(picked, fail)
        assert reported == [CallResult.OK, CallResult.CONNECT_FAILURE]


async def test_watch_gives_a_snapshot_then_changes(rota: AsyncRotaClient, service_name: str) -> None:
    events = rota.watch(service_name)
    try:
        snapshot = await anext(events)
        assert (snapshot.kind, snapshot.instances, snapshot.epoch) == ("snapshot", (), 0)
        async with rota.register(instance(service_name, "a", 9001)):
            added = await anext(events)
            assert (added.kind, added.instance.id if added.instance else None) == ("added", "a")
        removed = await anext(events)
        assert (removed.kind, removed.ref) == ("removed", InstanceRef(service_name, "a"))
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def test_pick_answers_from_the_watched_list_when_rota_is_killed(
    private_server: Callable[..., RotaServer], service_name: str
) -> None:
    server = private_server()
    async with AsyncRotaClient(server.address) as consumer, AsyncRotaClient(server.address) as provider:
        cache = consumer.follow(service_name)
        registration = await provider.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002))
        assert await cache.wait_for_async(lambda c: [i.id for i in c.instances()] == ["a", "b"], timeout=5)
        live = await consumer.pick(service_name)
        assert (live.instance.id, live.local_fallback) == ("a", False)

        server.kill()
        local = [await consumer.pick(service_name) for _ in range(3)]
        assert [(p.instance.id, p.local_fallback, p.ticket) for p in local] == [
            ("a", True, 0),
            ("b", True, 1),
            ("a", True, 2),
        ]
        with pytest.raises(RotaError) as raised:
            await consumer.pick("py-not-followed")
        assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, True)
        assert await registration.close(timeout=1) is None


async def test_reconnects_and_announces_again_after_rota_drops_the_stream(
    private_server: Callable[..., RotaServer], service_name: str
) -> None:
    server = private_server("--heartbeat-timeout", "1s")
    async with AsyncRotaClient(server.address) as rota:
        registration = await rota.register(instance(service_name, "a", 9001))
        first_lease = registration.lease_id
        paused = asyncio.Event()
        resumed = asyncio.Event()
        real_heartbeat = registration._send_heartbeat

        async def silent(stream: Any) -> None:
            if registration.reconnects:
                resumed.set()
                await real_heartbeat(stream)
            else:
                paused.set()

        registration._send_heartbeat = silent  # type: ignore[method-assign]
        await asyncio.wait_for(paused.wait(), 5)
        await asyncio.wait_for(resumed.wait(), 10)
        assert registration.lease_id != first_lease
        assert (await rota.list_instances(service_name)).ids == ["a"]
        assert (await rota.pick(service_name)).instance.id == "a"


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
async def test_registers_again_after_rota_restarts_on_the_same_port(
    private_server: Callable[..., RotaServer], service_name: str, stop: str
) -> None:
    """See the blocking client's test of the same name."""
    first = private_server("--shutdown-grace", "500ms")
    async with AsyncRotaClient(first.address) as rota:
        registration = await rota.register(instance(service_name, "a", 9001), instance(service_name, "b", 9002))
        await registration.update(InstanceRef(service_name, "b"), status=InstanceStatus.DRAINING)
        assert (await rota.pick(service_name)).instance.id == "a"

        if stop == "sigterm":
            await asyncio.to_thread(first.stop)
            assert first.process is not None and first.process.returncode == 0, first.log()
        else:
            await asyncio.to_thread(first.kill)
        second = private_server("--shutdown-grace", "500ms", listen=first.address)
        assert second.address == first.address

        async def registered_again() -> bool:
            try:
                return (await rota.list_instances(service_name, timeout=1)).ids == ["a", "b"]
            except RotaError:
                return False

        deadline = asyncio.get_running_loop().time() + 15
        while not await registered_again():
            assert asyncio.get_running_loop().time() < deadline, f"not registered again within 15s:\n{second.log()}"
            await asyncio.sleep(0.01)
        listed = {i.id: i.status for i in (await rota.list_instances(service_name)).instances}
        assert listed == {"a": InstanceStatus.UP, "b": InstanceStatus.DRAINING}
        picked = await rota.pick(service_name)
        assert (picked.instance.id, picked.ticket, picked.local_fallback) == ("a", 0, False)

        ack = await registration.close()
        assert ack is not None and sorted(r.id for r in ack.accepted) == ["a", "b"]
        assert (await rota.list_instances(service_name)).ids == []


async def test_version_follows_an_incoming_grpc_call_into_the_pick(rota: AsyncRotaClient, service_name: str) -> None:
    async def handle(request: bytes, context: Any) -> bytes:
        return (await rota.pick(service_name)).instance.id.encode()

    server = grpc.aio.server(interceptors=[AsyncVersionServerInterceptor()])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Gateway", {"Call": grpc.unary_unary_rpc_method_handler(handle)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with rota.register(
            instance(service_name, "plain-1", 9001), instance(service_name, "zlt-1", 9002, version="zlt")
        ):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Gateway/Call")
                answers = await asyncio.gather(
                    call(b"", metadata=(("x-rota-version", "zlt"),), timeout=5),
                    call(b"", timeout=5),
                    call(b"", metadata=(("x-rota-version", "zlt"),), timeout=5),
                )
                assert list(answers) == [b"zlt-1", b"plain-1", b"zlt-1"]
    finally:
        await server.stop(None)
