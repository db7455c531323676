"""Generates rota's protobuf and gRPC stubs into ``src/rota/_pb``.

The stubs come from the repository's ``proto/rota/v1/rota.proto`` and are committed, so that
the package builds and installs without the proto or ``grpcio-tools``; run this after changing
the proto (``tests/test_stubs.py`` fails until the committed stubs match it). ``protoc`` names the
generated modules after the proto's path (``rota/v1/rota_pb2.py``) and imports them as
``from rota.v1 import rota_pb2``, which would collide with this package; they are therefore
generated into a scratch directory and placed in ``rota._pb`` with that one import rewritten.

Usage: ``python scripts/generate_stubs.py [--proto-root DIR]`` (needs ``grpcio-tools``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

CLIENT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROTO_ROOT = CLIENT_ROOT.parent.parent / "proto"
PROTO_FILE = "rota/v1/rota.proto"
TARGET = CLIENT_ROOT / "src" / "rota" / "_pb"
GENERATED = ("rota_pb2.py", "rota_pb2.pyi", "rota_pb2_grpc.py")


def generate(proto_root: Path, target: Path = TARGET) -> list[Path]:
    from grpc_tools import protoc  # imported late: only this script needs grpcio-tools

    proto = proto_root / PROTO_FILE
    if not proto.is_file():
        raise SystemExit(f"generate_stubs: {proto} not found")
    with tempfile.TemporaryDirectory(prefix="rota-stubs-") as scratch:
        include = Path(protoc.__file__).resolve().parent / "_proto"
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"-I{include}",
                f"--python_out={scratch}",
                f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}",
                str(proto),
            ]
        )
        if status != 0:
            raise SystemExit(f"generate_stubs: protoc failed with status {status}")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        written = []
        for name in GENERATED:
            text = (Path(scratch) / "rota" / "v1" / name).read_text()
            text = re.sub(r"^from rota\.v1 import ", "from rota._pb import ", text, flags=re.MULTILINE)
            (target / name).write_text(text)
            written.append(target / name)
    init = target / "__init__.py"
    init.write_text(f'"""Stubs generated from {PROTO_FILE} by scripts/generate_stubs.py; do not edit."""\n')
    written.append(init)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--proto-root", type=Path, default=DEFAULT_PROTO_ROOT, help="include path holding rota/v1/rota.proto"
    )
    args = parser.parse_args(argv)
    for path in generate(args.proto_root.resolve()):
        print(f"generated {path.relative_to(CLIENT_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
