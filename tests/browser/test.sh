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

# A run in which no test ran (a renamed file, a suite that registered no test) fails. node --test
# summarises as "ℹ tests N" (spec reporter) or "# tests N" (TAP, its default off a terminal).
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
npm test 2>&1 | tee "$log" || status=$?
[[ $status -eq 0 ]] || exit "$status"
ran="$(sed -nE 's/^(ℹ|#) tests ([0-9]+)$/\2/p' "$log" | tail -n 1)"
if [[ -z "$ran" || "$ran" -eq 0 ]]; then
  echo "tests/browser/test.sh: no test ran" >&2
  exit 1
fi
