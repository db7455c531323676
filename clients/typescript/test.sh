#!/usr/bin/env bash
# Installs the dependencies, generates the gRPC types, lints (ESLint with typescript-eslint's
# type-checked rules, eslint.config.mjs), builds and runs the whole test suite (unit tests, the
# shared conformance scenarios, the channel scenarios, the client and the channel against a rota
# with tokens over plaintext, TLS and mTLS (test/auth.test.ts), the xDS scenarios with @grpc/grpc-js-xds
# (test/xds.test.ts, a consumer process per scenario), the integration tests against live servers
# and the install of the packed package into a fresh project).
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

# The TLS and mTLS tests (test/auth.test.ts) make their certificates with openssl
# (scripts/make-test-certs.sh).
../../scripts/install-openssl.sh

# --ignore-scripts: no `prepare` build here. The suite's own build is `npm test`'s pretest
# (sources and tests into build/); the package build (dist/) runs once, in the `npm pack` of
# test/install.test.ts, which installs the tarball into a fresh project outside the repository.
npm ci --ignore-scripts --no-audit --no-fund

# The type-checked lint rules read the generated gRPC types, so they are generated first (pretest
# generates them again, which changes nothing). A lint error fails the run before any test.
npm run generate
npm run lint

# pretest empties build/ first, so compiled copies of deleted tests cannot run. A run in which
# no test ran (a glob that matched nothing, a suite that registered no test) fails.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
npm test 2>&1 | tee "$log" || status=$?
[[ $status -eq 0 ]] || exit "$status"
ran="$(sed -nE 's/^ℹ tests ([0-9]+)$/\1/p' "$log" | tail -n 1)"
if [[ -z "$ran" || "$ran" -eq 0 ]]; then
  echo "test.sh: no test ran" >&2
  exit 1
fi
