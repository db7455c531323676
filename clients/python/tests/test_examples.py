"""The examples, run as processes against the shared live server."""

from __future__ import annotations

import selectors
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rota import RotaClient
from rota_harness import CLIENT_ROOT, RotaServer

EXAMPLES = CLIENT_ROOT / "examples"
DEADLINE = 20.0


def read_line(process: subprocess.Popen[str], timeout: float = DEADLINE) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output within {timeout}s")
    return process.stdout.readline().rstrip("\n")


@pytest.fixture
def providers(rota_server: RotaServer) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(5)


def start_provider(address: str, service: str, id: str, version: str = "") -> subprocess.Popen[str]:
    command = [sys.executable, str(EXAMPLES / "provider.py"), "--rota", address, "--service", service, "--id", id]
    if version:
        command += ["--version", version]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def consume(address: str, service: str, *extra: str) -> list[str]:
    command = [sys.executable, str(EXAMPLES / "consumer.py"), "--rota", address, "--service", service, *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_consumer_calls_providers_in_rota_order(
    rota_server: RotaServer, providers: list[subprocess.Popen[str]], service_name: str
) -> None:
    address = rota_server.address
    for id, version in (("ex-a", ""), ("ex-b", ""), ("ex-dev", "dev")):
        process = start_provider(address, service_name, id, version)
        providers.append(process)
        line = read_line(process)
        assert line.startswith(f"registered {id} as {service_name} at http://127.0.0.1:"), line

    assert consume(address, service_name, "--count", "4") == [
        "ex-a ticket=0: hello from ex-a",
        "ex-b ticket=1: hello from ex-b",
        "ex-a ticket=2: hello from ex-a",
        "ex-b ticket=3: hello from ex-b",
    ]
    assert consume(address, service_name, "--count", "2", "--version", "dev") == [
        "ex-dev ticket=0: hello from ex-dev (version dev)",
        "ex-dev ticket=1: hello from ex-dev (version dev)",
    ]

    for process, id in zip(providers, ("ex-a", "ex-b", "ex-dev"), strict=True):
        process.terminate()
        assert process.wait(DEADLINE) == 0
        assert read_line(process) == f"withdrew {id}"
    with RotaClient(address) as rota:
        assert rota.list_instances(service_name).ids == []
