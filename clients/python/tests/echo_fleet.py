"""Echo servers for the channel tests: each answers with its id and records every call it receives.

The stubs come from clients/conformance/channel/echo.proto, generated with grpcio-tools into a
temporary folder when this module is imported.
"""

from __future__ import annotations

import importlib
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_tools import protoc

from rota_harness import REPO_ROOT

_OUT = Path(tempfile.mkdtemp(prefix="rota-echo-stubs-"))
_PROTO_DIR = REPO_ROOT / "clients" / "conformance" / "channel"
if (
    protoc.main(
        [
            "protoc",
            f"-I{_PROTO_DIR}",
            f"--python_out={_OUT}",
            f"--grpc_python_out={_OUT}",
            str(_PROTO_DIR / "echo.proto"),
        ]
    )
    != 0
):
    raise RuntimeError("protoc could not generate the echo stubs")
sys.path.insert(0, str(_OUT))
echo_pb2: Any = importlib.import_module("echo_pb2")
echo_pb2_grpc: Any = importlib.import_module("echo_pb2_grpc")
sys.path.remove(str(_OUT))
# The modules are loaded; their generated files are not needed any more.
shutil.rmtree(_OUT, ignore_errors=True)

#: A generic service with the two call kinds echo.proto lacks (raw bytes, no serializers).
KINDS = "rota.test.Kinds"


@dataclass(frozen=True)
class Received:
    instance: str
    ticket: str | None
    version: str | None
    at: float
    #: The call's ``x-rota-key`` metadata (the xDS scenarios' keys), if any.
    key: str | None = None


class _Recorder(grpc.ServerInterceptor):
    def __init__(self, fleet: EchoFleet, instance: str) -> None:
        self.fleet = fleet
        self.instance = instance

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        md = dict(details.invocation_metadata)
        self.fleet.record(
            Received(
                self.instance, md.get("x-rota-ticket"), md.get("x-rota-version"), time.monotonic(), md.get("x-rota-key")
            )
        )
        return continuation(details)


class _Hang:
    """Whether an echo server stopped answering (the ``hang`` step), and its unanswered calls.

    A hung call waits until it ends on the client's side (its deadline, a cancel) or until the
    fleet releases every hung call at teardown, whichever comes first: its worker thread is
    never left waiting past the scenario."""

    def __init__(self) -> None:
        self.on = False
        self._lock = threading.Lock()
        self._waiting: set[threading.Event] = set()
        self._released = False

    def wait(self, context: Any) -> None:
        ended = threading.Event()
        with self._lock:
            if self._released:
                return
            self._waiting.add(ended)
        try:
            # False: the call has ended already.
            if context.add_callback(ended.set):
                ended.wait()
        finally:
            with self._lock:
                self._waiting.discard(ended)

    def release(self) -> None:
        with self._lock:
            self._released = True
            for ended in self._waiting:
                ended.set()


# echo_pb2_grpc is generated at import time, so mypy only knows it as Any.
class _Echo(echo_pb2_grpc.EchoServicer):  # type: ignore[misc]
    def __init__(self, instance: str, hang: _Hang, fleet: EchoFleet) -> None:
        self.instance = instance
        self.hang = hang
        self.fleet = fleet

    def Echo(self, request: Any, context: Any) -> Any:  # noqa: N802
        if self.hang.on:
            self.hang.wait(context)
            context.abort(grpc.StatusCode.UNAVAILABLE, "the echo server was stopped while hung")
        self.fleet.answer(self.instance)
        return echo_pb2.EchoReply(instance_id=self.instance, message=request.message)

    def EchoStream(self, requests: Any, context: Any) -> Any:  # noqa: N802
        for request in requests:
            if self.hang.on:
                self.hang.wait(context)
                context.abort(grpc.StatusCode.UNAVAILABLE, "the echo server was stopped while hung")
            yield echo_pb2.EchoReply(instance_id=self.instance, message=request.message)


class EchoFleet:
    def __init__(self) -> None:
        self.received: list[Received] = []
        #: Unary Echo calls each instance answered (a hung server's calls are not).
        self.answered: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.servers: dict[str, grpc.Server] = {}
        self._hangs: dict[str, _Hang] = {}

    def record(self, received: Received) -> None:
        with self._lock:
            self.received.append(received)

    def answer(self, instance: str) -> None:
        with self._lock:
            self.answered[instance] += 1

    def answers(self) -> Counter[str]:
        """How many unary Echo calls each instance has answered so far."""
        with self._lock:
            return Counter(self.answered)

    def since(self, at: float) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.at >= at]

    def start(self, instance: str) -> int:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[_Recorder(self, instance)])
        hang = self._hangs[instance] = _Hang()
        echo_pb2_grpc.add_EchoServicer_to_server(_Echo(instance, hang, self), server)
        me = instance.encode()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    KINDS,
                    {
                        "UnaryStream": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter([me, req])),
                        "StreamUnary": grpc.stream_unary_rpc_method_handler(
                            lambda reqs, ctx: me + b":" + b"".join(reqs)
                        ),
                    },
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.servers[instance] = server
        return int(port)

    @staticmethod
    def unreachable() -> int:
        """A loopback port where nothing listens: bound, noted and closed again."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    def hang(self, instance: str) -> None:
        """The instance's server keeps its connections but answers no call it receives from now on."""
        self._hangs[instance].on = True

    def kill(self, instance: str) -> None:
        self._hangs[instance].release()
        self.servers.pop(instance).stop(None).wait(10)

    def close(self) -> None:
        for hang in self._hangs.values():
            hang.release()
        for server in self.servers.values():
            server.stop(None).wait(10)
        self.servers.clear()
