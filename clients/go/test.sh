#!/usr/bin/env bash
# Checks the Go client: formatting, go vet, staticcheck, then every test (unit tests, the shared
# conformance scenarios and the integration tests) with the race detector, against live
# `rota serve` processes that the tests start themselves. The server binary is $ROTA_BIN,
# or, when that is unset, built with cargo in the repository root.
set -euo pipefail

# The suite runs several `rota serve` at once; their admin listeners would all want the default
# 127.0.0.1:9090, so it is off unless the caller asks for it.
export ROTA_ADMIN_LISTEN="${ROTA_ADMIN_LISTEN:-off}"
cd "$(dirname "${BASH_SOURCE[0]}")"

go version
go mod download
# The xDS conformance runner is a module of its own (xds/, grpc-go's xDS client); gofmt below
# covers it, go vet and staticcheck are run in it too.
(cd xds && go mod download)

unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi

go vet ./...
(cd xds && go vet ./...)
# staticcheck, pinned, built from the Go module proxy (go.mod is not touched).
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
(cd xds && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...)

# The tests read the server binary from ROTA_BIN; build it here when unset, so that a cold
# cargo build does not count against go test's timeout.
if [[ -z "${ROTA_BIN:-}" ]]; then
  root="$(cd ../.. && pwd)"
  (cd "$root" && cargo build --bin rota)
  export ROTA_BIN="$root/target/debug/rota"
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
go test ./... -count=1 -race -v -timeout 8m 2>&1 | tee "$log" || status=$?
# The xDS scenarios (../conformance/xds) with grpc-go's standard xDS client, rota as its
# control plane; each scenario's consumer is a child process of the test binary. Without the
# race detector: its build of the xDS client and the child processes would double the stage.
(cd xds && go test ./... -count=1 -v -timeout 4m) 2>&1 | tee -a "$log" || status=$?
passed="$(grep -c -- '--- PASS' "$log" || true)"
failed="$(grep -c -- '--- FAIL' "$log" || true)"
echo "go: $passed passed, $failed failed"
# go test passes a package without tests, and a run whose tests all vanished: fail both.
if [[ "$status" -eq 0 && "$passed" -eq 0 ]]; then
  echo "go: no test ran" >&2
  exit 1
fi
exit "$status"
