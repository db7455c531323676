"""Two rota replicas sharing one Redis, seen through grpcio: one rotation, one owner per id."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from rota import Instance, RegistrationError, RotaClient
from rota_harness import RotaServer, wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server without persistence on a free loopback port (scripts/install-redis.sh installs it)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is missing: run scripts/install-redis.sh"
    port = _free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*args, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: _answers_ping(port), 10), "redis-server did not answer PING"
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


def test_consumers_on_two_replicas_share_one_rotation_and_one_owner_per_id(
    private_server: Callable[..., RotaServer], redis_url: str, service_name: str
) -> None:
    one = private_server("--state", redis_url, "--admin-listen", "off")
    two = private_server("--state", redis_url, "--admin-listen", "off")
    with RotaClient(one.address) as first, RotaClient(two.address) as second:
        a = Instance(service_name, "127.0.0.1", 9001, id="a")
        b = Instance(service_name, "127.0.0.1", 9002, id="b")
        c = Instance(service_name, "127.0.0.1", 9003, id="c")
        # Providers register through different replicas; every replica picks from all three.
        with first.register(a), second.register(b), first.register(c):
            for client in (first, second):

                def lists_all(client: RotaClient = client) -> bool:
                    return client.list_instances(service_name).ids == ["a", "b", "c"]

                assert wait_until(lists_all, 10)
            picks = [(first, second)[i % 2].pick(service_name) for i in range(6)]
            assert "".join(p.instance.id for p in picks) == "abcabc"
            assert [p.ticket for p in picks] == list(range(6))
            repeat = [(second, first)[i % 2].pick(service_name, rule="repeat(n=2)") for i in range(6)]
            assert "".join(p.instance.id for p in repeat) == "aabbcc"
            # An id held through one replica is refused through the other, as on one server.
            with pytest.raises(RegistrationError) as raised:
                second.register(Instance(service_name, "127.0.0.1", 9009, id="a"))
            assert raised.value.code is grpc.StatusCode.ALREADY_EXISTS
