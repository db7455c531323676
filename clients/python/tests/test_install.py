"""The package as a user installs it: README.md's Install section, run in fresh virtual
environments under the system temp folder, then README.md's quick start run there against a
live server (its own, so the quick start's ticket is the first of a fresh rotation)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from rota_harness import CLIENT_ROOT, RotaServer

README = CLIENT_ROOT / "README.md"
README_TARGET = "127.0.0.1:50051"
README_CHECKOUT = "/path/to/rota/clients/python"
#: Bounds for pip, venv and build (downloads from PyPI on a cold cache) and for the quick start.
INSTALL_TIMEOUT = 240.0
RUN_TIMEOUT = 30.0

pytestmark = pytest.mark.timeout(600)


def readme_block(heading: str, lang: str) -> str:
    """The body of the first ```lang block after ``heading`` in README.md."""
    text = README.read_text()
    _, found, section = text.partition(f"\n{heading}\n")
    assert found, f"README.md has no {heading!r} heading"
    match = re.search(rf"^```{lang}\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match is not None, f"README.md has no ```{lang} block under {heading!r}"
    return match.group(1)


def isolated_env() -> dict[str, str]:
    """The environment without anything that would make the repository's sources importable."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # No .pyc compilation of what pip installs (also into build environments): a third of the time.
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_NO_COMPILE="1")
    return env


def run(command: list[str], cwd: Path, timeout: float = INSTALL_TIMEOUT) -> str:
    done = subprocess.run(command, cwd=cwd, env=isolated_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def fresh_venv(where: Path) -> Path:
    """A new, empty virtual environment; returns its python."""
    # Without a pip of its own (installing one is most of the time `venv` takes): `pip` below
    # is this environment's, run on the new interpreter with `--python`.
    run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    return where / "bin" / "python"


def pip(python: Path, *args: str) -> list[str]:
    """``python -m pip ARGS`` for a fresh environment's ``python``."""
    return [sys.executable, "-m", "pip", "--python", str(python), *args]


CHANNEL_CHECK = """\
import sys

import rota
import rota.aio
from rota._pb import rota_pb2, rota_pb2_grpc

address = sys.argv[1]
host, port = address.rsplit(":", 1)
with rota.RotaClient(address) as client:
    client.register(rota.Instance(service="channel-check", host=host, port=int(port)))
    with rota.channel(f"rota://{address}/channel-check") as channel:
        listing = rota_pb2_grpc.RegistryStub(channel).ListServices(rota_pb2.ListServicesRequest(), timeout=30)
print("channel-check" in [s.name for s in listing.services], callable(rota.aio.channel))
"""


def run_quick_start(python: Path, workdir: Path, server: RotaServer) -> None:
    quick_start = readme_block("## Quick start", "python")
    assert f'"{README_TARGET}"' in quick_start, f"the quick start does not connect to {README_TARGET}"
    script = workdir / "quickstart.py"
    script.write_text(quick_start.replace(README_TARGET, server.address))
    try:
        # The installed package, not the sources of this checkout.
        location = run([str(python), "-c", "import rota; print(rota.__file__)"], cwd=workdir).strip()
        assert Path(location).is_relative_to(python.parent.parent), location
        assert run([str(python), str(script)], cwd=workdir, timeout=RUN_TIMEOUT) == "127.0.0.1:8080 0\n"
        # The installed channel: rota:///channel-check, whose one instance is rota itself, so one
        # call through it (ListServices) shows the resolver and the routing work from the install.
        check = workdir / "channel_check.py"
        check.write_text(CHANNEL_CHECK)
        assert run([str(python), str(check), server.address], cwd=workdir, timeout=RUN_TIMEOUT) == "True True\n"
    finally:
        server.kill()  # nothing to drain


@pytest.fixture
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Under the system temp folder, outside the repository.
    path = tmp_path_factory.mktemp("install")
    assert not path.is_relative_to(CLIENT_ROOT.parent.parent)
    return path


def test_readme_install_from_the_checkout(workdir: Path, private_server: Callable[..., RotaServer]) -> None:
    commands = [line for line in readme_block("## Install", "sh").splitlines() if line.strip()]
    assert commands == [f"python -m pip install {README_CHECKOUT}"], commands
    python = fresh_venv(workdir / "venv")
    argv = shlex.split(commands[0].replace(README_CHECKOUT, str(CLIENT_ROOT)))
    assert argv[:4] == ["python", "-m", "pip", "install"], argv
    run(pip(python, *argv[3:]), cwd=workdir)
    run_quick_start(python, workdir, private_server())


def test_built_wheel_installs_and_picks(workdir: Path, private_server: Callable[..., RotaServer]) -> None:
    # `python -m build` makes the sdist, then the wheel from that sdist: both must be complete. (Not
    # beside the other install: both write the egg-info of the source folder.)
    dist = workdir / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(CLIENT_ROOT)], cwd=workdir)
    wheels = sorted(dist.glob("rota_client-*.whl"))
    assert len(wheels) == 1 and len(sorted(dist.glob("rota_client-*.tar.gz"))) == 1, sorted(dist.iterdir())
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    for name in ("rota/py.typed", "rota/_pb/rota_pb2.py", "rota/_pb/rota_pb2.pyi", "rota/_pb/rota_pb2_grpc.py"):
        assert name in names, f"the wheel lacks {name}"

    python = fresh_venv(workdir / "venv")
    run(pip(python, "install", str(wheels[0])), cwd=workdir)
    run_quick_start(python, workdir, private_server())
