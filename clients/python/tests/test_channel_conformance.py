"""The shared channel scenarios (clients/conformance/channel/*.json, README there) run through
``rota.channel``; consumers after the first are separate Python processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

import rota
from echo_fleet import EchoFleet, Received, echo_pb2, echo_pb2_grpc
from rota._tickets import TicketMapping
from rota_harness import REPO_ROOT, RotaServer

SCENARIOS = sorted((REPO_ROOT / "clients" / "conformance" / "channel").glob("*.json"))
CONSUMER = Path(__file__).resolve().parent / "channel_consumer.py"
CONSUMER_TIMEOUT = 120.0


def leased(r: Received) -> int | None:
    return None if r.ticket is None or r.ticket.startswith("L") else int(r.ticket)


class Runner:
    def __init__(self, scenario: dict[str, Any], private_server: Callable[..., RotaServer]) -> None:
        self.scenario = scenario
        self.private_server = private_server
        self.server = private_server()
        self.fleet = EchoFleet()
        self.client = rota.RotaClient(self.server.address)
        self.weights = {i["id"]: i.get("weight", 100) for i in scenario["instances"]}
        self.registrations = {}
        for spec in scenario["instances"]:
            instance = rota.Instance(
                service="echo",
                host="127.0.0.1",
                port=self.fleet.start(spec["id"]),
                id=spec["id"],
                version=spec.get("version", ""),
                weight=spec.get("weight"),
            )
            self.registrations[spec["id"]] = self.client.register(instance)
        self.target = f"rota://{self.server.address}/{scenario.get('service', 'echo')}"
        self.channel = rota.channel(self.target, rule=scenario["rule"], ticket_header=True)
        self.stub = echo_pb2_grpc.EchoStub(self.channel)
        self.seen: set[int] = set()

    def close(self) -> None:
        self.channel.close()
        self.client.close()
        self.fleet.close()

    def call(self, version: str = "", deadline_ms: int = 5000) -> str | None:
        try:
            self.stub.Echo(
                echo_pb2.EchoRequest(message="first"),
                timeout=deadline_ms / 1000,
                metadata=[("x-rota-version", version)] if version else None,
            )
        except grpc.RpcError as error:
            return str(error.details())
        return None

    def step(self, step: dict[str, Any]) -> None:
        if "calls" in step:
            self.calls(step)
        elif "withdraw" in step:
            self.registrations.pop(step["withdraw"]).close()
            withdrawn = time.monotonic()
            made = 0
            while time.monotonic() - withdrawn < step["within_ms"] / 1000 or made < 20:
                self.call()
                made += 1
            late = [r for r in self.fleet.since(withdrawn + step["within_ms"] / 1000) if r.instance == step["withdraw"]]
            assert not late, f"{step['withdraw']} still reached after {step['within_ms']} ms: {late[:3]}"
        elif "kill" in step:
            self.fleet.kill(step["kill"])
        elif step.get("stop_rota"):
            self.server.kill()
        elif step.get("restart_rota"):
            self.server = self.private_server(listen=self.server.address)
        elif step.get("await_leases"):
            started = time.monotonic()
            while True:
                before = len(self.fleet.received)
                self.call()
                if any(leased(r) is not None for r in self.fleet.received[before:]):
                    return
                assert time.monotonic() - started < step["within_ms"] / 1000, "no leased ticket in time"
                time.sleep(0.02)
        else:
            raise AssertionError(f"unknown step {step}")

    def calls(self, step: dict[str, Any]) -> None:
        n, version = step["calls"], step.get("version", "")
        deadline_ms = step.get("deadline_ms", 5000)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CONSUMER.parent), *sys.path])}
        before = len(self.fleet.received)
        others = [
            subprocess.Popen(
                [sys.executable, str(CONSUMER), self.target, self.scenario["rule"], str(n), version, str(deadline_ms)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(step.get("consumers", 1) - 1)
        ]
        failures = [f for f in (self.call(version, deadline_ms) for _ in range(n)) if f is not None]
        for process in others:
            out, _ = process.communicate(timeout=CONSUMER_TIMEOUT)
            assert process.returncode == 0, out
            failures += json.loads(out)["failures"]
        received = self.fleet.received[before:]
        self.check(step.get("expect", {}), received, failures)

    def check(self, expect: dict[str, Any], received: list[Received], failures: list[str]) -> None:
        if "failures" in expect:
            assert len(failures) == expect["failures"], failures
        if "error_contains" in expect:
            assert all(expect["error_contains"] in f for f in failures), failures
        tickets = [leased(r) for r in received]
        if expect.get("leased") is True:
            assert None not in tickets, [r.ticket for r in received]
        if expect.get("leased") is False:
            assert all(t is None for t in tickets)
        if "rotation" in expect:
            ids = sorted(expect["rotation"])
            mapping = TicketMapping(self.scenario["rule"], [self.weights.get(i) or 100 for i in ids])
            for r, t in zip(received, tickets, strict=True):
                assert t is not None, f"call to {r.instance} without a leased ticket"
                assert t not in self.seen, f"ticket {t} used twice"
                self.seen.add(t)
                assert ids[mapping.map(t)] == r.instance, (t, r.instance)
        if "runs" in expect:
            size = expect["runs"]
            by_ticket = {t: r.instance for r, t in zip(received, tickets, strict=True) if t is not None}
            for t in by_ticket:
                group = t - t % size
                if all(group + k in by_ticket for k in range(size)):
                    assert len({by_ticket[group + k] for k in range(size)}) == 1, group
        if "only" in expect:
            assert {r.instance for r in received} <= set(expect["only"])
        if "never" in expect:
            assert not {r.instance for r in received} & set(expect["never"])
        if expect.get("spread"):
            assert {r.instance for r in received} == set(expect["only"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_channel_scenario(path: Path, private_server: Callable[..., RotaServer]) -> None:
    runner = Runner(json.loads(path.read_text()), private_server)
    try:
        for step in runner.scenario["steps"]:
            runner.step(step)
    finally:
        runner.close()
