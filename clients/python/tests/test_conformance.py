"""Every conformance scenario, run against a live rota by the sync and by the asyncio client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conformance import AsyncDriver, SyncDriver, needs_own_server, run_scenario, scenario_files
from rota_harness import SCENARIOS, RotaServer

SCENARIO_FILES = scenario_files()


def test_scenarios_are_discovered() -> None:
    assert SCENARIO_FILES, f"no scenario in {SCENARIOS}"
    assert [p.name for p in SCENARIO_FILES] == sorted(p.name for p in SCENARIOS.iterdir() if p.suffix == ".json")


def test_every_op_is_exercised() -> None:
    # A scenario folder that lost its fallback or watch scenarios would pass with fewer checks.
    import json

    ops = {step["op"] for path in SCENARIO_FILES for step in json.loads(path.read_text())["steps"]}
    assert ops == {
        "register", "withdraw", "pick", "pick_sequence", "list", "update", "report",
        "lease", "watch", "watch_expect", "follow", "stop_server", "start_server",
    }  # fmt: skip


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
async def test_sync_client(path: Path, rota_server: RotaServer, private_server: Callable[..., RotaServer]) -> None:
    if needs_own_server(path):
        server = private_server()
        await run_scenario(path, SyncDriver(server.address, server, private_server))
    else:
        await run_scenario(path, SyncDriver(rota_server.address))


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
async def test_async_client(
    path: Path, rota_server_async: RotaServer, private_server: Callable[..., RotaServer]
) -> None:
    if needs_own_server(path):
        server = private_server()
        await run_scenario(path, AsyncDriver(server.address, server, private_server))
    else:
        await run_scenario(path, AsyncDriver(rota_server_async.address))


async def test_runner_reports_the_failing_step(tmp_path: Path, rota_server: RotaServer) -> None:
    # The runner must be able to fail: a scenario whose expectation is wrong stops at that step.
    scenario = tmp_path / "wrong.json"
    scenario.write_text(
        """{"name": "wrong on purpose", "connections": 1, "steps": [
            {"op": "register", "stream": "p", "instances": [
                {"service": "py-runner-check", "id": "a", "host": "127.0.0.1", "port": 9001},
                {"service": "py-runner-check", "id": "b", "host": "127.0.0.1", "port": 9002}]},
            {"op": "pick_sequence", "connections": [0], "count": 2,
             "request": {"service": "py-runner-check"}, "expect_ids": ["b", "a"]},
            {"op": "list", "service": "py-runner-check", "expect_ids": ["a", "b"]}
        ]}"""
    )
    with pytest.raises(
        AssertionError,
        match=r"wrong\.json \(wrong on purpose\): step 1 \(pick_sequence\) failed: "
        r"picked \['a', 'b'\], expected \['b', 'a'\]",
    ):
        await run_scenario(scenario, SyncDriver(rota_server.address))


async def test_runner_rejects_unknown_keys(tmp_path: Path, rota_server: RotaServer) -> None:
    scenario = tmp_path / "misspelt.json"
    scenario.write_text(
        """{"name": "misspelt", "steps": [
            {"op": "register", "stream": "p", "instances": [
                {"service": "py-runner-keys", "id": "a", "host": "127.0.0.1", "port": 9001}]},
            {"op": "pick_sequence", "connections": [0], "count": 1,
             "request": {"service": "py-runner-keys"}, "expect_ids": ["a"], "expect_ticket": [0]}
        ]}"""
    )
    with pytest.raises(
        AssertionError, match=r"step 1 \(pick_sequence\) failed: unknown step fields \['expect_ticket'\]"
    ):
        await run_scenario(scenario, SyncDriver(rota_server.address))


async def test_runner_fails_wrong_tickets_and_local_marks(tmp_path: Path, rota_server: RotaServer) -> None:
    scenario = tmp_path / "tickets.json"
    scenario.write_text(
        """{"name": "wrong tickets", "steps": [
            {"op": "register", "stream": "p", "instances": [
                {"service": "py-runner-tickets", "id": "a", "host": "127.0.0.1", "port": 9001}]},
            {"op": "pick_sequence", "connections": [0], "count": 2,
             "request": {"service": "py-runner-tickets"}, "expect_ids": ["a", "a"], "expect_tickets": [0, 2]},
            {"op": "pick", "request": {"service": "py-runner-tickets"}, "expect": {"id": "a", "local": true}}
        ]}"""
    )
    with pytest.raises(AssertionError, match=r"step 1 \(pick_sequence\) failed: tickets \[0, 1\], expected \[0, 2\]"):
        await run_scenario(scenario, SyncDriver(rota_server.address))
    scenario.write_text(scenario.read_text().replace("[0, 2]", "[2, 3]"))
    with pytest.raises(AssertionError, match=r"step 2 \(pick\) failed: local_fallback False, expected True"):
        await run_scenario(scenario, SyncDriver(rota_server.address))


async def test_runner_sends_exclude_and_compares_positions(tmp_path: Path, rota_server: RotaServer) -> None:
    # A lease excluding "b" maps its tickets over a and c (step 1 passes only if the exclude was
    # sent and the positions compared); step 2's positions are wrong on purpose.
    scenario = tmp_path / "positions.json"
    scenario.write_text(
        """{"name": "positions", "steps": [
            {"op": "register", "stream": "p", "instances": [
                {"service": "py-runner-positions", "id": "a", "host": "127.0.0.1", "port": 9001},
                {"service": "py-runner-positions", "id": "b", "host": "127.0.0.1", "port": 9002},
                {"service": "py-runner-positions", "id": "c", "host": "127.0.0.1", "port": 9003}]},
            {"op": "lease", "request": {"service": "py-runner-positions", "count": 3, "exclude": ["b"]},
             "expect": {"first_ticket": 0, "count": 3, "ids": ["a", "c"], "positions": [0, 1, 0]}},
            {"op": "lease", "request": {"service": "py-runner-positions", "count": 3},
             "expect": {"first_ticket": 3, "count": 3, "ids": ["a", "b", "c"], "positions": [1, 2, 0]}}
        ]}"""
    )
    with pytest.raises(
        AssertionError, match=r"step 2 \(lease\) failed: lease positions \[0, 1, 2\], expected \[1, 2, 0\]"
    ):
        await run_scenario(scenario, SyncDriver(rota_server.address))
    scenario.write_text(scenario.read_text().replace('"positions": [0, 1, 0]', '"position": [0, 1, 0]'))
    with pytest.raises(AssertionError, match=r"step 1 \(lease\) failed: unknown lease expectation \['position'\]"):
        await run_scenario(scenario, SyncDriver(rota_server.address))
