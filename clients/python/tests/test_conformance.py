"""Every conformance scenario, run against a live rota by the sync and by the asyncio client."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import AsyncDriver, SyncDriver, run_scenario, scenario_files
from rota_harness import SCENARIOS, RotaServer

SCENARIO_FILES = scenario_files()


def test_scenarios_are_discovered() -> None:
    assert SCENARIO_FILES, f"no scenario in {SCENARIOS}"
    assert [p.name for p in SCENARIO_FILES] == sorted(p.name for p in SCENARIOS.iterdir() if p.suffix == ".json")


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
async def test_sync_client(path: Path, rota_server: RotaServer) -> None:
    await run_scenario(path, SyncDriver(rota_server.address))


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
async def test_async_client(path: Path, rota_server_async: RotaServer) -> None:
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
