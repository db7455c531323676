"""Throughput and p99 of unary echo calls through ``rota.channel`` to a rota that asks for a token
over TLS, against the same channel to a plaintext rota without tokens: the same three echo
instances registered in both, alternating rounds of one run, the ratio per round. Prints the
figures; asserts nothing.

    ROTA_BIN=/abs/path/to/rota ROTA_ADMIN_LISTEN=off clients/python/.venv/bin/python \\
        clients/python/scripts/bench_channel_auth.py [--rounds 3] [--seconds 3] [--callers 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_channel import run  # noqa: E402

import rota  # noqa: E402
from echo_fleet import EchoFleet, echo_pb2, echo_pb2_grpc  # noqa: E402
from rota_harness import RotaServer, rota_binary  # noqa: E402
from secured_rota import TOKEN, make_certificates, start_secured  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    certs = make_certificates(work / "certs")

    def start(*extra: str) -> RotaServer:
        return RotaServer(rota_binary(), work / f"rota-{len(extra)}.log", *extra).start()

    plain = start()
    secured = start_secured(start, work, certs, tls=True, mtls=False)
    access: dict[str, Any] = {"token": TOKEN, "tls_ca": certs.ca}
    fleet = EchoFleet()
    providers = [rota.RotaClient(plain.address), rota.RotaClient(secured.address, **access)]
    try:
        ports = {i: fleet.start(i) for i in ("echo-a", "echo-b", "echo-c")}
        instances = [rota.Instance(service="echo", host="127.0.0.1", port=p, id=i) for i, p in ports.items()]
        for provider in providers:
            provider.register(*instances)
        request = echo_pb2.EchoRequest(message="bench")
        channels = {
            "plaintext": rota.channel(f"rota://{plain.address}/echo", token=""),
            "token+TLS": rota.channel(f"rota://{secured.address}/echo", **access),
        }
        stubs = {name: echo_pb2_grpc.EchoStub(ch) for name, ch in channels.items()}
        contenders: dict[str, Callable[[], Any]] = {
            name: partial(stub.Echo, request, timeout=10) for name, stub in stubs.items()
        }
        for call in contenders.values():
            run(call, 1.0, args.callers)  # warm-up
        print(f"{args.callers} callers, {args.rounds} rounds of {args.seconds:.0f} s each, alternating")
        ratios: list[float] = []
        calls_of = dict.fromkeys(channels, 0)
        leases_before = {name: ch.router.lease_calls for name, ch in channels.items()}
        for round_ in range(1, args.rounds + 1):
            rates: dict[str, float] = {}
            names = list(contenders)
            shift = (round_ - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                calls, p50, p99 = run(contenders[name], args.seconds, args.callers)
                rates[name] = calls / args.seconds
                calls_of[name] += calls
                print(
                    f"round {round_} {name:<10} {calls / args.seconds:8.0f} calls/s  p50 {p50:7.0f} us  "
                    f"p99 {p99:7.0f} us"
                )
            ratios.append(rates["token+TLS"] / rates["plaintext"])
            print(f"round {round_} token+TLS / plaintext: {ratios[-1]:.2f}")
        print(f"median of the rounds, token+TLS / plaintext: {statistics.median(ratios):.2f}")
        for name, ch in channels.items():
            leases = ch.router.lease_calls - leases_before[name]
            print(f"{name}: {calls_of[name]} calls, {leases} Lease calls")
        for ch in channels.values():
            ch.close()
    finally:
        for provider in providers:
            provider.close()
        fleet.close()
        plain.kill()
        secured.kill()


if __name__ == "__main__":
    main()
