#!/usr/bin/env bash
# The dashboard in a real browser: installs Debian's chromium (once) and playwright-core, then
# runs dashboard.test.mjs against a live `rota serve` from $ROTA_BIN (built here when unset).
# The screenshot lands in test-output/dashboard.png at the repository root.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
repo_root="$(cd ../.. && pwd)"

./setup.sh

if [[ -z "${ROTA_BIN:-}" ]]; then
  (cd "$repo_root" && cargo build --locked --bin rota)
  export ROTA_BIN="$repo_root/target/debug/rota"
fi
export ROTA_TEST_OUTPUT="$repo_root/test-output"

npm ci --no-audit --no-fund
npm test
