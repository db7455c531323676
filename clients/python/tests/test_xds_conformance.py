"""The shared xDS scenarios (clients/conformance/xds/*.json, README there), played with grpcio's
own xDS client (C-core): a channel to ``xds:///echo`` with rota as its only control plane.

The channel runner (test_channel_conformance.py) sets up rota, the echo fleet, the registrations
and the policy, and runs the steps the two formats share; this one adds the ``drain`` and
``trip`` steps, the ``version`` of ``withdraw``, the ``keys`` of ``calls`` and the ``codes`` and
``keyed`` expectations. grpcio keeps one xDS client per process, read from the bootstrap once, so
every consumer is an ``xds_consumer.py`` process of its own, started for its scenario with a
bootstrap (a temporary file) naming the scenario's rota and nothing else. The consumers' stderr
(with grpc's xds_client and xds_resolver traces unless ``GRPC_TRACE`` is set) goes to a log beside
the bootstrap; its errors and last lines are shown when a step fails.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

import rota
from echo_fleet import Received
from rota._pb import rota_pb2 as pb
from rota._pb import rota_pb2_grpc as pb_grpc
from rota_harness import REPO_ROOT, RotaServer
from test_channel_conformance import EXPECT_KEYS, SCENARIO_KEYS, STEP_KEYS, Runner, ScenarioError, validate

SCENARIO_DIR = REPO_ROOT / "clients" / "conformance" / "xds"
SCENARIOS = sorted(SCENARIO_DIR.glob("*.json"))
CONSUMER = Path(__file__).resolve().parent / "xds_consumer.py"
NODE_ID = "conformance-python"
#: Scenario files (by stem) skipped, each with a one-line reason (a fault of rota's xDS server,
#: not of the runner). Every other file runs; test_every_xds_scenario_is_run_or_listed checks it.
SKIP: dict[str, str] = {}

#: The channel format's keys, less what xDS clients do not use (no rule, no tickets), plus the
#: xDS steps and expectation (the folder's README).
XDS_SCENARIO_KEYS = (SCENARIO_KEYS - {"rule"}) | {"rota_policy"}
XDS_STEP_KEYS = {
    **{k: v for k, v in STEP_KEYS.items() if k != "await_leases"},
    "calls": STEP_KEYS["calls"] | {"keys"},
    "withdraw": STEP_KEYS["withdraw"] | {"version"},
    "drain": {"drain", "within_ms", "version"},
    "trip": {"trip", "within_ms", "version"},
}
XDS_EXPECT_KEYS = (EXPECT_KEYS - {"leased", "rotation", "runs"}) | {"codes", "keyed"}
#: Scenarios with "rota_policy": true need rota's own load-balancing policy registered in the
#: client; it exists for Go and Java only, so grpcio (which takes the standard policy after it in
#: rota's clusters) skips them.
NO_ROTA_POLICY = (
    "needs rota's own policy (rota.v1.CentralRotation), which exists for Go and Java only; "
    "grpcio takes the standard policy after it"
)
#: rota's breaker threshold when the scenario's policy sets none.
DEFAULT_FAILURE_THRESHOLD = 3
#: Bounds for a consumer process: its start and its end, and the margin over a request's deadlines.
CONSUMER_STOP_TIMEOUT = 10.0
ANSWER_MARGIN = 15.0


def validate_xds(scenario: dict[str, Any]) -> None:
    """Refuses keys the xDS format does not define, and status codes grpc does not know."""
    rota_policy = scenario.get("rota_policy", False)
    if not isinstance(rota_policy, bool):
        raise ScenarioError(f"rota_policy must be true or false, got {rota_policy!r}")
    validate(
        scenario,
        scenario_keys=XDS_SCENARIO_KEYS,
        required=("name", "instances", "steps"),
        step_keys=XDS_STEP_KEYS,
        # rotation (tickets checked) only where rota's own policy hands tickets out.
        expect_keys=XDS_EXPECT_KEYS | ({"rotation"} if rota_policy else set()),
    )
    known = {code.name for code in grpc.StatusCode}
    for i, step in enumerate(scenario["steps"]):
        unknown = set(step.get("expect", {}).get("codes", [])) - known
        if unknown:
            raise ScenarioError(f"steps[{i}].expect.codes: no status code is named {sorted(unknown)}")
        keys = step.get("keys")
        if keys is not None and (type(keys) is not int or keys < 1):
            raise ScenarioError(f"steps[{i}].keys must be a count of at least 1, got {keys!r}")
        keyed = step.get("expect", {}).get("keyed")
        if keyed is not None and keyed is not True:
            raise ScenarioError(f"steps[{i}].expect.keyed can only be true, got {keyed!r}")
        if keyed and keys is None:
            raise ScenarioError(f"steps[{i}] expects keyed calls and sends no keys")


@dataclass(frozen=True)
class Failure:
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def check_codes(expected: list[str], failures: list[Failure]) -> None:
    """The ``codes`` expectation: every failed call's status code is one of ``expected``."""
    wrong = [str(f) for f in failures if f.code not in expected]
    assert not wrong, f"failed calls with codes other than {expected}: {wrong[:5]}"


def check_keyed(received: list[Received]) -> None:
    """The ``keyed`` expectation, over the calls the instances received (every consumer's): each
    carried an ``x-rota-key``, and all with the same key reached one instance."""
    assert received, "keyed: no instance received a call"
    unkeyed = [r.instance for r in received if r.key is None]
    assert not unkeyed, f"keyed: {len(unkeyed)} calls carried no key, to {sorted(set(unkeyed))}"
    by_key: dict[str, Counter[str]] = {}
    for r in received:
        by_key.setdefault(str(r.key), Counter())[r.instance] += 1
    split = [f"{key} reached {dict(sorted(n.items()))}" for key, n in sorted(by_key.items()) if len(n) > 1]
    shown = "; ".join(split[:5])
    assert not split, f"keyed: {len(split)} of {len(by_key)} keys reached more than one instance: {shown}"


def write_bootstrap(folder: Path, address: str) -> Path:
    """A bootstrap naming the rota at ``address`` as the only xDS server."""
    path = folder / f"bootstrap-{address.replace(':', '-')}.json"
    bootstrap = {
        "xds_servers": [
            {"server_uri": address, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}
        ],
        "node": {"id": NODE_ID, "locality": {}},
    }
    path.write_text(json.dumps(bootstrap))
    return path


class XdsConsumer:
    """One ``xds_consumer.py`` process: its channel to ``xds:///SERVICE`` lives as long as it does."""

    def __init__(self, service: str, bootstrap: Path, log: Path) -> None:
        self.log = log
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(CONSUMER.parent), *sys.path]),
            "GRPC_XDS_BOOTSTRAP": str(bootstrap),
        }
        env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
        if "GRPC_TRACE" not in env:
            env["GRPC_TRACE"] = "xds_client,xds_resolver"
            env["GRPC_VERBOSITY"] = "info"
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(CONSUMER), service],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
            )
        self.pending = 0.0

    def request(self, calls: int, version: str, deadline_ms: int, keys: int = 0) -> None:
        """Starts ``calls`` calls, one after another (call i with ``x-rota-key: key-(i mod keys)``
        when ``keys`` is above 0); :meth:`answer` waits for their outcome."""
        assert self.process.stdin is not None
        request = {"calls": calls, "version": version, "keys": keys, "deadline_ms": deadline_ms}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        self.pending = calls * deadline_ms / 1000 + ANSWER_MARGIN

    def answer(self) -> list[Failure]:
        """The failures of the calls of the last :meth:`request` (bounded by their deadlines)."""
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(self.pending)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            state = f"exited with {self.process.poll()}" if ready else f"gave no answer in {self.pending}s"
            raise AssertionError(f"the xDS consumer {state}; its log:\n{self.log_excerpt()}")
        return [Failure(f["code"], f["message"]) for f in json.loads(line)["failures"]]

    def calls(self, calls: int, version: str = "", deadline_ms: int = 5000) -> list[Failure]:
        self.request(calls, version, deadline_ms)
        return self.answer()

    def call(self, version: str = "", deadline_ms: int = 5000) -> str | None:
        """One Echo call (the channel runner's Consumer): None, or the failed call's code and message."""
        failures = self.calls(1, version, deadline_ms)
        return str(failures[0]) if failures else None

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.close()
                self.process.wait(CONSUMER_STOP_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(CONSUMER_STOP_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def log_excerpt(self, errors: int = 20, last: int = 30) -> str:
        """grpc's errors and warnings from the log, then its last lines."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(no log: {error})"
        flagged = [
            line
            for line in lines
            if line[:1] in ("E", "W") and line[1:5].isdigit() and "is not suitable for production" not in line
        ]
        return "\n".join(
            [f"[{self.log}: {len(flagged)} errors and warnings, first {errors}]", *flagged[:errors]]
            + [f"[last {last} lines]", *lines[-last:]]
        )


class XdsRunner(Runner):
    def __init__(self, scenario: dict[str, Any], private_server: Callable[..., RotaServer], folder: Path) -> None:
        self.folder = folder
        self.started: list[XdsConsumer] = []
        super().__init__(scenario, "xds", private_server)

    def validate(self, scenario: dict[str, Any]) -> None:
        validate_xds(scenario)

    def open_consumer(self) -> XdsConsumer:
        # rota has just started on a port of its own; a restart (restart_rota) keeps the address.
        self.bootstrap = write_bootstrap(self.folder, self.server.address)
        self.xds = self.new_consumer()
        return self.xds

    def new_consumer(self) -> XdsConsumer:
        consumer = XdsConsumer(self.service, self.bootstrap, self.folder / f"consumer-{len(self.started) + 1}.log")
        self.started.append(consumer)
        return consumer

    def run(self) -> None:
        try:
            super().run()
        except AssertionError as failure:
            excerpt = self.xds.log_excerpt()
            rota_log = "\n".join(self.server.log().splitlines()[-15:])
            raise AssertionError(f"{failure}\n{excerpt}\n[rota's last lines]\n{rota_log}") from None

    def step(self, step: dict[str, Any]) -> None:
        if "withdraw" in step:
            self.registrations.pop(step["withdraw"]).close()
            self.change_step(step["withdraw"], time.monotonic(), step, "its withdrawal")
        elif "drain" in step:
            instance = step["drain"]
            # update returns once rota has acknowledged the DRAINING status.
            self.registrations[instance].update(
                rota.InstanceRef("echo", instance), status=rota.InstanceStatus.DRAINING, timeout=10
            )
            self.change_step(instance, time.monotonic(), step, "the acknowledgement of its DRAINING")
        elif "trip" in step:
            threshold = self.trip(step["trip"])
            self.change_step(step["trip"], time.monotonic(), step, f"the report of {threshold} failed calls")
        else:
            super().step(step)

    def trip(self, instance: str) -> int:
        """Reports as many failed calls of the instance as trip its breaker; returns how many."""
        policy = json_format.ParseDict(self.scenario.get("policy", {}), pb.Policy())
        threshold = policy.breaker.failure_threshold or DEFAULT_FAILURE_THRESHOLD
        outcome = pb.CallOutcome(
            service="echo", instance_id=instance, result=pb.CALL_RESULT_ERROR, latency_us=1000, leased=True
        )
        with grpc.insecure_channel(self.server.address) as channel:
            response = pb_grpc.BalancerStub(channel).Report(
                pb.ReportRequest(outcomes=[outcome] * threshold), timeout=10
            )
        assert response.accepted == threshold, f"rota accepted {response.accepted} of {threshold} failed calls"
        return threshold

    def change_step(self, instance: str, changed: float, step: dict[str, Any], what: str) -> None:
        """The calls of withdraw, drain and trip, with the step's version (the channel runner's
        check, clients/conformance/xds/README.md)."""
        self.none_reach_after(instance, changed, step["within_ms"], what, step.get("version", ""))

    def calls(self, step: dict[str, Any]) -> None:
        n, version = step["calls"], step.get("version", "")
        deadline_ms = step.get("deadline_ms", 5000)
        consumers = [self.xds, *(self.new_consumer() for _ in range(step.get("consumers", 1) - 1))]
        before = len(self.fleet.received)
        try:
            for consumer in consumers:
                consumer.request(n, version, deadline_ms, step.get("keys", 0))
            failures = [f for consumer in consumers for f in consumer.answer()]
        finally:
            for consumer in consumers[1:]:
                consumer.close()
        received: list[Received] = self.fleet.received[before:]
        expect = step.get("expect", {})
        self.check(expect, received, [str(f) for f in failures], n * len(consumers))
        if "codes" in expect:
            check_codes(expect["codes"], failures)
        if expect.get("keyed"):
            check_keyed(received)

    def close(self) -> None:
        try:
            super().close()
        finally:
            for consumer in self.started:
                consumer.close()
            # Nothing of the scenario needs a graceful stop, and rota's drains for its grace
            # period (10 s) on SIGTERM, which the fixture would wait on (5 s) before killing it.
            self.server.kill()


def run(scenario: dict[str, Any], private_server: Callable[..., RotaServer], folder: Path) -> None:
    runner = XdsRunner(scenario, private_server, folder)
    try:
        runner.run()
    finally:
        runner.close()


def _param(path: Path) -> Any:
    reason = SKIP.get(path.stem)
    if reason is None and json.loads(path.read_text()).get("rota_policy") is True:
        reason = NO_ROTA_POLICY
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", [_param(p) for p in SCENARIOS])
def test_xds_scenario(path: Path, private_server: Callable[..., RotaServer], tmp_path: Path) -> None:
    run(json.loads(path.read_text()), private_server, tmp_path)


def test_every_xds_scenario_is_run_or_listed() -> None:
    assert SCENARIOS, f"no scenario in {SCENARIO_DIR}"
    assert set(SKIP) <= {p.stem for p in SCENARIOS}, "a skipped scenario that no longer exists"
    assert all(SKIP.values()), "every skipped scenario says why"
    for path in SCENARIOS:
        validate_xds(json.loads(path.read_text()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rule": "round_robin"}, "rule"),
        ({"steps": [{"await_leases": True, "within_ms": 1}]}, "not one"),
        ({"steps": [{"calls": 1, "expect": {"leased": True}}]}, "leased"),
        ({"steps": [{"calls": 1, "expect": {"code": ["UNAVAILABLE"]}}]}, "code"),
        ({"steps": [{"calls": 1, "expect": {"codes": ["UNAVAILIBLE"]}}]}, "UNAVAILIBLE"),
        ({"steps": [{"drain": "a", "within": 1}]}, "within"),
        ({"steps": [{"trip": "a", "deadline_ms": 1}]}, "deadline_ms"),
        ({"steps": [{"kill": "a", "version": "v"}]}, "version"),
        ({"steps": [{"calls": 1, "expect": {"rotation": ["a"]}}]}, "rotation"),
        ({"rota_policy": "yes"}, "rota_policy"),
        ({"steps": [{"calls": 1, "key": 2}]}, "key"),
        ({"steps": [{"calls": 1, "keys": 0}]}, "keys"),
        ({"steps": [{"calls": 1, "keys": True}]}, "keys"),
        ({"steps": [{"withdraw": "a", "within_ms": 1, "keys": 2}]}, "keys"),
        ({"steps": [{"calls": 1, "expect": {"keyed": True}}]}, "sends no keys"),
        ({"steps": [{"calls": 1, "keys": 2, "expect": {"keyed": False}}]}, "keyed"),
    ],
)
def test_unknown_xds_keys_are_refused(change: dict[str, Any], message: str) -> None:
    scenario = {"name": "x", "instances": [], "steps": [], **change}
    with pytest.raises(ScenarioError, match=message):
        validate_xds(scenario)


def test_keyed_is_checked() -> None:
    def got(instance: str, key: str | None) -> Received:
        return Received(instance, None, None, 0.0, key)

    check_keyed([got("echo-a", "key-0"), got("echo-b", "key-1"), got("echo-a", "key-0")])
    with pytest.raises(AssertionError, match=r"1 of 2 keys .*key-0 reached \{'echo-a': 1, 'echo-b': 1\}"):
        check_keyed([got("echo-a", "key-0"), got("echo-b", "key-1"), got("echo-b", "key-0")])
    with pytest.raises(AssertionError, match="carried no key"):
        check_keyed([got("echo-a", "key-0"), got("echo-a", None)])
    with pytest.raises(AssertionError, match="no instance received"):
        check_keyed([])


def test_codes_are_checked() -> None:
    check_codes(["UNAVAILABLE"], [Failure("UNAVAILABLE", "no endpoints")])
    with pytest.raises(AssertionError, match="DEADLINE_EXCEEDED: slow"):
        check_codes(["UNAVAILABLE"], [Failure("UNAVAILABLE", "x"), Failure("DEADLINE_EXCEEDED", "slow")])


@pytest.mark.timeout(60)
def test_a_wrong_xds_expectation_fails(private_server: Callable[..., RotaServer], tmp_path: Path) -> None:
    # The runner must be able to fail: plain calls over two unversioned instances reach both.
    scenario = {
        "name": "wrong on purpose",
        "instances": [{"id": "echo-a"}, {"id": "echo-b"}],
        "steps": [
            {"calls": 10, "expect": {"failures": 0, "only": ["echo-a", "echo-b"], "spread": True}},
            {"calls": 10, "expect": {"failures": 0, "only": ["echo-a"]}},
        ],
    }
    with pytest.raises(AssertionError, match=r"step 1 .*echo-b"):
        run(scenario, private_server, tmp_path)


@pytest.mark.timeout(60)
def test_keyed_fails_under_round_robin(private_server: Callable[..., RotaServer], tmp_path: Path) -> None:
    # Without a hashing rule the clusters name round_robin, which takes no notice of the key: a
    # key count that shares no factor with the instances it rotates over (3, or 2 while one
    # connection is on its way) sends each key to several of them.
    scenario = {
        "name": "round robin on purpose",
        "instances": [{"id": "echo-a"}, {"id": "echo-b"}, {"id": "echo-c"}],
        "steps": [
            {"calls": 30, "keys": 10, "expect": {"failures": 0}},
            {"calls": 49, "keys": 7, "expect": {"failures": 0, "keyed": True}},
        ],
    }
    with pytest.raises(AssertionError, match=r"step 1 .*keyed: \d+ of 7 keys reached more than one instance"):
        run(scenario, private_server, tmp_path)
