#!/usr/bin/env bash
# Checks deploy/systemd/rota.service: `systemd-analyze verify` must print nothing (it reports
# unknown or malformed directives but still exits 0, so any output fails the check), and
# `systemd-analyze security --offline` must rate its exposure at most 1.5, and the hardening
# the unit promises must be there as written (a user of its own, a read-only system). ExecStart
# names /usr/local/bin/rota, which verify requires to exist: the checked copy names the rota
# built here instead, and is otherwise the same file.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rota="${ROTA_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/rota}"
[ -x "$rota" ] || { echo "deploy/test/systemd.sh: no rota binary at $rota" >&2; exit 1; }
command -v systemd-analyze >/dev/null || "$root/scripts/install-systemd.sh"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unit="$work/rota.service"
sed "s|^ExecStart=/usr/local/bin/rota |ExecStart=$rota |" "$root/deploy/systemd/rota.service" >"$unit"
grep -q "^ExecStart=$rota serve" "$unit" || { echo "deploy/test/systemd.sh: no ExecStart=/usr/local/bin/rota serve in the unit" >&2; exit 1; }

report="$(systemd-analyze verify "$unit" 2>&1)" || { echo "$report" >&2; exit 1; }
if [ -n "$report" ]; then
  echo "deploy/test/systemd.sh: systemd-analyze verify reported:" >&2
  echo "$report" >&2
  exit 1
fi
for directive in DynamicUser=yes ProtectSystem=strict ProtectHome=yes NoNewPrivileges=yes \
  PrivateTmp=yes PrivateDevices=yes CapabilityBoundingSet= RestartPreventExitStatus=64; do
  grep -qx -- "$directive" "$unit" || { echo "deploy/test/systemd.sh: the unit lacks $directive" >&2; exit 1; }
done
# --threshold counts in tenths: 15 is an exposure of 1.5.
if ! systemd-analyze security --offline=yes --threshold=15 "$unit" >"$work/security.txt" 2>&1; then
  cat "$work/security.txt" >&2
  echo "deploy/test/systemd.sh: exposure above 1.5" >&2
  exit 1
fi
tail -n 1 "$work/security.txt"
