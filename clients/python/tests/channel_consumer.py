"""A second consumer process for the channel scenarios: N unary Echo calls through its own
``rota.channel`` (``sync``, the default) or ``rota.aio.channel`` (``aio``); prints
{"failures": [messages]} as JSON.

    python channel_consumer.py TARGET RULE CALLS VERSION DEADLINE_MS [sync|aio]
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc

import rota
import rota.aio
from echo_fleet import echo_pb2, echo_pb2_grpc


def calls_sync(target: str, rule: str, calls: int, metadata: list[tuple[str, str]] | None, timeout: float) -> list[str]:
    failures: list[str] = []
    with rota.channel(target, rule=rule, ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(calls):
            try:
                stub.Echo(echo_pb2.EchoRequest(message=f"second {i}"), timeout=timeout, metadata=metadata)
            except grpc.RpcError as error:
                failures.append(str(error.details()))
    return failures


async def calls_aio(
    target: str, rule: str, calls: int, metadata: list[tuple[str, str]] | None, timeout: float
) -> list[str]:
    failures: list[str] = []
    async with rota.aio.channel(target, rule=rule, ticket_header=True) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for i in range(calls):
            try:
                await stub.Echo(echo_pb2.EchoRequest(message=f"second {i}"), timeout=timeout, metadata=metadata)
            except grpc.RpcError as error:
                failures.append(str(error.details()))
    return failures


def main() -> None:
    target, rule, calls, version, deadline_ms = sys.argv[1:6]
    flavour = sys.argv[6] if len(sys.argv) > 6 else "sync"
    metadata = [("x-rota-version", version)] if version else None
    timeout = int(deadline_ms) / 1000
    if flavour == "aio":
        failures = asyncio.run(calls_aio(target, rule, int(calls), metadata, timeout))
    elif flavour == "sync":
        failures = calls_sync(target, rule, int(calls), metadata, timeout)
    else:
        raise SystemExit(f"unknown flavour {flavour!r}: sync or aio")
    print(json.dumps({"failures": failures}))


if __name__ == "__main__":
    main()
