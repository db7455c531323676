"""Runs one conformance scenario (clients/conformance/scenarios/*.json) through a rota client.

The step semantics follow clients/conformance/README.md. The runner is written once, against
a small driver interface, and driven by the sync client and by the asyncio client.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from rota import (
    Ack,
    AsyncRegistration,
    AsyncRotaClient,
    CallOutcome,
    CallResult,
    Instance,
    InstanceRef,
    InstanceStatus,
    PickResult,
    Registration,
    ReportResult,
    RotaClient,
    RotaError,
    WatchEvent,
)
from rota._convert import pb
from rota_harness import SCENARIOS, RotaServer

#: Longest wait for a watch event or a followed list, per step.
PATIENCE = 10.0


def scenario_files() -> list[Path]:
    """Every scenario file, discovered by listing the folder."""
    return sorted(SCENARIOS.glob("*.json"))


class StepFailed(AssertionError):
    pass


def needs_own_server(path: Path) -> bool:
    """Scenarios that stop their server run on a server of their own."""
    return any(step["op"] == "stop_server" for step in json.loads(path.read_text())["steps"])


#: Starts a server: ``(extra args, listen address)``; the conformance tests pass their fixture.
ServerFactory = Callable[..., RotaServer]


class Driver(Protocol):
    async def connect(self, count: int) -> None: ...
    async def register(self, stream: str, instances: list[Instance]) -> Ack: ...
    async def withdraw(self, stream: str) -> Ack | None: ...
    async def update(self, stream: str, ref: InstanceRef, status: InstanceStatus | None, weight: int | None) -> Ack: ...
    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult: ...
    async def list_ids(self, service: str) -> list[str]: ...
    async def report(self, connection: int, outcomes: list[CallOutcome]) -> ReportResult: ...
    async def lease(self, connection: int, request: pb.LeaseRequest) -> Any: ...
    async def watch(self, name: str, connection: int, service: str) -> None: ...
    async def next_event(self, name: str) -> WatchEvent: ...
    async def follow(self, connection: int, service: str, expect_ids: list[str]) -> list[str]: ...
    async def stop_server(self) -> None: ...
    async def start_server(self, warmup: str) -> None: ...
    async def close(self) -> None: ...


_INSTANCE_FIELDS = {"service", "id", "host", "port", "version", "zone", "weight", "metadata", "status"}
_REQUEST_FIELDS = {"service", "rule", "version", "key", "zone", "exclude"}


def instance_from_json(data: dict[str, Any]) -> Instance:
    unknown = set(data) - _INSTANCE_FIELDS
    if unknown:
        raise StepFailed(f"unknown instance fields {sorted(unknown)}")
    status = data.get("status")
    return Instance(
        service=data.get("service", ""),
        host=data.get("host", ""),
        port=data.get("port", 0),
        id=data.get("id", ""),
        version=data.get("version", ""),
        zone=data.get("zone", ""),
        weight=data.get("weight"),
        metadata=dict(data.get("metadata", {})),
        # Missing fields take their proto defaults: no status is INSTANCE_STATUS_UNSPECIFIED.
        status=InstanceStatus[status] if status else InstanceStatus.UNSPECIFIED,
    )


def pick_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    unknown = set(request) - _REQUEST_FIELDS
    if unknown:
        raise StepFailed(f"unknown request fields {sorted(unknown)}")
    return {
        "rule": request.get("rule", ""),
        # Explicit, so that no ambient version (rota.version) can leak into a scenario.
        "version": request.get("version", ""),
        "key": request.get("key", ""),
        "zone": request.get("zone", ""),
        "exclude": list(request.get("exclude", [])),
    }


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def _expect_keys(step: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(step) - allowed
    _check(not unknown, f"unknown step fields {sorted(unknown)}")


async def run_scenario(path: Path, driver: Driver) -> None:
    scenario = json.loads(path.read_text())
    unknown = set(scenario) - {"name", "connections", "steps"}
    if unknown:
        raise StepFailed(f"{path.name}: unknown scenario fields {sorted(unknown)}")
    await driver.connect(int(scenario.get("connections", 1)))
    try:
        for index, step in enumerate(scenario["steps"]):
            try:
                await _run_step(step, driver)
            except StepFailed as failure:
                raise StepFailed(
                    f"{path.name} ({scenario['name']}): step {index} ({step['op']}) failed: {failure}"
                ) from None
    finally:
        await driver.close()


async def _run_step(step: dict[str, Any], driver: Driver) -> None:
    op = step["op"]
    if op == "register":
        _expect_keys(step, {"op", "stream", "instances", "expect_accepted", "expect_refused"})
        instances = [instance_from_json(i) for i in step["instances"]]
        ack = await driver.register(step["stream"], instances)
        expected_accepted = step.get("expect_accepted", [i.ref.id for i in instances])
        expected_refused = {(r["id"], r["code"]) for r in step.get("expect_refused", [])}
        accepted = [ref.id for ref in ack.accepted]
        refused = {(r.instance.id, r.code.name) for r in ack.refused}
        _check(accepted == expected_accepted, f"accepted {accepted}, expected {expected_accepted}")
        _check(refused == expected_refused, f"refused {sorted(refused)}, expected {sorted(expected_refused)}")
    elif op == "withdraw":
        _expect_keys(step, {"op", "stream"})
        withdrawn = await driver.withdraw(step["stream"])
        _check(withdrawn is not None, "the Withdraw was not acknowledged")
    elif op == "pick":
        _expect_keys(step, {"op", "connection", "request", "expect"})
        await _pick(driver, step.get("connection", 0), step["request"], step["expect"])
    elif op == "pick_sequence":
        _expect_keys(
            step,
            {
                "op",
                "connections",
                "request",
                "count",
                "expect_ids",
                "expect_fallback",
                "expect_tickets",
                "expect_rule",
                "expect_local",
            },
        )
        connections: Sequence[int] = step["connections"]
        ids = []
        tickets = []
        local = step.get("expect_local", False)
        for i in range(step["count"]):
            try:
                picked = await driver.pick(connections[i % len(connections)], step["request"])
            except RotaError as error:
                raise StepFailed(f"pick {i} failed: {error}") from None
            _check(
                picked.local_fallback == local, f"pick {i} has local_fallback {picked.local_fallback}, expected {local}"
            )
            if "expect_rule" in step:
                _check(
                    picked.rule == step["expect_rule"],
                    f"pick {i} has rule {picked.rule!r}, expected {step['expect_rule']!r}",
                )
            tickets.append(picked.ticket)
            if "expect_fallback" in step:
                wanted_fallback = "some" if step["expect_fallback"] else "none"
                _check(
                    bool(picked.fallback) == step["expect_fallback"],
                    f"pick {i} has fallback {picked.fallback!r}, expected {wanted_fallback}",
                )
            ids.append(picked.instance.id)
        _check(ids == step["expect_ids"], f"picked {ids}, expected {step['expect_ids']}")
        if "expect_tickets" in step:
            _check(tickets == step["expect_tickets"], f"tickets {tickets}, expected {step['expect_tickets']}")
    elif op == "list":
        _expect_keys(step, {"op", "service", "expect_ids"})
        ids = await driver.list_ids(step["service"])
        _check(ids == step["expect_ids"], f"listed {ids}, expected {step['expect_ids']}")
    elif op == "update":
        _expect_keys(step, {"op", "stream", "service", "id", "status", "weight"})
        status = InstanceStatus[step["status"]] if "status" in step else None
        ref = InstanceRef(step["service"], step["id"])
        ack = await driver.update(step["stream"], ref, status, step.get("weight"))
        accepted = [r.id for r in ack.accepted]
        _check(accepted == [step["id"]] and not ack.refused, f"update acked {accepted}, refused {ack.refused}")
    elif op == "report":
        _expect_keys(step, {"op", "connection", "outcomes", "expect_accepted", "expect_ignored"})
        outcomes = [_outcome_from_json(o) for o in step["outcomes"]]
        result = await driver.report(step.get("connection", 0), outcomes)
        wanted = (step.get("expect_accepted", len(outcomes)), step.get("expect_ignored", 0))
        got = (result.accepted, result.ignored)
        _check(got == wanted, f"report accepted/ignored {got}, expected {wanted}")
    elif op == "lease":
        _expect_keys(step, {"op", "connection", "request", "expect"})
        request = step["request"]
        unknown = set(request) - {"service", "rule", "version", "count", "exclude"}
        _check(not unknown, f"unknown lease request fields {sorted(unknown)}")
        expect = step["expect"]
        unknown = set(expect) - {"first_ticket", "count", "ids", "positions", "rule", "fallback"}
        _check(not unknown, f"unknown lease expectation {sorted(unknown)}")
        leased = await driver.lease(step.get("connection", 0), pb.LeaseRequest(**request))
        got_lease = (leased.first_ticket, leased.count, [i.id for i in leased.instances])
        wanted_lease = (expect["first_ticket"], expect["count"], expect["ids"])
        _check(got_lease == wanted_lease, f"leased {got_lease}, expected {wanted_lease}")
        if "positions" in expect:
            got_positions = list(leased.positions)
            _check(
                got_positions == expect["positions"], f"lease positions {got_positions}, expected {expect['positions']}"
            )
        if "rule" in expect:
            _check(leased.rule == expect["rule"], f"lease rule {leased.rule!r}, expected {expect['rule']!r}")
        if "fallback" in expect:
            _check(bool(leased.fallback) == expect["fallback"], f"lease fallback {leased.fallback!r}")
    elif op == "watch":
        _expect_keys(step, {"op", "watch", "connection", "service"})
        await driver.watch(step["watch"], step.get("connection", 0), step["service"])
    elif op == "watch_expect":
        _expect_keys(step, {"op", "watch", "events"})
        for n, expected in enumerate(step["events"]):
            want = _describe_expected(expected)
            try:
                got_event = _describe(await driver.next_event(step["watch"]))
            except (TimeoutError, queue.Empty):
                raise StepFailed(f"event {n}: none within {PATIENCE:g}s, expected {want}") from None
            _check(got_event == want, f"event {n}: got {got_event}, expected {want}")
    elif op == "follow":
        _expect_keys(step, {"op", "connection", "service", "expect_ids"})
        seen = await driver.follow(step.get("connection", 0), step["service"], step["expect_ids"])
        _check(seen == step["expect_ids"], f"the followed list is {seen}, expected {step['expect_ids']}")
    elif op == "stop_server":
        _expect_keys(step, {"op"})
        await driver.stop_server()
    elif op == "start_server":
        _expect_keys(step, {"op", "warmup"})
        await driver.start_server(step["warmup"])
    else:
        raise StepFailed(f"unknown op {op!r}")


def _outcome_from_json(data: dict[str, Any]) -> CallOutcome:
    unknown = set(data) - {"service", "instance_id", "ticket", "rule", "latency_us", "result"}
    _check(not unknown, f"unknown outcome fields {sorted(unknown)}")
    return CallOutcome(
        service=data.get("service", ""),
        instance_id=data.get("instance_id", ""),
        result=CallResult[data["result"]],
        latency_us=data.get("latency_us", 0),
        ticket=data.get("ticket", 0),
        rule=data.get("rule", ""),
    )


def _describe(event: WatchEvent) -> str:
    if event.kind == "snapshot":
        return f"snapshot {[i.id for i in event.instances]}"
    if event.kind == "removed":
        assert event.ref is not None
        return f"removed {event.ref.id}"
    assert event.instance is not None
    if event.kind == "updated":
        return f"updated {event.instance.id} {event.instance.status.name}"
    return f"added {event.instance.id}"


def _describe_expected(expected: dict[str, Any]) -> str:
    unknown = set(expected) - {"snapshot", "added", "updated", "removed", "status"}
    _check(not unknown, f"unknown event fields {sorted(unknown)}")
    kinds = [k for k in ("snapshot", "added", "updated", "removed") if k in expected]
    _check(len(kinds) == 1, f"an event names exactly one of snapshot, added, updated, removed: {expected}")
    kind = kinds[0]
    if kind == "snapshot":
        return f"snapshot {expected['snapshot']}"
    if kind == "updated":
        return f"updated {expected['updated']} {expected.get('status', 'UP')}"
    return f"{kind} {expected[kind]}"


async def _pick(driver: Driver, connection: int, request: dict[str, Any], expect: dict[str, Any]) -> None:
    if "error" in expect:
        _check(set(expect) <= {"error", "message_contains", "unreachable"}, f"unknown expectation {sorted(expect)}")
        try:
            picked = await driver.pick(connection, request)
        except RotaError as error:
            _check(error.code is grpc.StatusCode[expect["error"]], f"failed with {error}, expected {expect['error']}")
            needle = expect.get("message_contains")
            _check(needle is None or needle in error.message, f"message {error.message!r} lacks {needle!r}")
            if "unreachable" in expect:
                _check(error.unreachable == expect["unreachable"], f"unreachable is {error.unreachable} for {error}")
            return
        raise StepFailed(f"picked {picked.instance.id}, expected the error {expect['error']}")
    _check(set(expect) <= {"id", "fallback", "ticket", "rule", "local"}, f"unknown expectation {sorted(expect)}")
    try:
        picked = await driver.pick(connection, request)
    except RotaError as error:
        raise StepFailed(f"the pick failed: {error}") from None
    local = expect.get("local", False)
    _check(picked.local_fallback == local, f"local_fallback {picked.local_fallback}, expected {local}")
    if "rule" in expect:
        _check(picked.rule == expect["rule"], f"rule {picked.rule!r}, expected {expect['rule']!r}")
    _check(picked.instance.id == expect["id"], f"picked {picked.instance.id}, expected {expect['id']}")
    if "fallback" in expect:
        _check(
            bool(picked.fallback) == expect["fallback"], f"fallback {picked.fallback!r}, expected {expect['fallback']}"
        )
    if "ticket" in expect:
        _check(picked.ticket == expect["ticket"], f"ticket {picked.ticket}, expected {expect['ticket']}")


def _ids(client_cache: Any) -> list[str]:
    return [i.id for i in client_cache.instances()]


class SyncDriver:
    """Drives :class:`rota.RotaClient`; its blocking calls are quick against a local server.

    ``server`` is the scenario's own server, for ``stop_server``; ``start`` starts another one
    (for ``start_server``).
    """

    def __init__(self, address: str, server: RotaServer | None = None, start: ServerFactory | None = None) -> None:
        self.address = address
        self.server = server
        self.start = start
        self.connections: list[RotaClient] = []
        self.streams: dict[str, Registration] = {}
        self.watches: dict[str, queue.Queue[WatchEvent]] = {}
        self.registrar: RotaClient | None = None

    async def connect(self, count: int) -> None:
        self.connections = [RotaClient(self.address) for _ in range(count)]
        self.registrar = RotaClient(self.address)

    async def register(self, stream: str, instances: list[Instance]) -> Ack:
        assert self.registrar is not None
        if stream in self.streams:
            return self.streams[stream].announce(*instances)
        registration = self.registrar.register(*instances, strict=False)
        self.streams[stream] = registration
        assert registration.ack is not None
        return registration.ack

    async def withdraw(self, stream: str) -> Ack | None:
        return self.streams.pop(stream).close()

    async def update(self, stream: str, ref: InstanceRef, status: InstanceStatus | None, weight: int | None) -> Ack:
        return self.streams[stream].update(ref, status=status, weight=weight)

    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult:
        return self.connections[connection].pick(request.get("service", ""), **pick_kwargs(request))

    async def list_ids(self, service: str) -> list[str]:
        return self.connections[0].list_instances(service).ids

    async def report(self, connection: int, outcomes: list[CallOutcome]) -> ReportResult:
        return self.connections[connection].report(outcomes)

    async def lease(self, connection: int, request: pb.LeaseRequest) -> Any:
        # The Python client has no Lease call of its own; the conformance runner uses its stub.
        try:
            return self.connections[connection]._balancer.Lease(request, timeout=PATIENCE)
        except grpc.RpcError as error:
            raise StepFailed(f"lease failed: {RotaError.from_rpc_error(error)}") from None

    async def watch(self, name: str, connection: int, service: str) -> None:
        events: queue.Queue[WatchEvent] = queue.Queue()
        stream = self.connections[connection].watch(service)

        def feed() -> None:
            try:
                for event in stream:
                    events.put(event)
            except RotaError:
                return

        threading.Thread(target=feed, name=f"conformance-watch-{name}", daemon=True).start()
        self.watches[name] = events

    async def next_event(self, name: str) -> WatchEvent:
        return self.watches[name].get(timeout=PATIENCE)

    async def follow(self, connection: int, service: str, expect_ids: list[str]) -> list[str]:
        cache = self.connections[connection].follow(service)
        cache.wait_for(lambda c: _ids(c) == expect_ids, PATIENCE)
        return _ids(cache)

    async def stop_server(self) -> None:
        _check(self.server is not None, "stop_server needs the scenario's own server")
        assert self.server is not None and self.registrar is not None
        self.server.kill()
        # The providers are gone with it: nothing may re-announce to a later server.
        self.registrar.close()
        self.streams.clear()

    async def start_server(self, warmup: str) -> None:
        _check(self.start is not None, "start_server needs a way to start servers")
        assert self.start is not None
        self.server = self.start("--warmup", warmup, "--shutdown-grace", "100ms", listen=self.address)
        # A connection of its own: the process-wide subchannel to this address may still be
        # backing off from the stopped server.
        self.registrar = RotaClient(self.address, options=[("grpc.use_local_subchannel_pool", 1)])

    async def close(self) -> None:
        for client in [*self.connections, *([self.registrar] if self.registrar else [])]:
            client.close()


class AsyncDriver:
    """Drives :class:`rota.AsyncRotaClient`."""

    def __init__(self, address: str, server: RotaServer | None = None, start: ServerFactory | None = None) -> None:
        self.address = address
        self.server = server
        self.start = start
        self.connections: list[AsyncRotaClient] = []
        self.streams: dict[str, AsyncRegistration] = {}
        self.watches: dict[str, Any] = {}
        self.registrar: AsyncRotaClient | None = None

    async def connect(self, count: int) -> None:
        self.connections = [AsyncRotaClient(self.address) for _ in range(count)]
        self.registrar = AsyncRotaClient(self.address)

    async def register(self, stream: str, instances: list[Instance]) -> Ack:
        assert self.registrar is not None
        if stream in self.streams:
            return await self.streams[stream].announce(*instances)
        registration = await self.registrar.register(*instances, strict=False)
        self.streams[stream] = registration
        assert registration.ack is not None
        return registration.ack

    async def withdraw(self, stream: str) -> Ack | None:
        return await self.streams.pop(stream).close()

    async def update(self, stream: str, ref: InstanceRef, status: InstanceStatus | None, weight: int | None) -> Ack:
        return await self.streams[stream].update(ref, status=status, weight=weight)

    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult:
        return await self.connections[connection].pick(request.get("service", ""), **pick_kwargs(request))

    async def list_ids(self, service: str) -> list[str]:
        return (await self.connections[0].list_instances(service)).ids

    async def report(self, connection: int, outcomes: list[CallOutcome]) -> ReportResult:
        return await self.connections[connection].report(outcomes)

    async def lease(self, connection: int, request: pb.LeaseRequest) -> Any:
        # The Python client has no Lease call of its own; the conformance runner uses its stub.
        try:
            return await self.connections[connection]._balancer.Lease(request, timeout=PATIENCE)
        except grpc.RpcError as error:
            raise StepFailed(f"lease failed: {RotaError.from_rpc_error(error)}") from None

    async def watch(self, name: str, connection: int, service: str) -> None:
        self.watches[name] = self.connections[connection].watch(service).__aiter__()

    async def next_event(self, name: str) -> WatchEvent:
        event: WatchEvent = await asyncio.wait_for(self.watches[name].__anext__(), PATIENCE)
        return event

    async def follow(self, connection: int, service: str, expect_ids: list[str]) -> list[str]:
        cache = self.connections[connection].follow(service)
        await cache.wait_for_async(lambda c: _ids(c) == expect_ids, PATIENCE)
        return _ids(cache)

    async def stop_server(self) -> None:
        _check(self.server is not None, "stop_server needs the scenario's own server")
        assert self.server is not None and self.registrar is not None
        await asyncio.to_thread(self.server.kill)
        # The providers are gone with it: nothing may re-announce to a later server.
        await self.registrar.close()
        self.streams.clear()

    async def start_server(self, warmup: str) -> None:
        _check(self.start is not None, "start_server needs a way to start servers")
        assert self.start is not None
        start = self.start
        self.server = await asyncio.to_thread(
            lambda: start("--warmup", warmup, "--shutdown-grace", "100ms", listen=self.address)
        )
        # A connection of its own: the process-wide subchannel to this address may still be
        # backing off from the stopped server.
        self.registrar = AsyncRotaClient(self.address, options=[("grpc.use_local_subchannel_pool", 1)])

    async def close(self) -> None:
        for watch in self.watches.values():
            await watch.aclose()
        for client in [*self.connections, *([self.registrar] if self.registrar else [])]:
            await client.close()
