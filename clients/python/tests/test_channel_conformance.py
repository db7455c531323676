"""The shared channel scenarios (clients/conformance/channel/*.json, README there), each run
through ``rota.channel`` and through ``rota.aio.channel``; consumers after the first are separate
Python processes with a channel of the same flavour."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import pytest
from google.protobuf import json_format

import rota
import rota.aio
from echo_fleet import EchoFleet, Received, echo_pb2, echo_pb2_grpc
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota_harness import REPO_ROOT, RotaServer, wait_until
from rule_oracle import position

SCENARIO_DIR = REPO_ROOT / "clients" / "conformance" / "channel"
SCENARIOS = sorted(SCENARIO_DIR.glob("*.json"))
CONSUMER = Path(__file__).resolve().parent / "channel_consumer.py"
CONSUMER_TIMEOUT = 120.0
FLAVOURS = ("sync", "aio")
#: Scenario files (by stem) the Python channels cannot run, each with the reason. Every other
#: file in the folder runs with both flavours; test_every_scenario_is_run_or_listed checks it.
UNSUPPORTED: dict[str, str] = {}

#: The keys the format (the folder's README) defines; anything else is refused, so that a
#: misspelt expectation fails instead of passing unchecked.
SCENARIO_KEYS = {"name", "rule", "service", "instances", "policy", "steps"}
INSTANCE_KEYS = {"id", "version", "weight", "unreachable"}
STEP_KEYS = {
    "calls": {"calls", "consumers", "version", "deadline_ms", "expect"},
    "withdraw": {"withdraw", "within_ms"},
    "kill": {"kill"},
    "hang": {"hang"},
    "stop_rota": {"stop_rota"},
    "restart_rota": {"restart_rota"},
    "await_leases": {"await_leases", "within_ms"},
    "draw": {"draw"},
}
EXPECT_KEYS = {
    "failures",
    "error_contains",
    "leased",
    "rotation",
    "runs",
    "only",
    "never",
    "spread",
    "counts",
    "balanced",
    "reported",
}
#: rota runs with its admin listener on a free loopback port, for ``reported``.
ADMIN_ARGS = ("--admin-listen", "127.0.0.1:0")
#: ``reported`` polls rota's admin API every REPORTED_EVERY seconds for at most REPORTED_WITHIN.
REPORTED_WITHIN = 10.0
REPORTED_EVERY = 0.075
#: How long restart_rota waits for the registrations to be listed again.
RESTART_PATIENCE = 20.0
#: A kill step calls until as many calls in a row succeed as there are instances, in at
#: most this many times that many calls.
CALLS_AFTER_KILL = 10
#: withdraw (and the xDS runner's drain and trip) call on until at least this many calls started
#: later than within_ms after the change (the READMEs of clients/conformance/channel and xds) ...
CALLS_AFTER_CHANGE = 20
#: ... and fail if that many have not started within this many seconds past within_ms (a client
#: whose calls each wait out their deadline), rather than call on for as long as it takes.
CHANGE_PATIENCE = 20.0


class ScenarioError(ValueError):
    """A scenario file outside the format."""


def validate(
    scenario: dict[str, Any],
    *,
    scenario_keys: set[str] = SCENARIO_KEYS,
    required: tuple[str, ...] = ("name", "rule", "instances", "steps"),
    step_keys: dict[str, set[str]] = STEP_KEYS,
    expect_keys: set[str] = EXPECT_KEYS,
) -> None:
    """Refuses keys the format does not define, anywhere in the scenario.

    The keyword arguments are this format's keys; the xDS scenarios (test_xds_conformance.py)
    pass theirs."""

    def refuse(where: str, keys: set[str]) -> None:
        if keys:
            raise ScenarioError(f"unknown keys in {where}: {sorted(keys)}")

    refuse("the scenario", set(scenario) - scenario_keys)
    for key in required:
        if key not in scenario:
            raise ScenarioError(f"the scenario has no {key!r}")
    for i, instance in enumerate(scenario["instances"]):
        refuse(f"instances[{i}]", set(instance) - INSTANCE_KEYS)
    if "policy" in scenario:
        if "service" in scenario["policy"]:
            raise ScenarioError("policy names no service: it is set for the scenario's service")
        try:
            json_format.ParseDict(scenario["policy"], pb.Policy())
        except json_format.ParseError as error:
            raise ScenarioError(f"policy: {error}") from None
    for i, step in enumerate(scenario["steps"]):
        actions = [k for k in step_keys if k in step]
        if len(actions) != 1:
            raise ScenarioError(f"steps[{i}] has {len(actions)} actions ({actions}), not one: {step}")
        refuse(f"steps[{i}]", set(step) - step_keys[actions[0]])
        refuse(f"steps[{i}].expect", set(step.get("expect", {})) - expect_keys)


def leased(r: Received) -> int | None:
    return None if r.ticket is None or r.ticket.startswith("L") else int(r.ticket)


def check_rotation(
    rule: str,
    ids: list[str],
    weights: dict[str, int | None],
    calls: list[tuple[int | None, str]],
    seen: set[int],
    drawn: int,
) -> None:
    """``rotation`` over calls, each (leased ticket or None, instance): every call carried a
    ticket, none of the ``drawn`` tickets drawn out of band before the step (0..drawn-1), none
    used twice (``seen`` holds the tickets of earlier checks and gains these), and each reached
    the instance the rule maps its ticket to over ``ids`` in id order (:mod:`rule_oracle`, the
    rules as docs/rules.md states them)."""
    ids = sorted(ids)
    listed = [weights.get(i) or 100 for i in ids]
    for ticket, instance in calls:
        assert ticket is not None, f"call to {instance} without a leased ticket"
        assert ticket >= drawn, f"call to {instance} carried ticket {ticket}, one of the {drawn} drawn out of band"
        assert ticket not in seen, f"ticket {ticket} used twice"
        seen.add(ticket)
        assert ids[position(rule, listed, ticket)] == instance, (ticket, instance)


class Consumer(Protocol):
    """Consumer 1 of a scenario: one channel, kept across steps."""

    def call(self, version: str, deadline_ms: int) -> str | None: ...
    def close(self) -> None: ...


class SyncConsumer:
    def __init__(self, target: str, rule: str) -> None:
        self.channel = rota.channel(target, rule=rule, ticket_header=True)
        self.stub = echo_pb2_grpc.EchoStub(self.channel)

    def call(self, version: str, deadline_ms: int) -> str | None:
        """One Echo call; None, or the failed call's message."""
        try:
            self.stub.Echo(
                echo_pb2.EchoRequest(message="first"),
                timeout=deadline_ms / 1000,
                metadata=[("x-rota-version", version)] if version else None,
            )
        except grpc.RpcError as error:
            return str(error.details())
        return None

    def close(self) -> None:
        self.channel.close()


T = TypeVar("T")


class AioConsumer:
    """``rota.aio.channel`` on an event loop of its own thread, so that the runner stays one."""

    def __init__(self, target: str, rule: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="aio-consumer", daemon=True)
        self.thread.start()
        self.channel = self._run(self._open(target, rule), 10.0)
        self.stub = echo_pb2_grpc.EchoStub(self.channel)

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @staticmethod
    async def _open(target: str, rule: str) -> rota.aio.AsyncRotaChannel:
        return rota.aio.channel(target, rule=rule, ticket_header=True)

    async def _call(self, version: str, deadline_ms: int) -> str | None:
        try:
            await self.stub.Echo(
                echo_pb2.EchoRequest(message="first"),
                timeout=deadline_ms / 1000,
                metadata=[("x-rota-version", version)] if version else None,
            )
        except grpc.RpcError as error:
            return str(error.details())
        return None

    def call(self, version: str, deadline_ms: int) -> str | None:
        # The call is bounded by its own deadline; the margin covers a first lease's wait.
        return self._run(self._call(version, deadline_ms), deadline_ms / 1000 + 15.0)

    def close(self) -> None:
        try:
            self._run(self.channel.close(), 15.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


class Runner:
    """Runs one scenario: rota, the echo fleet and the registrations here, consumer 1 from
    :meth:`open_consumer`. The xDS runner (test_xds_conformance.py) is a subclass."""

    def __init__(self, scenario: dict[str, Any], flavour: str, private_server: Callable[..., RotaServer]) -> None:
        self.validate(scenario)
        self.scenario = scenario
        self.flavour = flavour
        self.private_server = private_server
        self.server = private_server(*ADMIN_ARGS)
        self.fleet = EchoFleet()
        self.client = rota.RotaClient(self.server.address)
        self.consumer: Consumer | None = None
        self.service = scenario.get("service", "echo")
        self.weights = {i["id"]: i.get("weight", 100) for i in scenario["instances"]}
        self.registrations = {}
        for spec in scenario["instances"]:
            instance = rota.Instance(
                service="echo",
                host="127.0.0.1",
                port=self.fleet.unreachable() if spec.get("unreachable") else self.fleet.start(spec["id"]),
                id=spec["id"],
                version=spec.get("version", ""),
                weight=spec.get("weight"),
            )
            self.registrations[spec["id"]] = self.client.register(instance)
        if "policy" in scenario:
            self.set_policy(scenario["policy"])
        self.seen: set[int] = set()
        #: Tickets drawn out of band (draw steps) so far.
        self.drawn = 0
        self.target = f"rota://{self.server.address}/{self.service}"
        self.consumer = self.open_consumer()

    def validate(self, scenario: dict[str, Any]) -> None:
        validate(scenario)

    def open_consumer(self) -> Consumer:
        return (SyncConsumer if self.flavour == "sync" else AioConsumer)(self.target, self.scenario["rule"])

    def set_policy(self, policy_json: dict[str, Any]) -> None:
        policy = json_format.ParseDict(policy_json, pb.Policy())
        policy.service = self.service
        with grpc.insecure_channel(self.server.address) as ch:
            pb_grpc.PoliciesStub(ch).SetPolicy(pb.SetPolicyRequest(policy=policy), timeout=10)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.client.close()
        self.fleet.close()

    def call(self, version: str = "", deadline_ms: int = 5000) -> str | None:
        assert self.consumer is not None
        return self.consumer.call(version, deadline_ms)

    def run(self) -> None:
        for index, step in enumerate(self.scenario["steps"]):
            try:
                self.step(step)
            except AssertionError as failure:
                raise AssertionError(f"{self.scenario['name']}: step {index} ({step}) failed: {failure}") from None

    def step(self, step: dict[str, Any]) -> None:
        if "calls" in step:
            self.calls(step)
        elif "withdraw" in step:
            self.registrations.pop(step["withdraw"]).close()
            self.none_reach_after(step["withdraw"], time.monotonic(), step["within_ms"], "its withdrawal")
        elif "kill" in step:
            self.fleet.kill(step["kill"])
            # A call already on its way to the instance may fail. As many calls in a row as
            # there are instances span a pick of the killed one, which the channel can only
            # have passed over: then it has seen the death.
            want = len(self.scenario["instances"])
            outcomes: list[Any] = []
            in_a_row = 0
            while in_a_row < want and len(outcomes) < CALLS_AFTER_KILL * want:
                outcomes.append(self.call())
                in_a_row = in_a_row + 1 if outcomes[-1] is None else 0
            assert in_a_row == want, f"{want} calls in a row did not succeed after the kill: {outcomes}"
        elif "hang" in step:
            self.fleet.hang(step["hang"])
        elif step.get("stop_rota"):
            self.server.kill()
        elif step.get("restart_rota"):
            self.server = self.private_server(*ADMIN_ARGS, listen=self.server.address)
            expected = sorted(self.registrations)
            assert wait_until(lambda: self.listed() == expected, RESTART_PATIENCE), (
                f"rota lists {self.listed()} after the restart, not {expected}"
            )
        elif step.get("await_leases"):
            started = time.monotonic()
            while True:
                before = len(self.fleet.received)
                self.call()
                if any(leased(r) is not None for r in self.fleet.received[before:]):
                    return
                assert time.monotonic() - started < step["within_ms"] / 1000, "no leased ticket in time"
                time.sleep(0.02)
        elif "draw" in step:
            self.draw(step["draw"])
        else:
            raise AssertionError(f"unknown step {step}")

    def none_reach_after(self, instance: str, changed: float, within_ms: int, what: str, version: str = "") -> None:
        """The check of withdraw, drain and trip: calls through consumer 1 (with ``version``) until
        at least CALLS_AFTER_CHANGE calls started later than within_ms after ``changed`` (the
        monotonic time of ``what``), none of which may have reached ``instance``."""
        made = calls_after_change(lambda: self.reached_by_call(version), changed, within_ms)
        check_none_reached(made, instance, within_ms, what)

    def reached_by_call(self, version: str = "") -> tuple[str, ...]:
        """Makes one call through consumer 1; the instances whose echo servers received it (the
        runner's calls are one after another, so what they record meanwhile is this call's)."""
        before = len(self.fleet.received)
        self.call(version)
        return tuple(r.instance for r in self.fleet.received[before:])

    def draw(self, n: int) -> None:
        """Leases n tickets of the channel's service and rule, without a version, with the
        generated Balancer stub on a connection of its own: neither the client library nor the
        channel takes part."""
        request = pb.LeaseRequest(service=self.service, rule=self.scenario["rule"], count=n)
        with grpc.insecure_channel(self.server.address) as ch:
            response = pb_grpc.BalancerStub(ch).Lease(request, timeout=10)
        assert response.count == n and not response.picks, f"rota leased {response.count} tickets, not {n}"
        self.drawn += n

    def listed(self) -> list[str]:
        try:
            return [i.id for i in self.client.list_instances("echo").instances]
        except rota.RotaError:
            return []

    def calls(self, step: dict[str, Any]) -> None:
        n, version = step["calls"], step.get("version", "")
        deadline_ms = step.get("deadline_ms", 5000)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CONSUMER.parent), *sys.path])}
        before = len(self.fleet.received)
        args = [self.target, self.scenario["rule"], str(n), version, str(deadline_ms), self.flavour]
        others = [
            subprocess.Popen([sys.executable, str(CONSUMER), *args], stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(step.get("consumers", 1) - 1)
        ]
        try:
            failures = [f for f in (self.call(version, deadline_ms) for _ in range(n)) if f is not None]
            for process in others:
                out, _ = process.communicate(timeout=CONSUMER_TIMEOUT)
                assert process.returncode == 0, out
                failures += json.loads(out)["failures"]
        finally:
            for process in others:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        received = self.fleet.received[before:]
        self.check(step.get("expect", {}), received, failures, n * step.get("consumers", 1))
        if step.get("expect", {}).get("reported"):
            self.check_reported()

    def check_reported(self) -> None:
        """Polls rota's admin API (GET /api/services/echo) until every instance of the scenario
        shows as many calls as its echo server answered since the scenario started, and no error;
        fails with both numbers per id after REPORTED_WITHIN seconds."""
        assert self.server.admin_address, "rota's admin listener is off"
        answered = self.fleet.answers()
        want = {i["id"]: answered[i["id"]] for i in self.scenario["instances"]}
        url = f"http://{self.server.admin_address}/api/services/echo"
        deadline = time.monotonic() + REPORTED_WITHIN
        while True:
            polled = time.monotonic()
            got: dict[str, tuple[int, int]] = {}
            problem = ""
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    view = json.loads(response.read())
                got = {i["id"]: (int(i["calls"]), int(i["errors"])) for i in view["instances"]}
            except (OSError, ValueError, KeyError) as error:
                problem = f"GET {url}: {error}"
            if not problem and all(got.get(id_) == (calls, 0) for id_, calls in want.items()):
                return
            if time.monotonic() >= deadline:
                assert not problem, f"reported: after {REPORTED_WITHIN}s, {problem}"
                lines = [
                    f"{id_}: rota counts {got[id_][0]} calls and {got[id_][1]} errors, its echo server answered "
                    f"{calls} calls (errors want 0)"
                    if id_ in got
                    else f"{id_}: not in rota's view, its echo server answered {calls} calls"
                    for id_, calls in want.items()
                ]
                raise AssertionError(
                    f"reported: rota's admin API did not match within {REPORTED_WITHIN}s: " + "; ".join(lines)
                )
            # The next poll REPORTED_EVERY after this one started, within the deadline above.
            time.sleep(max(0.0, polled + REPORTED_EVERY - time.monotonic()))

    def check(self, expect: dict[str, Any], received: list[Received], failures: list[str], made: int) -> None:
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
            calls = [(t, r.instance) for r, t in zip(received, tickets, strict=True)]
            check_rotation(self.scenario["rule"], expect["rotation"], self.weights, calls, self.seen, self.drawn)
        if "runs" in expect:
            size = expect["runs"]
            by_ticket = {t: r.instance for r, t in zip(received, tickets, strict=True) if t is not None}
            for t in by_ticket:
                group = t - t % size
                if all(group + k in by_ticket for k in range(size)):
                    assert len({by_ticket[group + k] for k in range(size)}) == 1, group
        if "only" in expect:
            assert {r.instance for r in received} <= set(expect["only"]), Counter(r.instance for r in received)
        if "never" in expect:
            assert not {r.instance for r in received} & set(expect["never"]), Counter(r.instance for r in received)
        if expect.get("spread"):
            assert {r.instance for r in received} == set(expect["only"]), Counter(r.instance for r in received)
        if "counts" in expect:
            reached = Counter(r.instance for r in received)
            assert reached == Counter(expect["counts"]), f"calls per instance {dict(reached)}, not {expect['counts']}"
        if expect.get("balanced"):
            reached = Counter(r.instance for r in received)
            shares = [reached[i] for i in expect["only"]]
            answered = made - len(failures)
            assert min(shares) > 0, f"an instance answered nothing: {dict(reached)}"
            assert max(shares) - min(shares) <= max(2, answered // 10), f"unbalanced: {dict(reached)}"


@dataclass(frozen=True)
class Made:
    """A call of a withdraw, drain or trip step: when it started, in seconds after the change,
    and the instances that received it (none when it failed before reaching one)."""

    started: float
    reached: tuple[str, ...]


def calls_after_change(
    call: Callable[[], Sequence[str]],
    changed: float,
    within_ms: int,
    clock: Callable[[], float] = time.monotonic,
) -> list[Made]:
    """Makes calls one after another until at least CALLS_AFTER_CHANGE of them started later than
    within_ms after ``changed`` (a time of ``clock``), so within_ms have passed too; gives up once
    CHANGE_PATIENCE more seconds have passed. ``call`` makes one call and returns the instances
    that received it."""
    within = within_ms / 1000
    made: list[Made] = []
    after = 0
    while after < CALLS_AFTER_CHANGE:
        started = clock() - changed
        if started > within + CHANGE_PATIENCE:
            break
        made.append(Made(started, tuple(call())))
        if started > within:
            after += 1
    return made


def check_none_reached(made: Sequence[Made], instance: str, within_ms: int, what: str) -> None:
    """The verdict of a withdraw, drain or trip step over its calls: none that started later than
    within_ms after ``what`` reached ``instance``, and at least CALLS_AFTER_CHANGE of them did
    start that late (with fewer, the step would decide nothing)."""
    within = within_ms / 1000
    after = [m for m in made if m.started > within]
    late = [round(m.started * 1000) for m in after if instance in m.reached]
    assert not late, (
        f"{instance} still received {len(late)} of the {len(after)} calls that started later than {within_ms} ms "
        f"after {what}; they started these ms after it: {late[:10]}"
    )
    assert len(after) >= CALLS_AFTER_CHANGE, (
        f"only {len(after)} of the {len(made)} calls made started later than {within_ms} ms after {what}, "
        f"in {CHANGE_PATIENCE:g} s more; the step needs {CALLS_AFTER_CHANGE}"
    )


def run(scenario: dict[str, Any], flavour: str, private_server: Callable[..., RotaServer]) -> None:
    runner = Runner(scenario, flavour, private_server)
    try:
        runner.run()
    finally:
        runner.close()


RUN = [p for p in SCENARIOS if p.stem not in UNSUPPORTED]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("path", RUN, ids=[p.stem for p in RUN])
def test_channel_scenario(path: Path, flavour: str, private_server: Callable[..., RotaServer]) -> None:
    run(json.loads(path.read_text()), flavour, private_server)


def test_every_scenario_is_run_or_listed() -> None:
    assert SCENARIOS, f"no scenario in {SCENARIO_DIR}"
    assert [p.name for p in SCENARIOS] == sorted(p.name for p in SCENARIO_DIR.iterdir() if p.suffix == ".json")
    assert set(UNSUPPORTED) <= {p.stem for p in SCENARIOS}, "a listed scenario that no longer exists"
    assert all(UNSUPPORTED.values()), "every scenario left out says why"
    assert "gray" in {p.stem for p in RUN}
    for path in SCENARIOS:
        validate(json.loads(path.read_text()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"polcy": {}}, "polcy"),
        ({"instances": [{"id": "a", "wieght": 1}]}, "wieght"),
        ({"steps": [{"calls": 1, "expect": {"count": {}}}]}, "count"),
        ({"steps": [{"calls": 1, "kill": "a"}]}, "not one"),
        ({"steps": [{"kill": "a", "within_ms": 1}]}, "within_ms"),
        ({"steps": [{"hang": "a", "deadline_ms": 1}]}, "deadline_ms"),
        ({"instances": [{"id": "a", "unreachabel": True}]}, "unreachabel"),
        ({"steps": [{"calls": 1, "expect": {"balance": True}}]}, "balance"),
        ({"steps": [{"calls": 1, "expect": {"report": True}}]}, "report"),
        ({"policy": {"gray": {"weights": 1}}}, "policy"),
        ({"policy": {"service": "echo"}}, "service"),
        ({"steps": [{"drwa": 7}]}, "drwa"),
        ({"steps": [{"draw": 7, "calls": 1}]}, "not one"),
        ({"steps": [{"draw": 7, "within_ms": 1}]}, "within_ms"),
    ],
)
def test_unknown_keys_are_refused(change: dict[str, Any], message: str) -> None:
    scenario = {"name": "x", "rule": "round_robin", "instances": [], "steps": [], **change}
    with pytest.raises(ScenarioError, match=message):
        validate(scenario)


def test_a_draw_step_is_known() -> None:
    validate({"name": "x", "rule": "round_robin", "instances": [], "steps": [{"draw": 7}]})


def test_rotation_refuses_tickets_drawn_out_of_band() -> None:
    # Tickets 7..12 after 7 drawn out of band follow round robin over three ids; ticket 5, which
    # a channel counting from 0 by itself would send, maps to its instance but was drawn already.
    ids = ["a", "b", "c"]
    calls: list[tuple[int | None, str]] = [(t, ids[t % 3]) for t in range(7, 13)]
    check_rotation("round_robin", ids, {}, calls, set(), 7)
    with pytest.raises(AssertionError, match="ticket 5, one of the 7 drawn out of band"):
        check_rotation("round_robin", ids, {}, [(5, "c"), *calls], set(), 7)
    check_rotation("round_robin", ids, {}, [(5, "c"), *calls], set(), 5)


class Probe:
    """Consumer 1 of a withdraw, drain or trip step on a fake clock: its calls go to echo-a, echo-b
    and echo-c in turn, each taking ``takes`` seconds, until the change takes effect ``stops``
    seconds after it (then they pass echo-c over), or never (None: a DRAINING update that was
    never sent, a withdrawal never made)."""

    def __init__(self, stops: float | None, takes: float = 2**-6) -> None:
        self.stops = stops
        self.takes = takes
        self.now = 0.0
        self.turn = 0

    def clock(self) -> float:
        return self.now

    def call(self) -> tuple[str, ...]:
        taken = self.stops is not None and self.now >= self.stops
        ids = ["echo-a", "echo-b"] if taken else ["echo-a", "echo-b", "echo-c"]
        reached = ids[self.turn % len(ids)]
        self.turn += 1
        self.now += self.takes
        return (reached,)


def drain_step(probe: Probe, within_ms: int = 1000) -> list[Made]:
    """The runner's drain of echo-c, acknowledged at time 0 of the probe's clock."""
    made = calls_after_change(probe.call, 0.0, within_ms, probe.clock)
    check_none_reached(made, "echo-c", within_ms, "the acknowledgement of its DRAINING")
    return made


def test_a_drain_never_sent_fails_the_step() -> None:
    # Calls of 1/64 s: 64 of them (over 20) fill the second up to the bound, the last starting
    # 63/64 s after the change; a step that stopped there saw no call later than the bound.
    with pytest.raises(AssertionError, match=r"echo-c still received 7 of the 20 calls that started later than 1000"):
        drain_step(Probe(stops=None))
    # And with calls of 0.1 s, 11 of them before the bound.
    with pytest.raises(AssertionError, match=r"echo-c still received \d+ of the 20 calls"):
        drain_step(Probe(stops=None, takes=0.1))


def test_a_drain_taken_within_the_bound_passes_after_20_late_calls() -> None:
    probe = Probe(stops=0.3)
    made = drain_step(probe)
    assert [m.started > 1.0 for m in made].count(True) == 20
    # The step ended with its 20th call after the bound: 64 calls up to 63/64 s, one at 1 s
    # exactly (not later than the bound), then 20.
    assert len(made) == 64 + 1 + 20
    assert "echo-c" in {r for m in made for r in m.reached}, "the probe reached echo-c before the drain took"


def test_a_drain_taken_after_the_bound_fails() -> None:
    with pytest.raises(AssertionError, match=r"echo-c still received 2 of the 20 .*: \[1016, 1062\]"):
        drain_step(Probe(stops=1.1))


def test_a_change_step_whose_calls_are_too_slow_fails() -> None:
    # Calls of 5 s (each waits out its deadline): after the one started at 20 s, the next would
    # start 25 s after the change, past the bound and CHANGE_PATIENCE; 4 calls started after 1 s.
    probe = Probe(stops=0.0, takes=5.0)
    with pytest.raises(AssertionError, match=r"only 4 of the 5 calls made started later than 1000 ms .*needs 20"):
        drain_step(probe)
    assert probe.now == 25.0


def test_check_none_reached_counts_only_calls_started_after_the_bound() -> None:
    before = [Made(i / 64, (("echo-a", "echo-b", "echo-c")[i % 3],)) for i in range(64)]
    after = [Made(1.0 + (i + 1) / 64, (("echo-a", "echo-b")[i % 2],)) for i in range(20)]
    what = "its withdrawal"
    # Calls before the bound may reach echo-c, and one started at the bound exactly is not late.
    check_none_reached([*before, Made(1.0, ("echo-c",)), *after], "echo-c", 1000, what)
    # What a step that stops once the bound has passed and 20 calls were made in all sees: no
    # call after the bound, which decides nothing.
    with pytest.raises(AssertionError, match="only 0 of the 65 calls made started later than 1000 ms"):
        check_none_reached([*before, Made(1.0, ("echo-a",))], "echo-c", 1000, what)
    with pytest.raises(AssertionError, match="only 19 of the 83 calls"):
        check_none_reached([*before, *after[:19]], "echo-c", 1000, what)
    # One late call reaching echo-c fails the step, as does one that reached it among others
    # (a call retried on another instance).
    with pytest.raises(AssertionError, match=r"echo-c still received 1 of the 21 .*after its withdrawal.*\[1500\]"):
        check_none_reached([*before, *after, Made(1.5, ("echo-c",))], "echo-c", 1000, what)
    with pytest.raises(AssertionError, match=r"echo-c still received 1 of the 20"):
        check_none_reached([*before, *after[:19], Made(1.5, ("echo-c", "echo-a"))], "echo-c", 1000, what)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_wrong_expectation_fails(flavour: str, private_server: Callable[..., RotaServer]) -> None:
    # The runner must be able to fail: round robin over two instances does not send 4 calls of 4
    # to echo-a, and counts are compared exactly.
    scenario = {
        "name": "wrong on purpose",
        "rule": "round_robin",
        "instances": [{"id": "echo-a"}, {"id": "echo-b"}],
        "steps": [
            {"calls": 4, "expect": {"failures": 0, "counts": {"echo-a": 2, "echo-b": 2}}},
            {"calls": 4, "expect": {"failures": 0, "counts": {"echo-a": 4}}},
        ],
    }
    with pytest.raises(AssertionError, match=r"step 1 .*calls per instance"):
        run(scenario, flavour, private_server)
