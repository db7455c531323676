"""A consumer process for the xDS scenarios (clients/conformance/xds, README there): one channel
to ``xds:///SERVICE`` built by grpcio's own xDS resolver (C-core), with the bootstrap named by
``GRPC_XDS_BOOTSTRAP``. grpcio keeps one xDS client per process, read from the bootstrap once, so
the runner starts a process of this kind for every scenario (and every rota it starts).

    python xds_consumer.py SERVICE

Reads one JSON request a line on stdin, ``{"calls": N, "version": "V", "keys": K, "deadline_ms": D}``,
makes N unary Echo calls one after another (metadata ``x-rota-version: V`` when V is not empty,
``x-rota-key: key-(i mod K)`` on call i when K is above 0, each with deadline D) and answers each
request with one line, ``{"failures": [{"code": "UNAVAILABLE", "message": "..."}, ...]}``. Ends at
the end of stdin.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc

from echo_fleet import echo_pb2, echo_pb2_grpc


def key_name(i: int, keys: int) -> str | None:
    """The ``x-rota-key`` of call ``i`` of a request with ``keys`` keys: ``key-(i mod keys)``, or none."""
    return f"key-{i % keys}" if keys > 0 else None


def calls(stub: Any, n: int, version: str, keys: int, deadline_ms: int) -> list[dict[str, str]]:
    failures: list[dict[str, str]] = []
    for i in range(n):
        metadata = [("x-rota-version", version)] if version else []
        key = key_name(i, keys)
        if key is not None:
            metadata.append(("x-rota-key", key))
        try:
            stub.Echo(echo_pb2.EchoRequest(message=f"xds {i}"), timeout=deadline_ms / 1000, metadata=metadata or None)
        except grpc.RpcError as error:
            failures.append({"code": error.code().name, "message": str(error.details())})
    return failures


def main() -> None:
    (service,) = sys.argv[1:]
    with grpc.insecure_channel(f"xds:///{service}") as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for line in sys.stdin:
            request = json.loads(line)
            failures = calls(
                stub,
                int(request["calls"]),
                str(request["version"]),
                int(request.get("keys", 0)),
                int(request["deadline_ms"]),
            )
            print(json.dumps({"failures": failures}), flush=True)


if __name__ == "__main__":
    main()
