#!/usr/bin/env bash
# Builds the rota Java client (generating the gRPC stubs from proto/rota/v1/rota.proto), the
# Spring Cloud module and the examples, runs every test against live rota servers and installs
# the artifacts into the local Maven repository; then runs README.md's quick start in a fresh
# Maven project that depends on the installed client (scripts/quickstart.sh). The xDS scenarios
# (clients/conformance/xds/*.json, grpc-java's own xDS client against rota's ADS) run in the
# module rota-xds-conformance, which installs nothing.
#
# The server binary is ROTA_BIN (an absolute path); without it, `cargo build --bin rota` runs in
# the repository root and target/debug/rota is used.
set -euo pipefail

# The suite runs several `rota serve` at once; their admin listeners would all want the default
# 127.0.0.1:9090, so it is off unless the caller asks for it.
export ROTA_ADMIN_LISTEN="${ROTA_ADMIN_LISTEN:-off}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

command -v mvn >/dev/null || { echo "test.sh: mvn (Maven 3.8+) is required" >&2; exit 1; }
command -v java >/dev/null || { echo "test.sh: java (17+) is required" >&2; exit 1; }

if [[ -z "${ROTA_BIN:-}" ]]; then
  (cd ../.. && cargo build --bin rota)
  export ROTA_BIN="$(cd ../.. && pwd)/target/debug/rota"
fi
args=(-B -q -ntp -Dstyle.color=never "-Drota.bin=${ROTA_BIN}")

status=0
mvn "${args[@]}" clean install || status=$?

# Maven is quiet on success: sum the Surefire reports into one closing line. Each module with
# tests must have run some: one module losing all its tests must not hide behind the other's.
count() { sed -nE "s/.* $1=\"([0-9]+)\".*/\1/p" <<<"$suite"; }
tests=0 failed=0 skipped=0 empty=()
for module in rota-client rota-spring-cloud rota-xds-conformance; do
  ran=0
  for report in "$module"/target/surefire-reports/TEST-*.xml; do
    [[ -e "$report" ]] || continue
    suite="$(grep -o '<testsuite [^>]*>' "$report" | head -n 1)"
    ran=$((ran + $(count tests)))
    failed=$((failed + $(count failures) + $(count errors)))
    skipped=$((skipped + $(count skipped)))
  done
  tests=$((tests + ran))
  [[ $ran -gt 0 ]] || empty+=("$module")
done
echo
echo "java: $((tests - failed - skipped)) passed, ${failed} failed, ${skipped} skipped"

if [[ $status -ne 0 ]]; then
  echo "test.sh: mvn install failed (exit $status); reports in $here/*/target/surefire-reports" >&2
  exit "$status"
fi
if [[ ${#empty[@]} -gt 0 ]]; then
  echo "test.sh: no test ran in ${empty[*]}" >&2
  exit 1
fi

scripts/quickstart.sh
