#!/usr/bin/env bash
# Runs the Python client's whole test suite: the linters (ruff check, ruff format --check, mypy
# --strict on the package and the tests), then unit tests, the conformance scenarios (sync and asyncio
# clients), the clients and channels against a rota with tokens over plaintext, TLS and mTLS
# (tests/test_rota_auth.py), the xDS scenarios (tests/test_xds_conformance.py: grpcio's own xDS client on
# `xds:///echo`, rota as its control plane) and the integration tests against live `rota serve`
# processes.
#
# Creates .venv here, installs the package in editable mode with its test and lint extras from
# PyPI (pinned in pyproject.toml), runs the linters, then pytest (extra arguments are passed on). The protobuf/gRPC stubs in src/rota/_pb are
# committed; tests/test_stubs.py fails when they differ from what proto/rota/v1/rota.proto
# generates, and tests/test_install.py installs the package into fresh virtual environments
# outside the repository. The tests use $ROTA_BIN when set, else they run
# `cargo build --bin rota` in the repository root.
set -euo pipefail

# The suite runs several `rota serve` at once; their admin listeners would all want the default
# 127.0.0.1:9090, so it is off unless the caller asks for it.
export ROTA_ADMIN_LISTEN="${ROTA_ADMIN_LISTEN:-off}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# The TLS and mTLS tests make their certificates with openssl (scripts/make-test-certs.sh).
../../scripts/install-openssl.sh

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
.venv/bin/python -m pip install --quiet --editable ".[test,lint]"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# A full run (no arguments) must collect at least this many tests; pytest itself fails a run
# that collects none (exit status 5), and `exec` passes its status on unchanged.
if [[ $# -eq 0 ]]; then
    export ROTA_PY_MIN_TESTS=335
fi
exec .venv/bin/python -m pytest "$@"
