"""The committed stubs in ``rota._pb`` are what ``proto/rota/v1/rota.proto`` generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from rota_harness import CLIENT_ROOT, REPO_ROOT

COMMITTED = CLIENT_ROOT / "src" / "rota" / "_pb"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_stubs", CLIENT_ROOT / "scripts" / "generate_stubs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    generator = load_generator()
    fresh = tmp_path / "_pb"
    written = generator.generate(REPO_ROOT / "proto", target=fresh)
    names = sorted(path.name for path in written)
    assert names == sorted(path.name for path in COMMITTED.iterdir() if path.is_file()), (
        "src/rota/_pb holds other files than the generator writes"
    )
    stale = [name for name in names if (fresh / name).read_bytes() != (COMMITTED / name).read_bytes()]
    assert not stale, (
        f"src/rota/_pb is stale ({', '.join(stale)}): run `python scripts/generate_stubs.py` in clients/python"
    )
