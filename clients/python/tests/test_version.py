"""Version propagation: incoming header -> current version -> outgoing pick and calls."""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc.aio
import pytest

from rota import AsyncRotaClient, RotaClient, RotaError, current_version, use_version, version_from_headers
from rota.version import (
    AsyncVersionServerInterceptor,
    VersionClientInterceptor,
    VersionServerInterceptor,
    async_version_client_interceptors,
    outgoing_headers,
)


def test_no_version_by_default_and_use_version_nests_and_restores() -> None:
    assert current_version() is None
    with use_version("zlt"):
        assert current_version() == "zlt"
        with use_version("bob"):
            assert current_version() == "bob"
        with use_version(""):
            assert current_version() is None
        assert current_version() == "zlt"
    assert current_version() is None


def test_use_version_restores_after_an_exception() -> None:
    with pytest.raises(KeyError), use_version("zlt"):
        raise KeyError
    assert current_version() is None


def test_threads_do_not_share_the_version() -> None:
    seen: list[str | None] = []
    with use_version("zlt"):
        thread = threading.Thread(target=lambda: seen.append(current_version()))
        thread.start()
        thread.join(5)
    assert seen == [None]


async def test_tasks_do_not_share_the_version() -> None:
    async def handle(version: str) -> list[str | None]:
        with use_version(version):
            first = current_version()
            await asyncio.sleep(0)
            return [first, current_version()]

    assert list(await asyncio.gather(handle("a"), handle("b"))) == [["a", "a"], ["b", "b"]]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Rota-Version": "zlt"}, "zlt"),
        ({"x-rota-version": " bob "}, "bob"),
        ({"HTTP_X_ROTA_VERSION": "zlt", "PATH_INFO": "/"}, "zlt"),  # WSGI environ
        ([(b"host", b"x"), (b"x-rota-version", b"zlt")], "zlt"),  # ASGI scope["headers"]
        ((("x-rota-version", "grpc-v"),), "grpc-v"),  # gRPC invocation metadata
        ({"X-Rota-Version": ""}, None),
        ({"Accept": "*/*"}, None),
        ([], None),
    ],
    ids=["mapping", "strip", "wsgi", "asgi", "grpc", "empty", "absent", "nothing"],
)
def test_version_from_headers(headers: Any, expected: str | None) -> None:
    assert version_from_headers(headers) == expected


def test_version_from_http_server_headers() -> None:
    message = http.client.parse_headers(__import__("io").BytesIO(b"Host: x\r\nX-ROTA-VERSION: zlt\r\n\r\n"))
    assert version_from_headers(message) == "zlt"


def test_outgoing_headers() -> None:
    assert outgoing_headers() == {}
    with use_version("zlt"):
        assert outgoing_headers() == {"x-rota-version": "zlt"}
    assert outgoing_headers("bob") == {"x-rota-version": "bob"}


# -- pick takes the current version -----------------------------------------------------------


class RecordingBalancer:
    def __init__(self) -> None:
        self.versions: list[str] = []

    def Pick(self, request: Any, timeout: float | None = None) -> Any:
        self.versions.append(request.version)
        raise grpc.RpcError()


class AsyncRecordingBalancer(RecordingBalancer):
    async def Pick(self, request: Any, timeout: float | None = None) -> Any:
        return super().Pick(request, timeout)


def _pick_versions(client: RotaClient) -> list[str]:
    balancer = RecordingBalancer()
    client._balancer = balancer  # type: ignore[assignment]
    calls: list[Callable[[], object]] = [
        lambda: client.pick("svc"),
        lambda: client.pick("svc", version="bob"),
        lambda: client.pick("svc", version=""),
    ]
    for call in calls:
        with pytest.raises(RotaError):
            call()
    return balancer.versions


def test_pick_uses_the_current_version_unless_given_one() -> None:
    with RotaClient("127.0.0.1:1") as client:
        assert _pick_versions(client) == ["", "bob", ""]
        with use_version("zlt"):
            assert _pick_versions(client) == ["zlt", "bob", ""]


async def test_async_pick_uses_the_current_version_unless_given_one() -> None:
    async with AsyncRotaClient("127.0.0.1:1") as client:
        balancer = AsyncRecordingBalancer()
        client._balancer = balancer  # type: ignore[assignment]
        with use_version("zlt"):
            for version in (None, "bob", ""):
                with pytest.raises(RotaError):
                    await client.pick("svc", version=version)
        assert balancer.versions == ["zlt", "bob", ""]


# -- gRPC interceptors ------------------------------------------------------------------------


def _seen() -> bytes:
    return (current_version() or "-").encode()


def _echo_handlers() -> grpc.GenericRpcHandler:
    def unary(request: bytes, context: Any) -> bytes:
        return _seen()

    def server_stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield _seen()
        yield _seen()

    def client_stream(requests: Iterator[bytes], context: Any) -> bytes:
        return b"".join(requests) + b":" + _seen()

    def bidi(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for request in requests:
            yield request + b":" + _seen()

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        },
    )


@pytest.fixture
def echo_server() -> Iterator[str]:
    # One worker thread: every call runs on the same thread, so a version left behind would show.
    server = grpc.server(ThreadPoolExecutor(max_workers=1), interceptors=[VersionServerInterceptor()])
    server.add_generic_rpc_handlers((_echo_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(5)


def test_server_interceptor_makes_the_header_current(echo_server: str) -> None:
    with grpc.insecure_channel(echo_server) as channel:
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Echo/Unary")
        server_stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream("/test.Echo/ServerStream")
        client_stream: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary("/test.Echo/ClientStream")
        bidi: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/test.Echo/Bidi")
        header = (("x-rota-version", "zlt"),)
        assert unary(b"", metadata=header, timeout=5) == b"zlt"
        assert list(server_stream(b"", metadata=header, timeout=5)) == [b"zlt", b"zlt"]
        assert client_stream(iter([b"a", b"b"]), metadata=header, timeout=5) == b"ab:zlt"
        assert list(bidi(iter([b"x"]), metadata=header, timeout=5)) == [b"x:zlt"]
        # The next call on the same worker thread carries no header and sees no version.
        assert unary(b"", timeout=5) == b"-"
        assert list(server_stream(b"", timeout=5)) == [b"-", b"-"]


def test_client_interceptor_passes_the_current_version_on(echo_server: str) -> None:
    with grpc.insecure_channel(echo_server) as raw:
        channel = grpc.intercept_channel(raw, VersionClientInterceptor())
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Echo/Unary")
        server_stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream("/test.Echo/ServerStream")
        client_stream: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary("/test.Echo/ClientStream")
        bidi: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/test.Echo/Bidi")
        assert unary(b"", timeout=5) == b"-"
        with use_version("bob"):
            assert unary(b"", timeout=5) == b"bob"
            assert list(server_stream(b"", timeout=5)) == [b"bob", b"bob"]
            assert client_stream(iter([b"q"]), timeout=5) == b"q:bob"
            assert list(bidi(iter([b"y"]), timeout=5)) == [b"y:bob"]
            # An explicit header is left alone.
            assert unary(b"", metadata=(("x-rota-version", "own"),), timeout=5) == b"own"


def _async_echo_handlers() -> grpc.GenericRpcHandler:
    async def unary(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(0)
        return _seen()

    async def server_stream(request: bytes, context: Any) -> Any:
        yield _seen()
        await asyncio.sleep(0)
        yield _seen()

    def sync_unary(request: bytes, context: Any) -> bytes:
        return _seen()

    async def client_stream(requests: Any, context: Any) -> bytes:
        return b"".join([r async for r in requests]) + b":" + _seen()

    async def bidi(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request + b":" + _seen()

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "SyncUnary": grpc.unary_unary_rpc_method_handler(sync_unary),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        },
    )


async def test_async_interceptors_carry_the_version_both_ways() -> None:
    server = grpc.aio.server(
        interceptors=[AsyncVersionServerInterceptor()], migration_thread_pool=ThreadPoolExecutor(max_workers=1)
    )
    server.add_generic_rpc_handlers((_async_echo_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=async_version_client_interceptors()
        ) as channel:
            unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Echo/Unary")
            server_stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
                "/test.Echo/ServerStream"
            )
            sync_unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Echo/SyncUnary")
            client_stream: grpc.aio.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(
                "/test.Echo/ClientStream"
            )
            bidi: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/test.Echo/Bidi")
            assert await unary(b"", timeout=5) == b"-"
            assert await unary(b"", metadata=(("x-rota-version", "zlt"),), timeout=5) == b"zlt"
            with use_version("bob"):
                assert await unary(b"", timeout=5) == b"bob"
                assert [m async for m in server_stream(b"", timeout=5)] == [b"bob", b"bob"]
                assert await sync_unary(b"", timeout=5) == b"bob"
                assert await client_stream(iter([b"a", b"b"]), timeout=5) == b"ab:bob"
                assert [m async for m in bidi(iter([b"x"]), timeout=5)] == [b"x:bob"]
            assert await unary(b"", timeout=5) == b"-"
    finally:
        await server.stop(None)
