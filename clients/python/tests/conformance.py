"""Runs one conformance scenario (clients/conformance/scenarios/*.json) through a rota client.

The step semantics follow clients/conformance/README.md. The runner is written once, against
a small driver interface, and driven by the sync client and by the asyncio client.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from rota import Ack, AsyncRotaClient, Instance, InstanceStatus, PickResult, RotaClient, RotaError
from rota_harness import SCENARIOS


def scenario_files() -> list[Path]:
    """Every scenario file, discovered by listing the folder."""
    return sorted(SCENARIOS.glob("*.json"))


class StepFailed(AssertionError):
    pass


class Driver(Protocol):
    async def connect(self, count: int) -> None: ...
    async def register(self, stream: str, instances: list[Instance]) -> Ack: ...
    async def withdraw(self, stream: str) -> Ack | None: ...
    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult: ...
    async def list_ids(self, service: str) -> list[str]: ...
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
        ack = await driver.withdraw(step["stream"])
        _check(ack is not None, "the Withdraw was not acknowledged")
    elif op == "pick":
        _expect_keys(step, {"op", "connection", "request", "expect"})
        await _pick(driver, step.get("connection", 0), step["request"], step["expect"])
    elif op == "pick_sequence":
        _expect_keys(step, {"op", "connections", "request", "count", "expect_ids", "expect_fallback"})
        connections: Sequence[int] = step["connections"]
        ids = []
        for i in range(step["count"]):
            picked = await driver.pick(connections[i % len(connections)], step["request"])
            _check(not picked.local_fallback, "a pick was answered by the local fallback")
            if "expect_fallback" in step:
                wanted = "some" if step["expect_fallback"] else "none"
                _check(
                    bool(picked.fallback) == step["expect_fallback"],
                    f"pick {i} has fallback {picked.fallback!r}, expected {wanted}",
                )
            ids.append(picked.instance.id)
        _check(ids == step["expect_ids"], f"picked {ids}, expected {step['expect_ids']}")
    elif op == "list":
        _expect_keys(step, {"op", "service", "expect_ids"})
        ids = await driver.list_ids(step["service"])
        _check(ids == step["expect_ids"], f"listed {ids}, expected {step['expect_ids']}")
    else:
        raise StepFailed(f"unknown op {op!r}")


async def _pick(driver: Driver, connection: int, request: dict[str, Any], expect: dict[str, Any]) -> None:
    if "error" in expect:
        _check(set(expect) <= {"error", "message_contains"}, f"unknown expectation {sorted(expect)}")
        try:
            picked = await driver.pick(connection, request)
        except RotaError as error:
            _check(error.code is grpc.StatusCode[expect["error"]], f"failed with {error}, expected {expect['error']}")
            needle = expect.get("message_contains")
            _check(needle is None or needle in error.message, f"message {error.message!r} lacks {needle!r}")
            return
        raise StepFailed(f"picked {picked.instance.id}, expected the error {expect['error']}")
    _check(set(expect) <= {"id", "fallback", "ticket"}, f"unknown expectation {sorted(expect)}")
    try:
        picked = await driver.pick(connection, request)
    except RotaError as error:
        raise StepFailed(f"the pick failed: {error}") from None
    _check(not picked.local_fallback, "the pick was answered by the local fallback")
    _check(picked.instance.id == expect["id"], f"picked {picked.instance.id}, expected {expect['id']}")
    if "fallback" in expect:
        _check(
            bool(picked.fallback) == expect["fallback"], f"fallback {picked.fallback!r}, expected {expect['fallback']}"
        )
    if "ticket" in expect:
        _check(picked.ticket == expect["ticket"], f"ticket {picked.ticket}, expected {expect['ticket']}")


class SyncDriver:
    """Drives :class:`rota.RotaClient`; its blocking calls are quick against a local server."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.connections: list[RotaClient] = []
        self.streams: dict[str, Any] = {}
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

    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult:
        return self.connections[connection].pick(request.get("service", ""), **pick_kwargs(request))

    async def list_ids(self, service: str) -> list[str]:
        return self.connections[0].list_instances(service).ids

    async def close(self) -> None:
        for client in [*self.connections, *([self.registrar] if self.registrar else [])]:
            client.close()


class AsyncDriver:
    """Drives :class:`rota.AsyncRotaClient`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.connections: list[AsyncRotaClient] = []
        self.streams: dict[str, Any] = {}
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

    async def pick(self, connection: int, request: dict[str, Any]) -> PickResult:
        return await self.connections[connection].pick(request.get("service", ""), **pick_kwargs(request))

    async def list_ids(self, service: str) -> list[str]:
        return (await self.connections[0].list_instances(service)).ids

    async def close(self) -> None:
        for client in [*self.connections, *([self.registrar] if self.registrar else [])]:
            await client.close()
