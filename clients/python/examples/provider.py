"""A provider: serves a small HTTP endpoint and keeps it registered with rota while it runs.

    python examples/provider.py --rota 127.0.0.1:50051 --service hello --id hello-1

It listens on a free loopback port, registers ``127.0.0.1:PORT`` under ``--service`` (with
``--version``, if given), answers ``GET /`` with a greeting naming itself and the version the
request carried, and withdraws its registration when stopped (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from rota import Instance, RotaClient, version_from_headers


class Hello(BaseHTTPRequestHandler):
    """``GET /``: a greeting naming this instance and the version the request carried."""

    server: HelloServer

    def do_GET(self) -> None:
        version = version_from_headers(self.headers)
        body = f"hello from {self.server.instance_id}" + (f" (version {version})" if version else "")
        payload = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep stdout for the provider's own lines


class HelloServer(ThreadingHTTPServer):
    instance_id = ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rota", default="127.0.0.1:50051", help="rota's address (host:port)")
    parser.add_argument("--service", default="hello")
    parser.add_argument("--id", default="", help="instance id (default host:port)")
    parser.add_argument("--version", default="", help="serve requests that carry this version")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    http = HelloServer(("127.0.0.1", 0), Hello)
    port = http.server_address[1]
    instance_id = http.instance_id = args.id or f"127.0.0.1:{port}"

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, so it cannot run on the serving thread.
        threading.Thread(target=http.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    instance = Instance(args.service, "127.0.0.1", port, id=args.id, version=args.version)
    with RotaClient(args.rota) as rota, rota.register(instance) as registration:
        print(
            f"registered {instance_id} as {args.service} at http://127.0.0.1:{port}/ (lease {registration.lease_id})",
            flush=True,
        )
        http.serve_forever()
    http.server_close()
    print(f"withdrew {instance_id}", flush=True)


if __name__ == "__main__":
    main()
