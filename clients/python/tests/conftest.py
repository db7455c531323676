"""Fixtures: the rota binary, a shared live server, and extra servers for tests that kill theirs."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rota_harness import RotaServer, rota_binary

_binary: Path | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    # Built here rather than in a fixture so a cold `cargo build` does not count against the
    # per-test timeout; it has its own bound.
    global _binary
    _binary = rota_binary()


def pytest_collection_finish(session: pytest.Session) -> None:
    # pytest fails a run that collects nothing (exit status 5); this also fails a full run
    # (test.sh without arguments sets the floor) whose collection silently shrank.
    floor = int(os.environ.get("ROTA_PY_MIN_TESTS", "0"))
    if len(session.items) < floor:
        raise pytest.UsageError(f"collected {len(session.items)} tests, fewer than the {floor} of the full suite")


@pytest.fixture(scope="session")
def rota_bin() -> Path:
    assert _binary is not None
    return _binary


@pytest.fixture(scope="session")
def servers(rota_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RotaServer]]:
    """Starts servers on demand; every one is stopped at the end of the session."""
    started: list[RotaServer] = []
    counter = itertools.count()
    logs = tmp_path_factory.mktemp("rota-logs")

    def start(*extra_args: str, listen: str = "127.0.0.1:0") -> RotaServer:
        server = RotaServer(rota_bin, logs / f"rota-{next(counter)}.log", *extra_args, listen=listen)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def rota_server(servers: Callable[..., RotaServer]) -> RotaServer:
    """The live server shared by the conformance scenarios of the sync client and the integration tests."""
    return servers()


@pytest.fixture(scope="session")
def rota_server_async(servers: Callable[..., RotaServer]) -> RotaServer:
    """A second live server for the asyncio client's conformance run.

    The scenarios expect fresh rotations (ticket 0 after a fresh registration), and rota keeps
    a rotation's counter for the life of the server, so each client runs them on its own server.
    """
    return servers()


@pytest.fixture
def private_server(servers: Callable[..., RotaServer]) -> Iterator[Callable[..., RotaServer]]:
    """Servers owned by one test (which may kill them); stopped when the test ends."""
    mine: list[RotaServer] = []

    def start(*extra_args: str, listen: str = "127.0.0.1:0") -> RotaServer:
        server = servers(*extra_args, listen=listen)
        mine.append(server)
        return server

    try:
        yield start
    finally:
        for server in mine:
            server.stop()


_names = itertools.count()


@pytest.fixture
def service_name(request: pytest.FixtureRequest) -> str:
    """A service name no other test uses."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"py-{stem}-{next(_names)}"
