#!/usr/bin/env bash
# Builds the container image (scripts/image.sh) and runs it with podman on this host's loopback:
#   1. without tokens it refuses to start (exit 64, naming the unset variable);
#   2. with tokens and --network host on 127.0.0.1 (ports chosen by rota, read from its first
#      lines), /readyz answers, and the host's `rota register` and `rota pick` reach it;
#   3. `podman stop` (SIGTERM) drains it: the registration is sent away, the log says
#      "draining", and the container exits 0.
# Prints the image size and the time from `podman run` to a ready /readyz.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CONTAINERS_CONF="$root/deploy/test/containers.conf"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
rota="$target_dir/release/rota"

fail() { echo "deploy/test/image.sh: $*" >&2; exit 1; }

# first_lines COUNT PATTERN COMMAND...: prints the first COUNT lines of COMMAND's output that
# match PATTERN, as soon as they are written (at most 30 s), then stops COMMAND.
first_lines() {
  local count="$1" pattern="$2" fd pid status=0
  shift 2
  exec {fd}< <(exec timeout 30 "$@" 2>&1)
  pid=$!
  grep -m "$count" -E "$pattern" <&"$fd" || status=$?
  kill "$pid" 2>/dev/null || true
  exec {fd}<&-
  return "$status"
}

image="$(scripts/image.sh)"
size="$(podman image inspect --format '{{.Size}}' "$image")"

name="rota-image-test-$$"
work="$(mktemp -d)"
register_pid=""
cleanup() {
  if [ -n "$register_pid" ]; then kill "$register_pid" 2>/dev/null || true; fi
  podman rm --force --time 0 "$name" "$name-refused" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The image's own config listens on 0.0.0.0 and takes its tokens from the environment.
status=0
timeout 60 podman run --rm --name "$name-refused" --network host \
  -e ROTA_LISTEN=127.0.0.1:0 -e ROTA_ADMIN_LISTEN=127.0.0.1:0 "$image" >"$work/refused.log" 2>&1 || status=$?
[ "$status" -eq 64 ] || fail "without tokens: exit status $status, expected 64: $(cat "$work/refused.log")"
grep -q 'ROTA_ADMIN_TOKEN is not set' "$work/refused.log" \
  || fail "without tokens: no word of ROTA_ADMIN_TOKEN: $(cat "$work/refused.log")"

# 2. Start, wait for its addresses, then readiness.
admin_token="admin-token-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
pick_token="pick-token-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
register_token="register-token-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
start_ns="$(date +%s%N)"
podman run --detach --name "$name" --network host \
  -e ROTA_LISTEN=127.0.0.1:0 -e ROTA_ADMIN_LISTEN=127.0.0.1:0 -e ROTA_SHUTDOWN_GRACE=1s \
  -e ROTA_ADMIN_TOKEN="$admin_token" -e ROTA_PICK_TOKEN="$pick_token" \
  -e ROTA_REGISTER_TOKEN="$register_token" "$image" >/dev/null
# `podman logs --follow` ends when the container does; the first two lines are the addresses.
addresses="$(first_lines 2 '^(listening|admin) on ' podman logs --follow "$name" || true)"
grpc="$(sed -n 's/^listening on //p' <<<"$addresses")"
admin="$(sed -n 's/^admin on //p' <<<"$addresses")"
[ -n "$grpc" ] && [ -n "$admin" ] || fail "no addresses from the container: $(podman logs "$name" 2>&1)"
ready="$(curl --silent --show-error --max-time 5 "http://$admin/readyz")"
ready_ns="$(date +%s%N)"
[ "$ready" = ready ] || fail "/readyz answered '$ready'"
user="$(podman exec "$name" id -u)"
[ "$user" = 10001 ] || fail "rota runs as uid $user, expected 10001"

# Register through the container, then pick from the host.
"$rota" register orders 127.0.0.1:7001 --id orders-1 --server "http://$grpc" --token "$register_token" \
  >"$work/register.log" 2>&1 &
register_pid=$!
first_lines 1 '^registered orders-1 in orders' tail --follow --lines=+1 "$work/register.log" >/dev/null \
  || fail "rota register: $(cat "$work/register.log")"
picked="$("$rota" pick orders --server "http://$grpc" --token "$pick_token")"
grep -q '127.0.0.1:7001' <<<"$picked" || fail "rota pick answered: $picked"
denied=0
"$rota" pick orders --server "http://$grpc" --token "$register_token" >"$work/denied.log" 2>&1 || denied=$?
[ "$denied" -ne 0 ] && grep -q PERMISSION_DENIED "$work/denied.log" \
  || fail "a register token could pick: $(cat "$work/denied.log")"

# 3. SIGTERM drains: the registration is told to go elsewhere, and rota exits 0 after its grace.
podman stop --time 20 "$name" >/dev/null
exit_code="$(podman inspect --format '{{.State.ExitCode}}' "$name")"
[ "$exit_code" = 0 ] || fail "exit status $exit_code after SIGTERM: $(podman logs "$name" 2>&1)"
podman logs "$name" 2>&1 | grep -q 'draining' || fail "no drain in the log: $(podman logs "$name" 2>&1)"
first_lines 1 '^registration lost' tail --follow --lines=+1 "$work/register.log" >/dev/null \
  || fail "the registration was not sent away: $(cat "$work/register.log")"

echo "image $image: $((size / 1000000)) MB; podman run to ready /readyz: $(((ready_ns - start_ns) / 1000000)) ms"
