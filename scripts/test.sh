#!/usr/bin/env bash
# Runs every test of the repository: the Rust crate (unit, property and integration tests
# against a live server) and each client's suite against a live `rota serve` built here.
#
#   ./scripts/test.sh            everything
#   ./scripts/test.sh rust       only the Rust crate
#   ./scripts/test.sh browser    only the dashboard in headless Chromium
#   ./scripts/test.sh soak       only the short soak and fault scenarios (rota soak --short)
#   ./scripts/test.sh fuzz       only a short run of every fuzz target
#   ./scripts/test.sh deploy     only the Helm chart, the systemd unit and the container image
#   ./scripts/test.sh python go  only those clients (after building the server)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

clients=()
run_rust=1
run_browser=1
run_soak=1
run_fuzz=1
run_deploy=1
if [ "$#" -gt 0 ]; then
  run_rust=0
  run_browser=0
  run_soak=0
  run_fuzz=0
  run_deploy=0
  for arg in "$@"; do
    case "$arg" in
      rust) run_rust=1 ;;
      browser) run_browser=1 ;;
      soak) run_soak=1 ;;
      fuzz) run_fuzz=1 ;;
      deploy) run_deploy=1 ;;
      *) clients+=("$arg") ;;
    esac
  done
else
  # Every client folder is run; one without an executable test.sh is an error, not a skip
  # (conformance holds the shared scenarios, not a client).
  for dir in clients/*/; do
    client="$(basename "$dir")"
    [ "$client" = conformance ] && continue
    if [ ! -x "$dir/test.sh" ]; then
      echo "clients/$client has no executable test.sh" >&2
      exit 1
    fi
    clients+=("$client")
  done
fi

declare -A took
step() {
  local name="$1"; shift
  local start=$SECONDS
  echo "==> $name"
  "$@"
  took[$name]=$((SECONDS - start))
}

# The Rust tests, failing a run in which a test target passed fewer tests than its floor (each
# floor is the count the target passes today: a test that goes must be taken out here too; a
# filter, a lost `mod`, or a target that stopped running must not pass by running less), or a
# target with no floor appeared (give it one here).
rust_test_floors=(
  "unittests src/lib.rs=376"
  "unittests src/main.rs=0"
  "tests/alloc.rs=1"
  "tests/it/main.rs=170"
  "doc-tests rota=1"
)
rust_tests() {
  local log status=0
  log="$(mktemp)"
  cargo test --locked 2>&1 | tee "$log" || status=$?
  if [ "$status" -ne 0 ]; then
    rm -f "$log"
    return "$status"
  fi
  # "target=passed" for each target, in the order cargo ran them.
  local -a ran
  mapfile -t ran < <(awk '
    /^ *Running / { sub(/^ *Running /, ""); sub(/ \(.*$/, ""); target = $0 }
    /^ *Doc-tests / { sub(/^ *Doc-tests /, ""); target = "doc-tests " $0 }
    /^test result: ok\. [0-9]+ passed/ { print target "=" $4 }
  ' "$log")
  rm -f "$log"
  local entry target floor passed found failed=0
  for entry in "${rust_test_floors[@]}"; do
    target="${entry%=*}"
    floor="${entry##*=}"
    found=0
    for line in "${ran[@]}"; do
      if [ "${line%=*}" = "$target" ]; then
        found=1
        passed="${line##*=}"
        if [ "$passed" -lt "$floor" ]; then
          echo "scripts/test.sh: $target passed $passed tests, fewer than its floor of $floor" >&2
          failed=1
        fi
      fi
    done
    if [ "$found" -eq 0 ]; then
      echo "scripts/test.sh: test target $target did not run" >&2
      failed=1
    fi
  done
  for line in "${ran[@]}"; do
    target="${line%=*}"
    if ! printf '%s\n' "${rust_test_floors[@]%=*}" | grep -qxF -- "$target"; then
      echo "scripts/test.sh: test target $target has no floor in rust_test_floors" >&2
      failed=1
    fi
  done
  [ "$failed" -eq 0 ] || return 1
  printf '    %s\n' "${ran[@]}"
}

step build cargo build --locked --bin rota
export ROTA_BIN="$root/target/debug/rota"
# The Rust and the Python suites both run replicas on a real Redis.
step redis-install scripts/install-redis.sh

if [ "$run_rust" = 1 ]; then
  # The source tests follow real registries: dnsmasq for DNS names, a Eureka server with
  # Spring Boot apps (tests/sources/eureka, built once with Maven), and etcd with a Go program
  # that registers endpoints as grpc-go and go-zero do (tests/sources/etcd).
  step dnsmasq-install scripts/install-dnsmasq.sh
  step eureka-build scripts/build-eureka.sh
  step etcd-install scripts/install-etcd.sh
  # promtool checks a live /metrics page and the alert rules in deploy/prometheus.
  step promtool-install scripts/install-promtool.sh
  step etcd-endpoints-lint bash -c 'cd tests/sources/etcd && test -z "$(gofmt -l .)" && go vet ./...'
  step etcd-endpoints-build scripts/build-etcd-endpoints.sh
  step rust-lint bash -c 'cargo fmt --check && cargo clippy --locked --all-targets -- -D warnings && RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps'
  step rust rust_tests
fi
for client in "${clients[@]}"; do
  step "$client" "clients/$client/test.sh"
done
if [ "$run_deploy" = 1 ]; then
  # deploy/test: the chart (helm lint, API schemas, its rota.toml read by rota), the systemd
  # unit (systemd-analyze), and the image built and run with podman on loopback.
  step deploy-install bash -c 'scripts/install-podman.sh && scripts/install-systemd.sh && scripts/install-helm.sh && scripts/install-kubernetes-validate.sh'
  step deploy-chart deploy/test/helm.sh
  step deploy-systemd deploy/test/systemd.sh
  step deploy-image deploy/test/image.sh
fi
if [ "$run_browser" = 1 ]; then
  step browser tests/browser/test.sh
fi
if [ "$run_soak" = 1 ]; then
  step soak "$ROTA_BIN" soak --short
fi
if [ "$run_fuzz" = 1 ]; then
  step fuzz scripts/fuzz.sh 20
fi

echo "==> all suites passed"
for name in "${!took[@]}"; do printf '    %-12s %4ss\n' "$name" "${took[$name]}"; done
