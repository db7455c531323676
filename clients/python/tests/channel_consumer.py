"""A second consumer process for the channel scenarios: N unary Echo calls through its own
``rota.channel``; prints {"failures": [messages]} as JSON.

    python channel_consumer.py TARGET RULE CALLS VERSION DEADLINE_MS
"""

from __future__ import annotations

import json
import sys

import grpc

import rota
from echo_fleet import echo_pb2, echo_pb2_grpc


def main() -> None:
    target, rule, calls, version, deadline_ms = sys.argv[1:6]
    failures: list[str] = []
    metadata = [("x-rota-version", version)] if version else None
    with rota.channel(target, rule=rule, ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(int(calls)):
            try:
                stub.Echo(
                    echo_pb2.EchoRequest(message=f"second {i}"), timeout=int(deadline_ms) / 1000, metadata=metadata
                )
            except grpc.RpcError as error:
                failures.append(str(error.details()))
    print(json.dumps({"failures": failures}))


if __name__ == "__main__":
    main()
