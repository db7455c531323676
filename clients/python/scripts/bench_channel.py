"""Throughput and p99 of unary echo calls through ``rota.channel`` against a plain channel to one
instance, grpc's own ``round_robin`` policy over the three addresses, and a round robin over
per-instance channels, on the same three echo servers, in alternating rounds of one run; the
ratio to grpc's ``round_robin`` per round, and the calls per ``Lease``. Prints the figures;
asserts nothing.

    ROTA_BIN=/abs/path/to/rota ROTA_ADMIN_LISTEN=off clients/python/.venv/bin/python \\
        clients/python/scripts/bench_channel.py [--rounds 3] [--seconds 3] [--callers 4]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import grpc  # noqa: E402

import rota  # noqa: E402
from echo_fleet import EchoFleet, echo_pb2, echo_pb2_grpc  # noqa: E402
from rota_harness import RotaServer, rota_binary  # noqa: E402


def run(call: Callable[[], Any], seconds: float, callers: int) -> tuple[int, float, float]:
    latencies: list[list[int]] = [[] for _ in range(callers)]
    end = time.monotonic() + seconds

    def caller(mine: list[int]) -> None:
        while time.monotonic() < end:
            started = time.perf_counter_ns()
            call()
            mine.append(time.perf_counter_ns() - started)

    threads = [threading.Thread(target=caller, args=(mine,)) for mine in latencies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = sorted(itertools.chain.from_iterable(latencies))
    return len(everything), everything[len(everything) // 2] / 1e3, everything[int(len(everything) * 0.99)] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, default=4)
    args = parser.parse_args()
    server = RotaServer(rota_binary(), Path(tempfile.mkdtemp()) / "rota.log").start()
    fleet = EchoFleet()
    client = rota.RotaClient(server.address)
    try:
        ports = {i: fleet.start(i) for i in ("echo-a", "echo-b", "echo-c")}
        client.register(*[rota.Instance(service="echo", host="127.0.0.1", port=p, id=i) for i, p in ports.items()])
        request = echo_pb2.EchoRequest(message="bench")
        via_rota = rota.channel(f"rota://{server.address}/echo")
        rota_stub = echo_pb2_grpc.EchoStub(via_rota)
        plain = [grpc.insecure_channel(f"127.0.0.1:{p}") for p in ports.values()]
        plain_stubs = [echo_pb2_grpc.EchoStub(ch) for ch in plain]
        grpc_rr = grpc.insecure_channel(
            "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports.values()),
            options=[("grpc.lb_policy_name", "round_robin")],
        )
        grpc_rr_stub = echo_pb2_grpc.EchoStub(grpc_rr)
        turn = itertools.count()
        contenders: dict[str, Callable[[], Any]] = {
            "rota.channel": lambda: rota_stub.Echo(request, timeout=10),
            "one instance": lambda: plain_stubs[0].Echo(request, timeout=10),
            "grpc rr": lambda: grpc_rr_stub.Echo(request, timeout=10),
            "round robin": lambda: plain_stubs[next(turn) % 3].Echo(request, timeout=10),
        }
        for call in contenders.values():
            run(call, 1.0, args.callers)  # warm-up
        leases_before, rota_calls = via_rota.router.lease_calls, 0
        print(f"{args.callers} callers, {args.rounds} rounds of {args.seconds:.0f} s each, alternating")
        for round_ in range(1, args.rounds + 1):
            rates: dict[str, float] = {}
            # The order rotates from round to round, so that no contender always runs first.
            names = list(contenders)
            shift = (round_ - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                call = contenders[name]
                calls, p50, p99 = run(call, args.seconds, args.callers)
                rates[name] = calls / args.seconds
                if name == "rota.channel":
                    rota_calls += calls
                print(
                    f"round {round_} {name:<13} {calls / args.seconds:8.0f} calls/s  p50 {p50:7.0f} us  "
                    f"p99 {p99:7.0f} us"
                )
            print(f"round {round_} rota.channel / grpc round_robin: {rates['rota.channel'] / rates['grpc rr']:.2f}")
        leases = via_rota.router.lease_calls - leases_before
        per_lease = rota_calls / max(leases, 1)
        print(f"rota.channel calls per Lease call: {per_lease:.0f} ({rota_calls} calls, {leases} leases)")
        via_rota.close()
        grpc_rr.close()
        for ch in plain:
            ch.close()
    finally:
        client.close()
        fleet.close()
        server.kill()


if __name__ == "__main__":
    main()
