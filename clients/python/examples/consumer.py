"""A consumer: asks rota which instance to call, calls it, and reports how the call went.

    python examples/consumer.py --rota 127.0.0.1:50051 --service hello --count 4 [--version zlt]

Each request picks through rota (one rotation shared with every other consumer), sends
``x-rota-version`` on to the provider when a version is set, and reports the outcome and
latency. The service is followed, so picks keep working from the last known instance list if
rota goes away.
"""

from __future__ import annotations

import argparse
import logging
import sys
import urllib.error
import urllib.request

from rota import RotaClient, RotaError, use_version
from rota.version import outgoing_headers


def fetch(url: str) -> str:
    request = urllib.request.Request(url, headers=outgoing_headers())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()
    except urllib.error.URLError as error:
        if isinstance(error.reason, ConnectionError):
            raise error.reason from error  # reported to rota as a connect failure
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rota", default="127.0.0.1:50051", help="rota's address (host:port)")
    parser.add_argument("--service", default="hello")
    parser.add_argument("--count", type=int, default=4, help="how many requests to make")
    parser.add_argument("--rule", default="", help='e.g. "repeat(n=3)"; default round_robin')
    parser.add_argument("--version", default=None, help="act as a request carrying this version")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with RotaClient(args.rota, follow=[args.service]) as rota, use_version(args.version):
        for _ in range(args.count):
            try:
                picked = rota.pick(args.service, rule=args.rule)
            except RotaError as error:
                print(f"no instance: {error}", file=sys.stderr)
                return 1
            body = rota.timed_call(picked, fetch, f"http://{picked.instance.address}/")
            where = " (local fallback)" if picked.local_fallback else ""
            print(f"{picked.instance.id} ticket={picked.ticket}{where}: {body}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
