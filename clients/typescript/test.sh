#!/usr/bin/env bash
# Installs the dependencies, generates the gRPC types, builds and runs the whole test suite
# (unit tests, the shared conformance scenarios and the integration tests against live servers).
set -euo pipefail

# The suite runs several `rota serve` at once; their admin listeners would all want the default
# 127.0.0.1:9090, so it is off unless the caller asks for it.
export ROTA_ADMIN_LISTEN="${ROTA_ADMIN_LISTEN:-off}"

cd "$(dirname "${BASH_SOURCE[0]}")"
repo_root="$(cd ../.. && pwd)"

# The harness starts `rota serve` from $ROTA_BIN; build it once here when it is not given.
if [[ -z "${ROTA_BIN:-}" ]]; then
  (cd "$repo_root" && cargo build --bin rota)
  export ROTA_BIN="$repo_root/target/debug/rota"
fi

npm ci --no-audit --no-fund
npm run build
npm test
