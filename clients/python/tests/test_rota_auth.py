"""The clients and the channels against a rota that asks for a token, over plaintext, TLS and mTLS.

Each secured rota holds the echo instances, registered by a client with the token (and the
client certificate where rota asks for one); the consumers then pick and call through rota with
the token and TLS given as arguments or in ``ROTA_TOKEN`` and ``ROTA_TLS_*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import rota
import rota.aio
from echo_fleet import EchoFleet, echo_pb2, echo_pb2_grpc
from rota_harness import RotaServer
from secured_rota import (
    INVALID_TOKEN_MESSAGE,
    NO_TOKEN_MESSAGE,
    TOKEN,
    WRONG_TOKEN,
    Certificates,
    make_certificates,
    start_secured,
)

IDS = ["echo-a", "echo-b"]
SERVICE = "echo"


@dataclass(frozen=True)
class Secured:
    server: RotaServer
    certs: Certificates
    #: The arguments that reach this rota: the token, and the CA and client certificate it needs.
    access: dict[str, Any]


@pytest.fixture(scope="module")
def echoes() -> Iterator[dict[str, rota.Instance]]:
    fleet = EchoFleet()
    try:
        yield {i: rota.Instance(SERVICE, "127.0.0.1", fleet.start(i), id=i) for i in IDS}
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _secured(
    servers: Callable[..., RotaServer],
    tmp_path_factory: pytest.TempPathFactory,
    certs: Certificates,
    echoes: dict[str, rota.Instance],
    tls: bool,
    mtls: bool,
) -> Iterator[Secured]:
    server = start_secured(servers, tmp_path_factory.mktemp("auth"), certs, tls, mtls)
    access: dict[str, Any] = {"token": TOKEN}
    if tls:
        access["tls_ca"] = certs.ca
    if mtls:
        access |= {"tls_cert": certs.client_cert, "tls_key": certs.client_key}
    provider = rota.RotaClient(server.address, **access)
    registration = provider.register(*echoes.values())
    try:
        yield Secured(server, certs, access)
    finally:
        registration.close()
        provider.close()
        server.kill()  # not stop(): rota would drain for its grace period first


@pytest.fixture(scope="module")
def plaintext(
    servers: Callable[..., RotaServer],
    tmp_path_factory: pytest.TempPathFactory,
    certs: Certificates,
    echoes: dict[str, rota.Instance],
) -> Iterator[Secured]:
    yield from _secured(servers, tmp_path_factory, certs, echoes, tls=False, mtls=False)


@pytest.fixture(scope="module")
def tls(
    servers: Callable[..., RotaServer],
    tmp_path_factory: pytest.TempPathFactory,
    certs: Certificates,
    echoes: dict[str, rota.Instance],
) -> Iterator[Secured]:
    yield from _secured(servers, tmp_path_factory, certs, echoes, tls=True, mtls=False)


@pytest.fixture(scope="module")
def mtls(
    servers: Callable[..., RotaServer],
    tmp_path_factory: pytest.TempPathFactory,
    certs: Certificates,
    echoes: dict[str, rota.Instance],
) -> Iterator[Secured]:
    yield from _secured(servers, tmp_path_factory, certs, echoes, tls=True, mtls=True)


@pytest.fixture(params=["plaintext", "tls", "mtls"])
def secured(request: pytest.FixtureRequest) -> Secured:
    value: Secured = request.getfixturevalue(request.param)
    return value


def call_echoes(channel: Any, calls: int = 20) -> set[str]:
    stub = echo_pb2_grpc.EchoStub(channel)
    return {stub.Echo(echo_pb2.EchoRequest(message=f"m{i}"), timeout=10).instance_id for i in range(calls)}


def test_sync_client_picks_with_the_token(secured: Secured) -> None:
    with rota.RotaClient(secured.server.address, **secured.access) as client:
        picked = {client.pick(SERVICE).instance.id for _ in range(4)}
    assert picked == set(IDS)


async def test_async_client_picks_with_the_token(secured: Secured) -> None:
    async with rota.aio.AsyncRotaClient(secured.server.address, **secured.access) as client:
        picked = {(await client.pick(SERVICE)).instance.id for _ in range(4)}
    assert picked == set(IDS)


def test_channel_routes_calls_with_the_token(secured: Secured) -> None:
    with rota.channel(f"rota://{secured.server.address}/{SERVICE}", **secured.access) as channel:
        assert call_echoes(channel) == set(IDS)


async def test_async_channel_routes_calls_with_the_token(secured: Secured) -> None:
    async with rota.aio.channel(f"rota://{secured.server.address}/{SERVICE}", **secured.access) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        answers = {(await stub.Echo(echo_pb2.EchoRequest(message=f"m{i}"), timeout=10)).instance_id for i in range(20)}
    assert answers == set(IDS)


@pytest.mark.parametrize(("token", "message"), [(WRONG_TOKEN, INVALID_TOKEN_MESSAGE), ("", NO_TOKEN_MESSAGE)])
def test_a_refused_token_fails_with_rotas_status_and_message(mtls: Secured, token: str, message: str) -> None:
    access = {**mtls.access, "token": token}
    with rota.RotaClient(mtls.server.address, **access) as client, pytest.raises(rota.RotaError) as refused:
        client.pick(SERVICE)
    assert (refused.value.code, refused.value.message) == (grpc.StatusCode.UNAUTHENTICATED, message)
    with (
        rota.channel(f"rota://{mtls.server.address}/{SERVICE}", **access) as channel,
        pytest.raises(grpc.RpcError) as call,
    ):
        call_echoes(channel, calls=1)
    assert (call.value.code(), call.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, message)


async def test_a_refused_token_fails_the_async_channel_with_rotas_message(mtls: Secured) -> None:
    access = {**mtls.access, "token": WRONG_TOKEN}
    async with rota.aio.channel(f"rota://{mtls.server.address}/{SERVICE}", **access) as channel:
        with pytest.raises(grpc.RpcError) as call:
            await echo_pb2_grpc.EchoStub(channel).Echo(echo_pb2.EchoRequest(message="m"), timeout=10)
    assert (call.value.code(), call.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN_MESSAGE)


def test_mtls_refuses_a_client_certificate_from_another_ca(mtls: Secured) -> None:
    access = {**mtls.access, "tls_cert": mtls.certs.other_cert, "tls_key": mtls.certs.other_key}
    with rota.RotaClient(mtls.server.address, **access) as client, pytest.raises(rota.RotaError) as refused:
        client.pick(SERVICE, timeout=5)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE and refused.value.unreachable


def test_the_environment_variables_reach_rota(mtls: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    certs = mtls.certs
    monkeypatch.setenv("ROTA_TOKEN", TOKEN)
    monkeypatch.setenv("ROTA_TLS_CA", str(certs.ca))
    monkeypatch.setenv("ROTA_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("ROTA_TLS_KEY", str(certs.client_key))
    with rota.RotaClient(mtls.server.address) as client:
        assert client.pick(SERVICE).instance.id in IDS
    monkeypatch.setenv("ROTA_SERVER", f"https://{mtls.server.address}")
    with rota.channel(f"rota:///{SERVICE}") as channel:
        assert call_echoes(channel) == set(IDS)
    # An argument wins over its variable.
    with rota.RotaClient(mtls.server.address, token=WRONG_TOKEN) as client, pytest.raises(rota.RotaError) as refused:
        client.pick(SERVICE)
    assert (refused.value.code, refused.value.message) == (grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN_MESSAGE)


async def test_the_environment_variables_reach_asyncio_rota(mtls: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    certs = mtls.certs
    monkeypatch.setenv("ROTA_TOKEN", TOKEN)
    monkeypatch.setenv("ROTA_TLS_CA", str(certs.ca))
    monkeypatch.setenv("ROTA_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("ROTA_TLS_KEY", str(certs.client_key))
    async with rota.aio.AsyncRotaClient(mtls.server.address) as client:
        assert (await client.pick(SERVICE)).instance.id in IDS
    async with rota.aio.channel(f"rota://{mtls.server.address}/{SERVICE}") as channel:
        reply = await echo_pb2_grpc.EchoStub(channel).Echo(echo_pb2.EchoRequest(message="m"), timeout=10)
    assert reply.instance_id in IDS


def test_ca_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError, match=f"cannot read tls_ca {missing}"):
        rota.channel("rota:///echo", server="127.0.0.1:1", tls_ca=missing)
