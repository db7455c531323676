"""Starts and stops ``rota serve`` processes for the tests."""

from __future__ import annotations

import atexit
import os
import re
import selectors
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

CLIENT_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = CLIENT_ROOT.parent.parent
SCENARIOS = REPO_ROOT / "clients" / "conformance" / "scenarios"

#: Bounds for the external processes the tests wait on.
CARGO_BUILD_TIMEOUT = 900.0
START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0

_LISTENING = re.compile(r"^listening on (127\.0\.0\.1:(\d+))$")
_ADMIN = re.compile(r"^admin on (127\.0\.0\.1:\d+)$")

# Fixtures stop their servers, also when tests fail; this catches any exit that skips them.
_running: list[RotaServer] = []


@atexit.register
def _kill_running() -> None:
    for server in list(_running):
        server.kill()


def rota_binary() -> Path:
    """``$ROTA_BIN``, or ``target/debug/rota`` after ``cargo build --bin rota`` in the repository."""
    configured = os.environ.get("ROTA_BIN")
    if configured:
        path = Path(configured)
        if not path.is_absolute() or not path.is_file():
            raise RuntimeError(f"ROTA_BIN must be the absolute path of the rota binary, got {configured!r}")
        return path
    subprocess.run(
        ["cargo", "build", "--bin", "rota"],
        cwd=REPO_ROOT,
        check=True,
        timeout=CARGO_BUILD_TIMEOUT,
    )
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))
    if not target_dir.is_absolute():
        target_dir = REPO_ROOT / target_dir
    return target_dir / "debug" / "rota"


class RotaServer:
    """One ``rota serve --listen LISTEN`` process; the port comes from its first stdout line.

    ``listen`` is ``127.0.0.1:0`` (a free port) unless a test restarts a server on the
    address of an earlier one. With ``--admin-listen ADDR`` (not ``off``) among the extra
    arguments, the admin listener's address comes from the second line (``admin on ADDR``, written
    with the first) as :attr:`admin_address`.
    """

    def __init__(self, binary: Path, log_path: Path, *extra_args: str, listen: str = "127.0.0.1:0") -> None:
        self.binary = binary
        self.log_path = log_path
        self.extra_args = extra_args
        self.listen = listen
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.port = 0
        #: The admin listener's host:port; empty while it is off.
        self.admin_address = ""

    def start(self, timeout: float = START_TIMEOUT) -> RotaServer:
        log = self.log_path.open("w")
        # No start-up warm-up unless a test asks for one (--warmup in extra_args wins): these
        # servers start empty, and a service never registered is NOT_FOUND at once. Set in the
        # environment, which a server without the setting ignores.
        env = {**os.environ, "ROTA_WARMUP": os.environ.get("ROTA_WARMUP", "0s")}
        self.process = subprocess.Popen(
            [str(self.binary), "serve", "--listen", self.listen, *self.extra_args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        log.close()
        _running.append(self)
        try:
            line = self._first_line(timeout)
            match = _LISTENING.match(line.strip())
            if match is None:
                raise RuntimeError(f"rota's first line was {line!r}, not 'listening on 127.0.0.1:PORT'")
        except BaseException:
            self.stop()
            raise
        self.address = match.group(1)
        self.port = int(match.group(2))
        if self._admin_on():
            line = self.process.stdout.readline() if self.process.stdout is not None else ""
            admin = _ADMIN.match(line.strip())
            if admin is None:
                self.stop()
                raise RuntimeError(f"rota's second line was {line!r}, not 'admin on 127.0.0.1:PORT'")
            self.admin_address = admin.group(1)
        assert self.process.stdout is not None
        threading.Thread(target=self.process.stdout.read, name="rota-stdout", daemon=True).start()
        return self

    def _admin_on(self) -> bool:
        args = list(self.extra_args)
        for i, arg in enumerate(args):
            if arg == "--admin-listen" and i + 1 < len(args):
                return args[i + 1] != "off"
            if arg.startswith("--admin-listen="):
                return arg.removeprefix("--admin-listen=") != "off"
        return False

    def _first_line(self, timeout: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise RuntimeError(f"rota printed nothing within {timeout}s; log:\n{self.log()}")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(
                f"rota exited with {self.process.wait(STOP_TIMEOUT)} before listening; log:\n{self.log()}"
            )
        return line

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """Kills the server at once, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)
        self._forget()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self._forget()

    def _forget(self) -> None:
        if self in _running:
            _running.remove(self)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Polls ``condition`` until it holds or ``timeout`` seconds pass (for external processes)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
